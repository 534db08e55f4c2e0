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


# What the driver and one CUDA context keep on a device before a workload allocates anything,
# by architecture: CUDA 12 contexts with lazy module loading hold roughly 250-550 MiB (more on
# newer, larger parts). tessera-node replaces this with a measurement where it can create a
# context on the real device; this is the fall-back, and never 0.
_HEADROOM_MIB_BY_FAMILY = {"volta": 320, "turing": 320, "ampere": 448, "ada-lovelace": 448,
                           "hopper": 512, "blackwell": 512}
DEFAULT_HEADROOM_MIB = 512
"""For a model tessera does not know."""

_FAMILY_BY_PREFIX = (("V100", "volta"), ("T4", "turing"), ("A100", "ampere"), ("A10", "ampere"),
                     ("A30", "ampere"), ("A40", "ampere"), ("L4", "ada-lovelace"),
                     ("L40", "ada-lovelace"), ("H100", "hopper"), ("H200", "hopper"),
                     ("GH200", "hopper"), ("B200", "blackwell"), ("GB200", "blackwell"))


def default_headroom(model: str, memory: int) -> int:
    """Bytes to keep back on a device of ``model`` (at most an eighth of its ``memory``, so a
    small simulated device stays usable)."""
    known = GPU_MODELS.get(model)
    family = known.family if known else next(
        (f for prefix, f in _FAMILY_BY_PREFIX if model.upper().startswith(prefix)), "")
    mib = _HEADROOM_MIB_BY_FAMILY.get(family, DEFAULT_HEADROOM_MIB)
    return max(1, min(mib * 2**20, memory // 8))
