"""Processes of one workload that see different device subsets (CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

from tessera.isolation import DeviceShare, process_environment, read_region, write_workload_files
from tests.isolation.conftest import CTX_V100, V100X4, GiB, clean_env, fake_uuids, run


def test_usage_is_shared_per_physical_device_whatever_the_ordinal(native, probe, tmp_path):
    uuids = fake_uuids(native)
    env = clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi",
                                                    "TESSERA_GPU_SHARED_REGION": str(tmp_path / "r")})
    a = probe({**env, "CUDA_VISIBLE_DEVICES": "2"}).start(0)  # ordinal 0 is GPU 2
    b = probe({**env, "CUDA_VISIBLE_DEVICES": "1,2"}).start(1)  # ordinal 1 is GPU 2
    a.alloc(2 * GiB - 2 * CTX_V100)  # both processes' contexts are on GPU 2
    assert b.info() == (0, 2 * GiB)
    assert b("alloc 1")["rc"] == 2
    assert b("ctx 0")["rc"] == 0  # GPU 1: untouched
    b.alloc(2 * GiB - CTX_V100)
    usage = read_region(tmp_path / "r")
    assert {k: u.used_bytes for k, u in usage.items()} == {uuids[2]: 2 * GiB, uuids[1]: 2 * GiB}
    # nvidia-smi inside sees every GPU (NVML ignores CUDA_VISIBLE_DEVICES) with the workload's usage
    rows = run(native, "smi", {**env, "CUDA_VISIBLE_DEVICES": "2"}).stdout.splitlines()
    used = {r.split(", ")[2]: int(r.split(", ")[4]) for r in rows}
    assert used == {uuids[0]: 0, uuids[1]: 2048, uuids[2]: 2048, uuids[3]: 0}


def test_file_limits_follow_the_uuid_not_the_order(native, probe, tmp_path):
    uuids = fake_uuids(native)
    files = write_workload_files(tmp_path, [
        DeviceShare(index=0, uuid=uuids[3], limit_bytes=1 * GiB),
        DeviceShare(index=1, uuid=uuids[0], limit_bytes=3 * GiB),
    ])
    base = clean_env(native, devices=V100X4)
    base.update(process_environment(files, library=native.library))
    for cvd, expected in (("3,0", [GiB, 3 * GiB]), ("0,3", [3 * GiB, GiB])):
        p = probe({**base, "CUDA_VISIBLE_DEVICES": cvd})
        assert p("init")["rc"] == 0
        for ordinal, limit in enumerate(expected):
            assert p(f"ctx {ordinal}")["rc"] == 0
            assert p.info() == (limit - CTX_V100, limit)
        p.close()
