"""What a portion of a simulated GPU comes to: portions are of the memory less the headroom the
driver keeps (tessera.core.gpu_models.default_headroom for a simulated device)."""

from __future__ import annotations

from decimal import Decimal

from tessera.core.gpu_models import default_headroom
from tessera.core.units import GiB, portion_bytes


def usable(model: str = "V100-16GB", memory: int = 16 * GiB) -> int:
    return memory - default_headroom(model, memory)


def share(portion: str | float, model: str = "V100-16GB", memory: int = 16 * GiB) -> int:
    """Bytes of ``portion`` of one simulated ``model`` with ``memory`` bytes."""
    return portion_bytes(Decimal(str(portion)), usable(model, memory))
