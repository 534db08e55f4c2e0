"""Readiness of tessera-node when a host path it needs cannot be used: not ready for shares, the
reason names the path and the error (the node agent's bad-input rules, issue #11). The agent's
preparation runs in its own process with the fake NVML on the library path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild
from tests.node.conftest import machine_env

PREPARE = """
import json, sys
from pathlib import Path
from tessera.node.agent import AgentOptions, KubeAgent
from tessera.node.nvml import Nvml
paths = json.loads(sys.argv[1])
opts = AgentOptions(node_name="n", measure_headroom=False,
                    **{k: Path(v) for k, v in paths.items()})
with Nvml() as nvml:
    agent = KubeAgent(opts, client=None, nvml=nvml)
    agent.prepare()
    print(json.dumps({"ready": agent.ready, "reason": agent.reason}))
"""


def prepare(native: NativeBuild, tmp_path: Path, **paths: Path) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", PREPARE, json.dumps({k: str(v) for k, v in paths.items()})],
                       env=machine_env(native, tmp_path / "gpu.state"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("which", ["containers_dir", "loans_dir", "library_dir"])
def test_an_unusable_host_path_makes_the_node_not_ready(native: NativeBuild, tmp_path: Path,
                                                         which: str) -> None:
    good = {"containers_dir": tmp_path / "containers", "library_dir": tmp_path / "isolation",
            "loans_dir": tmp_path / "loans"}
    assert prepare(native, tmp_path, **good) == {"ready": True, "reason": ""}
    bad = Path("/dev/null") / "tessera"  # under a file: nothing can be made there, even by root
    got = prepare(native, tmp_path, **{**good, which: bad})
    assert got["ready"] is False and str(bad) in str(got["reason"]), got


MID_PREPARE = """
import json, sys
from pathlib import Path
import tessera.node.readiness as readiness
from tessera.node.agent import AgentOptions, KubeAgent
from tessera.node.nvml import Nvml
paths = json.loads(sys.argv[1])
opts = AgentOptions(node_name="n", measure_headroom=False,
                    **{k: Path(v) for k, v in paths.items()})
with Nvml() as nvml:
    agent = KubeAgent(opts, client=None, nvml=nvml)
    seen = []
    start_mig = readiness.start_mig
    def spy(node):
        seen.append(agent.plugin_config(Path(paths["containers_dir"])).not_ready)
        start_mig(node)
    readiness.start_mig = spy
    agent.prepare()
    print(json.dumps({"during": seen, "after": agent.ready}))
"""


def test_the_kubelet_plugin_says_not_ready_until_preparation_has_ended(
        native: NativeBuild, tmp_path: Path) -> None:
    """The inventory is read before the MIG journal: a claim the kubelet asked to prepare in
    between was refused "MIG partitions are not available" (an error, not a retry) after a
    restart; the plugin now answers "not ready" until preparation has run to its end."""
    paths = {"containers_dir": tmp_path / "containers", "library_dir": tmp_path / "isolation",
             "loans_dir": tmp_path / "loans"}
    r = subprocess.run([sys.executable, "-c", MID_PREPARE,
                        json.dumps({k: str(v) for k, v in paths.items()})],
                       env=machine_env(native, tmp_path / "gpu.state"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"during": ["starting"], "after": True}, got
