from __future__ import annotations

from tessera.core.model import GpuDevice, Node
from tessera.core.units import GiB


def gpu_node(
    name: str,
    gpus: int = 1,
    memory_gib: int = 16,
    model: str = "V100M16",
    cpu_milli: int = 64_000,
    host_memory_gib: int = 256,
) -> Node:
    devices = tuple(GpuDevice(f"GPU-{name}-{i}", i, memory_gib * GiB, model) for i in range(gpus))
    return Node(name, devices, cpu_milli, host_memory_gib * GiB)
