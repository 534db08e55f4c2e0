"""What NVML (nvidia-ml-py, and an nvidia-smi stand-in) shows inside a workload."""

from __future__ import annotations

import json
import subprocess
import sys

from tessera.isolation import DeviceShare, process_environment, write_workload_files
from tests.isolation.conftest import CTX, H100_BYTES, V100X4, GiB, clean_env, run

MiB = 2**20

PYNVML = r"""
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    out.append({"v1": [m1.total, m1.used, m1.free], "v2": [m2.total, m2.used, m2.free, m2.reserved]})
print(json.dumps(out))
"""


def nvml_view(env):
    done = subprocess.run([sys.executable, "-c", PYNVML], env=env, capture_output=True, text=True,
                          check=True, timeout=60)
    return json.loads(done.stdout)


def test_pynvml_sees_the_limit_and_the_workloads_usage(native, probe, tmp_path):
    files = write_workload_files(tmp_path, [DeviceShare(index=0, uuid=None, limit_bytes=8 * GiB)])
    env = clean_env(native)
    env.update(process_environment(files, library=native.library))
    holder = probe(env).start()
    holder.alloc(3 * GiB)
    view = nvml_view(env)[0]
    # the holder's context counts (the model default: no context-overhead in the file)
    assert view["v1"] == [8 * GiB, 3 * GiB + CTX, 5 * GiB - CTX]
    assert view["v2"] == [8 * GiB, 3 * GiB + CTX, 5 * GiB - CTX, 0]
    holder.close()
    assert nvml_view(env)[0]["v1"] == [8 * GiB, 0, 8 * GiB]  # the exited process is reclaimed


def test_pynvml_without_a_limit_sees_the_device(native):
    view = nvml_view(clean_env(native))[0]
    assert view["v1"] == [H100_BYTES, 0, H100_BYTES]


def test_nvml_usage_never_wraps(native, probe, tmp_path):
    region = str(tmp_path / "region")
    big = probe(clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "8Gi",
                                         "TESSERA_GPU_SHARED_REGION": region})).start()
    big.alloc(6 * GiB)
    view = nvml_view(clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "4Gi",
                                              "TESSERA_GPU_SHARED_REGION": region}))[0]
    assert view["v1"] == [4 * GiB, 4 * GiB, 0]


def test_smi_shows_each_device_share(native):
    env = clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi"})
    lines = run(native, "smi", env).stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert line.endswith(", 2048, 0, 2048")
    v2 = run(native, "smi", env, "--v2").stdout.splitlines()
    assert all(line.endswith(", 2048, 0, 2048") for line in v2)
    plain = run(native, "smi", clean_env(native, devices=V100X4)).stdout.splitlines()
    assert all(line.endswith(", 16384, 0, 16384") for line in plain)


def test_smi_maps_per_index_limits_through_cuda_visible_devices(native):
    env = clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT_0": "1Gi",
                                                    "TESSERA_GPU_MEMORY_LIMIT_1": "3Gi",
                                                    "CUDA_VISIBLE_DEVICES": "2,3"})
    totals = [int(line.split(", ")[3]) for line in run(native, "smi", env).stdout.splitlines()]
    assert totals == [16384, 16384, 1024, 3072]


def test_smi_fails_closed_with_a_bad_config(native, tmp_path):
    env = clean_env(native, extra={"TESSERA_GPU_CONFIG": str(tmp_path / "missing.conf")})
    done = run(native, "smi", env)
    assert done.stdout.strip().endswith(", 0, 0, 0")
    assert "fail closed" in done.stderr


def test_smi_is_quiet_by_default(native):
    done = run(native, "smi", clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "8Gi"}))
    assert done.stderr == ""
    assert done.stdout.strip().endswith(f", {8 * GiB // MiB}, 0, {8 * GiB // MiB}")


def test_nvml_null_output_pointers_return_the_drivers_answer(native):
    done = run(native, "smi", clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "8Gi"}), "--null")
    assert done.returncode == 0
    assert done.stdout.strip() == "0, null, 2, 2"  # NVML_ERROR_INVALID_ARGUMENT, no crash
