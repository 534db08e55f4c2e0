"""tessera-node against the fake NVML and CUDA of native/fakedriver, in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tessera.isolation.build import NativeBuild, ensure_built
from tests.isolation.conftest import Probe

H100 = "NVIDIA H100 80GB HBM3=81559Mi"
H100_BYTES = 81559 * 2**20


@pytest.fixture(scope="session")
def native() -> NativeBuild:
    return ensure_built()


def machine_env(native: NativeBuild, state: Path | None, *, devices: str = H100,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """One simulated machine: the fake driver on the library path, the shared process state."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TESSERA_", "FAKE_", "CUDA_")) and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = str(native.fake_dir)
    env["FAKE_GPU_DEVICES"] = devices
    if state is not None:
        env["FAKE_GPU_STATE"] = str(state)
    env.update(extra or {})
    return env


def node_cli(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera.node", *args], env=dict(env),
                          capture_output=True, text=True, timeout=60)


def node_json(env: Mapping[str, str], *args: str) -> Any:
    r = node_cli(env, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def gpu_procs(native: NativeBuild) -> Iterator[list[Probe]]:
    """Real processes on the fake CUDA driver (cuprobe), stopped after the test."""
    started: list[Probe] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def start_proc(native: NativeBuild, procs: list[Probe], env: Mapping[str, str],
               device: int = 0) -> Probe:
    p = Probe(native, env)
    procs.append(p)
    return p.start(device)
