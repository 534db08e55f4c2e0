"""GPU models tessera knows by name: the product string NVIDIA's GPU feature discovery writes
(``nvidia.com/gpu.product``) and the short model name used in constraints and listings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    key: str
    """Short name used in constraints and listings, e.g. ``H100-80GB``."""
    product: str
    """As GFD writes it in ``nvidia.com/gpu.product`` (the NVML name with spaces as dashes)."""
    memory_mib: int
    family: str
    compute: tuple[int, int]
    mig_capable: bool


GPU_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in [
        GpuModel("H100-80GB", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0), True),
        GpuModel("H200-141GB", "NVIDIA-H200", 143771, "hopper", (9, 0), True),
        GpuModel("A100-80GB", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0), True),
        GpuModel("A100-40GB", "NVIDIA-A100-SXM4-40GB", 40960, "ampere", (8, 0), True),
        GpuModel("L4-24GB", "NVIDIA-L4", 23034, "ada-lovelace", (8, 9), False),
        GpuModel("T4-16GB", "Tesla-T4", 15360, "turing", (7, 5), False),
    ]
}

_BY_PRODUCT = {m.product: m.key for m in GPU_MODELS.values()}


def model_of_product(product: str) -> str:
    """The short model name of a GFD product string; unknown products keep their own name."""
    return _BY_PRODUCT.get(product, product or "unknown")
