"""Driver-native per-cgroup memory limits (issue 27, item 5): the fake NVML has r615's
nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1 when FAKE_NVML_DRIVER_VERSION names
branch 615 or later, the fake CUDA enforces them per cgroup, and a share gets the same room on
the driver's path as on the preload library's (both charge the context and every allocation)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild
from tessera.isolation.config import LIMIT_ENV
from tests.isolation.conftest import GiB, Probe
from tests.node.conftest import machine_env

MiB = 2**20
CHUNK = 256 * MiB
CUDA_ERROR_OUT_OF_MEMORY = 2
OLD, NEW = "570.133.20", "615.42.01"
MEMCG = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh memory cgroup (root only; CI runs as root)."""
    assert os.geteuid() == 0, "the per-cgroup limit tests need root (cgroups, NVML's setter)"
    base = MEMCG if MEMCG.is_dir() else Path("/sys/fs/cgroup")
    path = base / f"tessera-memlimit-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)


def nvml(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    program = ("import pynvml, sys\nfrom pathlib import Path\nfrom tessera.node import memlimits\n"
               "pynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n" + code)
    return subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=60)


def in_cgroup(native: NativeBuild, env: dict[str, str], cgroup: Path | None) -> Probe:
    """cuprobe started inside ``cgroup`` (it joins before exec)."""
    probe = Probe(native, env)
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(probe.proc.pid))
    return probe


def room(probe: Probe) -> tuple[int, int]:
    """(chunks allocated before the first refusal, that refusal's rc)."""
    assert probe("init")["rc"] == 0
    assert probe("ctx 0")["rc"] == 0
    n = 0
    while True:
        r = probe(f"alloc {CHUNK}")
        if r["rc"] != 0:
            return n, r["rc"]
        n += 1


def test_old_driver_has_no_per_cgroup_limits(native: NativeBuild, tmp_path: Path,
                                             cgroup: Path) -> None:
    env = machine_env(native, tmp_path / "gpu.state", extra={"FAKE_NVML_DRIVER_VERSION": OLD})
    r = nvml(env, f"print(memlimits.supported(h))\n"
                  f"memlimits.set_hard(h, Path({str(cgroup)!r}), 2**30)")
    assert r.stdout.strip() == "False"
    assert "Function Not Found" in r.stderr or "FunctionNotFound" in r.stderr, r.stderr


def test_driver_limit_binds_the_cgroup_and_is_charged_like_the_library(
        native: NativeBuild, tmp_path: Path, cgroup: Path) -> None:
    """Limit 3 GiB on GPU 0: a process of the cgroup without the library gets exactly the
    chunks a process under the library with the same limit gets (context included in both),
    then CUDA_ERROR_OUT_OF_MEMORY; NVML reads back the limit and the cgroup's use; a process
    outside the cgroup is not bound; clearing the limit frees the cgroup."""
    limit = 3 * GiB
    state = tmp_path / "gpu.state"
    new = machine_env(native, state, extra={"FAKE_NVML_DRIVER_VERSION": NEW})
    r = nvml(new, f"print(memlimits.supported(h))\n"
                  f"memlimits.set_hard(h, Path({str(cgroup)!r}), {limit})")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    native_path = in_cgroup(native, new, cgroup)
    chunks, rc = room(native_path)
    assert rc == CUDA_ERROR_OUT_OF_MEMORY
    assert 0 < chunks < limit // CHUNK  # the context counts too
    r = nvml(new, f"l = memlimits.read(h, Path({str(cgroup)!r}))\nprint(l.hard, l.used)")
    hard, used = map(int, r.stdout.split())
    assert hard == limit and limit - CHUNK < used <= limit, (hard, used)
    outside = in_cgroup(native, new, None)
    assert room_at_least(outside, chunks + 4)
    outside.close()
    native_path.close()

    old = machine_env(native, tmp_path / "gpu-old.state",
                      extra={"FAKE_NVML_DRIVER_VERSION": OLD, f"{LIMIT_ENV}_0": str(limit),
                             "LD_PRELOAD": str(native.library)})
    library_path = in_cgroup(native, old, None)
    assert room(library_path) == (chunks, CUDA_ERROR_OUT_OF_MEMORY)
    library_path.close()

    r = nvml(new, f"memlimits.clear(h, Path({str(cgroup)!r}))\n"
                  f"print(memlimits.read(h, Path({str(cgroup)!r})).limited)")
    assert r.stdout.strip() == "False", r.stderr
    freed = in_cgroup(native, new, cgroup)
    assert room_at_least(freed, chunks + 4)
    freed.close()


def room_at_least(probe: Probe, chunks: int) -> bool:
    assert probe("init")["rc"] == 0
    assert probe("ctx 0")["rc"] == 0
    return all(probe(f"alloc {CHUNK}")["rc"] == 0 for _ in range(chunks))


def test_setting_needs_root_and_a_real_cgroup(native: NativeBuild, tmp_path: Path,
                                              cgroup: Path) -> None:
    state = tmp_path / "gpu.state"
    env = machine_env(native, state, extra={"FAKE_NVML_DRIVER_VERSION": NEW})
    r = nvml(env, "memlimits.set_hard(h, Path('/sys/fs/cgroup/memory/no-such-cgroup'), 2**30)")
    assert "Invalid Argument" in r.stderr, r.stderr
    r = nvml(env, "memlimits.set_hard(h, Path('/tmp'), 2**30)")
    assert "Invalid Argument" in r.stderr, r.stderr
    state.touch()
    state.chmod(0o666)
    for d in (tmp_path, *tmp_path.parents):
        if str(d).startswith('/tmp/'):
            d.chmod(d.stat().st_mode | 0o055)
    program = ("import pynvml\nfrom pathlib import Path\nfrom tessera.node import memlimits\n"
               "pynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
               f"memlimits.set_hard(h, Path({str(cgroup)!r}), 2**30)\n")
    fake = tmp_path / "fake"  # the cache under /root is root's alone
    shutil.copytree(native.fake_dir, fake)
    env["LD_LIBRARY_PATH"] = str(fake)
    r = subprocess.run(["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups",
                        sys.executable, "-c", program], env=env, capture_output=True, text=True,
                       timeout=60)
    assert "Insufficient Permissions" in r.stderr, r.stderr
