"""The fake NVML's MIG (native/fakedriver), read and driven through nvidia-ml-py in real
processes: the geometry matches tessera.core.mig's tables, creation and destruction give NVML's
errors, instances are shared by every process of one simulated machine, and a CUDA process on a
MIG device is charged to its instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.core.mig import PROFILES
from tessera.isolation.build import NativeBuild
from tests.node.conftest import machine_env, start_proc
from tests.node.fake_mig import A100_40, nvml

A100_80 = "NVIDIA A100-SXM4-80GB=80Gi"
H100_80 = "NVIDIA H100 80GB HBM3=81559Mi"


PROFILE_TABLE = """
out = {}
for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
    try:
        info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
    except nv.NVMLError_NotSupported:
        continue
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
    arr = (nv.c_nvmlGpuInstancePlacement_t * count.value)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
    out[str(info.name).removeprefix("MIG ")] = {
        "id": info.id, "compute": info.sliceCount, "count": info.instanceCount,
        "mib": info.memorySizeMB, "placements": [[p.start, p.size] for p in arr]}
"""


@pytest.mark.parametrize(("devices", "model"), [(A100_40, "A100-40GB"), (A100_80, "A100-80GB"),
                                                (H100_80, "H100-80GB")])
def test_profiles_match_tessera_core_tables(native: NativeBuild, devices: str, model: str) -> None:
    env = machine_env(native, None, devices=devices, extra={"FAKE_GPU_MIG_0": "1"})
    table = nvml(env, PROFILE_TABLE)
    core = PROFILES[model]
    # The fake also lists the media-engine variant (1g.*+me), which tessera does not place.
    assert {n for n in table if not n.endswith("+me")} == set(core)
    for name, prof in core.items():
        row = table[name]
        assert row["compute"] == prof.compute
        assert row["placements"] == [[s, prof.slots] for s in prof.starts]
        assert row["count"] == 7 // prof.compute if prof.slots != 2 or prof.compute != 1 else 4
        assert int(name.split(".")[1].removesuffix("gb")) * 1000 * 0.9 < row["mib"] * 1.048576
    assert table[f"7g.{model.split('-')[1].lower()}"]["id"] == 0


def test_mig_mode_is_the_fakes_config_and_not_supported_where_the_product_has_none(
        native: NativeBuild) -> None:
    env = machine_env(native, None, devices=f"{A100_40};{A100_40};Tesla V100-SXM2-16GB=16Gi",
                      extra={"FAKE_GPU_MIG_0": "1", "FAKE_GPU_MIG_2": "1"})
    out = nvml(env, """
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
    out = {
        "modes": [nv.nvmlDeviceGetMigMode(x) if not err(nv.nvmlDeviceGetMigMode, x) else
                  err(nv.nvmlDeviceGetMigMode, x) for x in hs],
        "max": [nv.nvmlDeviceGetMaxMigDeviceCount(x) for x in hs],
        "create_off": err(nv.nvmlDeviceCreateGpuInstance, hs[1], 9),
        "info_off": err(nv.nvmlDeviceGetGpuInstanceProfileInfo, hs[1], 2),
        "placements_off": err(nv.nvmlDeviceGetGpuInstancePossiblePlacements, hs[1], 9, None,
                              ctypes.byref(ctypes.c_uint())),
        "set": hasattr(nv, "nvmlDeviceSetMigMode"),
    }
    """)
    assert out["modes"] == [[1, 1], [0, 0], nv_not_supported()]
    assert out["max"] == [7, 0, 0]
    assert out["create_off"] == nv_not_supported()
    assert out["info_off"] == nv_not_supported()
    assert out["placements_off"] == 0  # placements are listed whatever the mode (as NVML does)


def nv_not_supported() -> int:
    return 3  # NVML_ERROR_NOT_SUPPORTED


NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23


def test_create_and_destroy_give_nvmls_errors(native: NativeBuild) -> None:
    env = machine_env(native, None, devices=A100_40, extra={"FAKE_GPU_MIG_0": "1"})
    out = nvml(env, """
    out = {}
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))     # 3g.20gb at 4
    info = nv.nvmlGpuInstanceGetInfo(gi)
    out["gi"] = [info.id, info.profileId, info.placement.start, info.placement.size]
    out["overlap"] = err(nv.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, place(6, 1))
    out["bad_start"] = err(nv.nvmlDeviceCreateGpuInstanceWithPlacement, h, 9, place(2, 4))
    out["bad_size"] = err(nv.nvmlDeviceCreateGpuInstanceWithPlacement, h, 9, place(0, 2))
    out["bad_profile"] = err(nv.nvmlDeviceCreateGpuInstanceWithPlacement, h, 77, place(0, 1))
    out["no_mig_device"] = err(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0)   # 3 slices
    out["ci_profile"] = [ci_info.id, ci_info.sliceCount, ci_info.instanceCount]
    out["ci_too_big"] = err(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, 3, 0)
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    out["ci_full"] = err(nv.nvmlGpuInstanceCreateComputeInstance, gi, 0)
    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    out["uuid"] = nv.nvmlDeviceGetUUID(m)
    out["mem"] = nv.nvmlDeviceGetMemoryInfo(m).total
    out["ids"] = [nv.nvmlDeviceGetGpuInstanceId(m), nv.nvmlDeviceGetComputeInstanceId(m)]
    out["by_uuid"] = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByUUID(out["uuid"]))
    out["second_index"] = err(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, 1)
    out["destroy_with_ci"] = err(nv.nvmlGpuInstanceDestroy, gi)
    # 4g.20gb needs slots 0-3 and 4 compute slices: 3 + 4 = 7 fits
    gi4 = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 5, place(0, 4))
    out["full"] = err(nv.nvmlDeviceCreateGpuInstance, h, 19)
    out["remaining_1g"] = nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19)
    nv.nvmlGpuInstanceDestroy(gi4)
    out["remaining_after"] = nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19)
    nv.nvmlComputeInstanceDestroy(ci)
    out["ci_again"] = err(nv.nvmlComputeInstanceDestroy, ci)
    nv.nvmlGpuInstanceDestroy(gi)
    out["gi_again"] = err(nv.nvmlGpuInstanceDestroy, gi)
    out["gone"] = err(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    out["stale_handle"] = err(nv.nvmlDeviceGetUUID, m)
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))
    nv.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    out["new_uuid"] = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    """)
    assert out["gi"][1:] == [9, 4, 4]
    assert out["overlap"] == NVML_ERROR_INSUFFICIENT_RESOURCES
    assert out["bad_start"] == out["bad_size"] == out["bad_profile"] == NVML_ERROR_INVALID_ARGUMENT
    assert out["no_mig_device"] == NVML_ERROR_NOT_FOUND
    assert out["ci_profile"] == [2, 3, 1]
    assert out["ci_too_big"] == nv_not_supported()
    assert out["ci_full"] == NVML_ERROR_INSUFFICIENT_RESOURCES
    assert out["uuid"].startswith("MIG-") and len(out["uuid"]) == 40
    assert out["mem"] == 19968 * 2**20
    assert out["ids"] == [out["gi"][0], 0]
    assert out["by_uuid"] == out["uuid"]
    assert out["second_index"] == NVML_ERROR_NOT_FOUND
    assert out["destroy_with_ci"] == NVML_ERROR_IN_USE
    assert out["full"] == NVML_ERROR_INSUFFICIENT_RESOURCES
    assert out["remaining_1g"] == 0
    assert out["remaining_after"] == 4
    assert out["ci_again"] == out["gi_again"] == NVML_ERROR_INVALID_ARGUMENT
    assert out["gone"] == NVML_ERROR_NOT_FOUND
    assert out["stale_handle"] == NVML_ERROR_INVALID_ARGUMENT
    assert out["new_uuid"] != out["uuid"]  # a partition made again is a new MIG device


def test_instances_are_shared_by_the_processes_of_one_machine(native: NativeBuild,
                                                              tmp_path: Path) -> None:
    env = machine_env(native, tmp_path / "gpu.state", devices=f"{H100_80};{H100_80}",
                      extra={"FAKE_GPU_MIG_0": "1", "FAKE_GPU_MIG_1": "1"})
    made = nvml(env, """
    h1 = nv.nvmlDeviceGetHandleByIndex(1)
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h1, 14, place(2, 2))   # 2g.20gb at 2
    nv.nvmlGpuInstanceCreateComputeInstance(gi, 1)
    out = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h1, 0))
    """)
    seen = nvml(env, """
    h1 = nv.nvmlDeviceGetHandleByIndex(1)
    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h1, 0)
    gi = nv.nvmlDeviceGetGpuInstanceById(h1, nv.nvmlDeviceGetGpuInstanceId(m))
    info = nv.nvmlGpuInstanceGetInfo(gi)
    out = {"uuid": nv.nvmlDeviceGetUUID(m), "placement": [info.placement.start, info.placement.size],
           "on_0": err(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, 0),
           "overlap": err(nv.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 14, place(2, 2))}
    ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(gi)
    """)
    assert seen == {"uuid": made, "placement": [2, 2], "on_0": NVML_ERROR_NOT_FOUND,
                    "overlap": NVML_ERROR_INSUFFICIENT_RESOURCES}
    assert nvml(env, "out = err(nv.nvmlDeviceGetMigDeviceHandleByIndex, "
                     "nv.nvmlDeviceGetHandleByIndex(1), 0)") == NVML_ERROR_NOT_FOUND


def test_a_cuda_process_on_a_mig_device_holds_its_instance(native: NativeBuild, tmp_path: Path,
                                                          gpu_procs: list) -> None:
    env = machine_env(native, tmp_path / "gpu.state", devices=A100_40,
                      extra={"FAKE_GPU_MIG_0": "1"})
    uuid = nvml(env, """
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 15, place(6, 2))   # 1g.10gb at 6
    nv.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    out = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    """)
    probe = start_proc(native, gpu_procs, {**env, "CUDA_VISIBLE_DEVICES": uuid})
    assert probe("info")["total"] == 9856 * 2**20
    probe.alloc(2 * 2**30)
    held = nvml(env, """
    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
    ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    out = {"procs": [[p.pid, p.gpuInstanceId, p.computeInstanceId] for p in procs],
           "mig_used": nv.nvmlDeviceGetMemoryInfo(m).used,
           "mig_procs": [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(m)],
           "destroy_ci": err(nv.nvmlComputeInstanceDestroy, ci)}
    """)
    gi_id = held["procs"][0][1] if held["procs"] else None
    assert held["procs"] == [[probe.proc.pid, gi_id, 0]]
    assert held["mig_used"] == 2 * 2**30 + 448 * 2**20  # its allocation and its context (A100: 448 MiB)
    assert held["mig_procs"] == [probe.proc.pid]
    assert held["destroy_ci"] == NVML_ERROR_IN_USE
    probe.proc.kill()
    probe.proc.wait()
    assert nvml(env, """
    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
    nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    out = err(nv.nvmlGpuInstanceDestroy, gi)
    """) == 0
