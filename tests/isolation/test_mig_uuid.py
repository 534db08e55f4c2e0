"""A MIG-served share reaches the library: tessera-node writes the share's device as NVML names
it (``MIG-<uuid>``) while CUDA names the same device ``GPU-<uuid>``; the library must take them
for one device, or it refuses the device and even a context fails (issue 27). The test creates a
real partition on the fake NVML, runs a CUDA program on it under the library with exactly such a
config, creates a context and allocates up to the limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tessera.isolation.config import DeviceShare, write_workload_files
from tests.isolation.conftest import GiB, clean_env

A100_40 = "NVIDIA A100-SXM4-40GB=40Gi"

MAKE_PARTITION = """
import ctypes
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
p = nv.c_nvmlGpuInstancePlacement_t()
p.start, p.size = 4, 4
gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(p))
nv.nvmlGpuInstanceCreateComputeInstance(gi, 2)
print(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)))
"""


def test_a_share_written_with_its_mig_uuid_gets_a_context_and_its_limit(native, probe,
                                                                         tmp_path: Path) -> None:
    machine = {"FAKE_GPU_MIG_0": "1", "FAKE_GPU_STATE": str(tmp_path / "gpu.state")}
    env = clean_env(native, preload=False, devices=A100_40, extra=machine)
    made = subprocess.run([sys.executable, "-c", MAKE_PARTITION], env=env, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    mig = made.stdout.strip()
    assert mig.startswith("MIG-"), mig
    files = write_workload_files(tmp_path / "share",
                                 [DeviceShare(index=0, uuid=mig, limit_bytes=4 * GiB)])
    p = probe(clean_env(native, devices=A100_40, extra={
        **machine, "TESSERA_GPU_CONFIG": str(files.config_path), "CUDA_VISIBLE_DEVICES": mig,
        "NVIDIA_VISIBLE_DEVICES": mig}))
    p.start()  # init and a context on the MIG device: refused before (device not in the config)
    free, total = p.info()
    assert total == 4 * GiB, (free, total)
    p.alloc(free)
    assert p("alloc 1")["rc"] == 2  # the limit holds on the MIG device
