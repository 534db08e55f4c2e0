"""Context memory the library measures itself (issue #12 item 1, docs/isolation.md "Context
memory"): with neither ``context-overhead`` in the file nor TESSERA_GPU_CONTEXT_OVERHEAD, the
first context on a device is measured through NVML (the process's own memory, else the drop in
the device's free memory) and every context is charged that, never 0.

The fake driver's contexts take FAKE_GPU_CONTEXT_BYTES of device memory, seen by cuMemGetInfo and,
with FAKE_GPU_STATE (one simulated machine), by the fake NVML; FAKE_NVML_HOST_PIDS=1 makes NVML
list host PIDs, as inside a container with its own PID namespace. ``adversary four-contexts``
(native/tests/adversary.c) creates the primary context and three more and prints what the
library charged for them (the hooked cuMemGetInfo) and what the driver holds."""

from __future__ import annotations

import subprocess

import pytest

from tessera.isolation import DeviceShare, read_region, write_workload_files
from tests.isolation.conftest import CTX, H100, GiB, clean_env

MiB = 2**20


def four_contexts(native, tmp_path, ctx_bytes: int, *, limit: int = 8 * GiB, nvml_sees: bool = True,
                  host_pids: bool = False, **extra: str) -> tuple[dict[str, int], str]:
    region = tmp_path / "gpu-usage.region"
    env = {"TESSERA_GPU_MEMORY_LIMIT": str(limit), "FAKE_GPU_CONTEXT_BYTES": str(ctx_bytes),
           "TESSERA_ISOLATION_LOG": "info", "TESSERA_GPU_SHARED_REGION": str(region), **extra}
    if nvml_sees:
        env["FAKE_GPU_STATE"] = str(tmp_path / "gpu.state")
    if host_pids:
        env["FAKE_NVML_HOST_PIDS"] = "1"
    result = subprocess.run([str(native.program("adversary")), "four-contexts"],
                            env=clean_env(native, devices=H100, extra=env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out: dict[str, int] = {}
    for line in result.stdout.split("\n"):
        for token in line.split():
            k, _, v = token.partition("=")
            out[k] = int(v)
    # What the library charged, from the region (the exited process's slot is not reclaimed
    # until another process of the workload touches it).
    out["region"] = sum(d.used_bytes for d in read_region(region).values())
    return out, result.stderr


@pytest.mark.parametrize("ctx_bytes", [700 * MiB, 123 * MiB])
@pytest.mark.parametrize("host_pids", [False, True], ids=["nvml-process", "probe-match"])
def test_four_contexts_are_charged_the_measured_amount(native, tmp_path, ctx_bytes, host_pids):
    """700 MiB is above the H100 default (512 MiB), 123 MiB below it: either way what is charged
    is what the driver holds, measured from NVML's memory of the process, found by its PID or
    (host PIDs) by two probe allocations (issue #28 class 3: never from the drop in free memory,
    which another tenant's free distorts; tests/isolation/test_class3.py)."""
    out, err = four_contexts(native, tmp_path, ctx_bytes, host_pids=host_pids)
    assert out["refused"] == 0, err
    assert out["held0"] == 4 * ctx_bytes  # the driver's own count
    assert out["charged"] == out["region"] == 4 * ctx_bytes, err
    how = ("NVML's memory of this process, found by two probe allocations" if host_pids
           else "NVML's memory of this process")
    assert f"a CUDA context holds {ctx_bytes} bytes (measured from {how})" in err


def test_measured_from_a_config_file_without_context_overhead(native, tmp_path):
    files = write_workload_files(tmp_path / "w", [DeviceShare(index=0, uuid=None, limit_bytes=8 * GiB)],
                                 context_overhead_bytes=0)
    env = clean_env(native, extra={"TESSERA_GPU_CONFIG": str(files.config_path),
                                   "FAKE_GPU_CONTEXT_BYTES": str(700 * MiB),
                                   "FAKE_GPU_STATE": str(tmp_path / "gpu.state")})
    result = subprocess.run([str(native.program("adversary")), "four-contexts"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"charged={4 * 700 * MiB}" in result.stdout


def test_configured_overhead_is_not_measured(native, tmp_path):
    out, err = four_contexts(native, tmp_path, 700 * MiB, TESSERA_GPU_CONTEXT_OVERHEAD="100Mi")
    assert out["charged"] == out["region"] == 4 * 100 * MiB
    assert "measured" not in err


@pytest.mark.parametrize("case", ["nvml-blind", "zero", "disturbed"])
def test_unmeasurable_context_memory_falls_back_to_the_default_never_zero(native, tmp_path, case):
    """NVML sees nothing of the process and no drop (no FAKE_GPU_STATE), contexts that take no
    memory, or a reading above a quarter of the device (another process allocated meanwhile):
    the per-model default (512 MiB on an H100) is charged, never 0."""
    ctx_bytes = {"nvml-blind": 700 * MiB, "zero": 0, "disturbed": 30 * GiB}[case]
    out, err = four_contexts(native, tmp_path, ctx_bytes, limit=200 * GiB,
                             nvml_sees=case != "nvml-blind")
    created = 4 - out["refused"]  # 30 GiB contexts: the fake H100 has room for two
    assert created >= 2, err
    assert out["region"] == created * CTX, err
    assert "context memory not measured" in err


def test_a_measured_context_over_the_limit_is_undone_and_refused(native, tmp_path):
    """The default (512 MiB) fits a 600 MiB limit, the measured 700 MiB does not: the context is
    destroyed again and the call refused, so the driver holds nothing."""
    out, err = four_contexts(native, tmp_path, 700 * MiB, limit=600 * MiB)
    assert out["refused"] >= 1
    assert out["held0"] == 0 and out["region"] == 0, err
    assert "context creation on device 0 refused: its 734003200 bytes exceed" in err
