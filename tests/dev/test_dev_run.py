"""``./dev run`` as a user types it: installs and builds only what the main job needs (no Go
build), says nothing about setuptools, and runs the walkthrough to the end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tessera.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


def test_setup_hooks_say_which_commands_need_them() -> None:
    needed = {}
    for hook in sorted((ROOT / "scripts" / "setup.d").glob("*.sh")):
        lines = [ln for ln in hook.read_text().splitlines() if ln.startswith("# needed-by:")]
        needed[hook.name] = lines[0].split(":", 1)[1].split() if lines else ["test", "setup"]
    assert "run" in needed["10-native.sh"]
    assert "run" not in needed["30-kube-binaries.sh"]


@pytest.mark.slow
def test_a_fresh_clone_runs_dev_run_without_go_then_the_readme_quickstart(tmp_path: Path) -> None:
    """The README's order in a fresh clone of this commit: `./dev run` with an empty tessera
    cache and a `go` that fails and records its call (it must build and install only what the
    main job needs: no Go build, no word about setuptools, the walkthrough to its end), then
    the Quickstart block exactly as written, against the server `./dev run` left up (same port,
    data directory and config). Bounded: the packages are the test's own venv (TESSERA_VENV;
    ./dev finds them installed), the clone's source comes first on PYTHONPATH.

    (One `./dev run` for both checks: they were two tests, each paying a full `./dev run` and
    its walkthrough, about 25 s apiece on 2 cores; docs/testing.md.)"""
    import re

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    marker = tmp_path / "go-was-called"
    (fake_bin / "go").write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n")
    (fake_bin / "go").chmod(0o755)
    venv = Path(os.environ.get("TESSERA_VENV", ROOT / ".venv")).resolve()
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{venv / 'bin'}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "PYTHONPATH": str(clone / "src"),
        "TESSERA_VENV": str(venv),
        "TESSERA_CACHE": str(tmp_path / "cache"),  # an empty cache: Go binaries are not there
        "TESSERA_PORT": str(free_ports(1)[0]),
        "TESSERA_CONFIG": str(tmp_path / "config.json"),
        "TESSERA_DATA_DIR": str(tmp_path / "data"),
    }
    for var in ("TESSERA_URL", "TESSERA_TOKEN", "TESSERA_PROJECT"):
        env.pop(var, None)
    try:
        r = subprocess.run([str(clone / "dev"), "run"], env=env, capture_output=True, text=True,
                           timeout=300, cwd=clone)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert not marker.exists(), f"./dev run called go: {marker.read_text()}"
        assert "setuptools" not in r.stderr.lower()
        assert "demo-frac05 " in r.stdout
        assert "tessera is running at" in r.stdout
        block = re.search(r"^```bash runnable\n(.*?)^```", (clone / "README.md").read_text(),
                          re.MULTILINE | re.DOTALL)
        assert block is not None
        q = subprocess.run(["bash", "-euo", "pipefail", "-c", block.group(1)], env=env, cwd=clone,
                           capture_output=True, text=True, timeout=240)
        assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
        assert "frac05" in q.stdout and "already exists" not in q.stderr
    finally:
        subprocess.run([str(venv / "bin" / "tessera"), "down", "--stop-workloads"], env=env,
                       capture_output=True, timeout=120)
