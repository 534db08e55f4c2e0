"""Helpers shared by the image tests and the Helm install test (their fixtures, the images built
and unpacked once per session, are in tests/kube/deploy/conftest.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tessera.testing import oci

ROOT = Path(__file__).resolve().parents[2]

# Every program the images hold, with something its --help must say.
ENTRY_POINTS = [
    ("tessera", ["tessera-scheduler", "--help"], "--min-runtime-seconds"),
    ("tessera", ["tessera-webhook", "--help"], "--cert"),
    ("tessera", ["python3", "-m", "tessera.kube.api_server", "--help"], "--data-dir"),
    ("tessera", ["tessera", "--help"], "submit"),
    ("tessera-node", ["tessera-node", "--help"], "run"),
    ("tessera-node", ["tessera-node", "run", "--help"], "--pod-resources-socket"),
]


def why_not() -> str | None:
    """None where images can be built and run here, else the reason (printed by the skip)."""
    why = oci.can_run()
    if why is None and shutil.which("mmdebstrap") is None:
        why = "mmdebstrap is missing (scripts/setup.d/40-image-tools.sh installs it)"
    return why


def skip_without_images(module: str) -> pytest.MarkDecorator:
    why = why_not()
    if why is not None:
        print(f"\n{module} skipped: {why}", file=sys.stderr)
    return pytest.mark.skipif(why is not None, reason=f"{module}: {why}")


def run_build(script: str, out: Path, *args: str) -> dict[str, Any]:
    """Run one of the image build scripts (scripts/SCRIPT) into ``out``; its last line (JSON)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args,
                           "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
