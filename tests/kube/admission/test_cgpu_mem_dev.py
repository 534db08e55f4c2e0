"""cGPU's ALIYUN_COM_GPU_MEM_DEV (seed 002): the per-pod ConfigMap carries the whole GiB of each
device, which the webhook wires into the container's environment."""

from __future__ import annotations

from tessera.core.state import Placement
from tessera.kube.binder import Writer

V100_BYTES = 16_945_512_448  # a 16 GB V100 as NVML reports it: 15.78 GiB


def test_configmap_carries_the_device_gib_as_seed_002_shows() -> None:
    writer = Writer.__new__(Writer)  # configmap_data reads no client state
    placement = Placement("node-1", devices=(0, 1, 2, 3), request_bytes=(2 * 2**30,) * 4,
                          limit_bytes=(2 * 2**30,) * 4)
    data = writer.configmap_data(placement, ["a", "b", "c", "d"], [V100_BYTES] * 4)
    assert data["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    data = writer.configmap_data(placement, ["a", "b", "c", "d"], [80 * 2**30] * 4)
    assert data["ALIYUN_COM_GPU_MEM_DEV"] == "80"
