"""Finding the machine's GPUs through NVML, or simulating some where there are none."""

from __future__ import annotations

import contextlib
import re
import socket
import uuid
from dataclasses import dataclass

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, Node
from tessera.core.units import GiB

_SIM = re.compile(r"^(?:(\d+)x)?([A-Za-z][A-Za-z0-9]*)-(\d+)GB$")
SIM_RULE = "must look like 1xV100-16GB or 2xH100-80GB (COUNTxMODEL-MEMORYGB)"


@dataclass(frozen=True, slots=True)
class Machine:
    node: Node
    simulated: bool
    driver: str = ""


def parse_simulate(specs: list[str]) -> list[tuple[int, str, int]]:
    """``["2xH100-80GB"]`` to ``[(2, "H100-80GB", 80 GiB)]``.

    Simulated memory is in GiB, as drivers report it (a "16GB" V100 has 16 GiB).
    """
    out: list[tuple[int, str, int]] = []
    for spec in specs:
        for part in spec.split(","):
            m = _SIM.match(part.strip())
            if m is None:
                raise InvalidRequest("simulate", SIM_RULE, part)
            count = int(m.group(1) or 1)
            if count < 1 or count > 64:
                raise InvalidRequest("simulate", "count must be 1 to 64", part)
            if int(m.group(3)) < 1:
                raise InvalidRequest("simulate", "memory must be at least 1GB", part)
            out.append((count, f"{m.group(2)}-{m.group(3)}GB", int(m.group(3)) * GiB))
    if not out:
        raise InvalidRequest("simulate", SIM_RULE, "")
    return out


def simulated_machine(specs: list[str], seed: str) -> Machine:
    """GPUs that exist only here; their UUIDs are stable for one data directory."""
    gpus: list[GpuDevice] = []
    for count, model, memory in parse_simulate(specs):
        for _ in range(count):
            index = len(gpus)
            uid = uuid.uuid5(uuid.NAMESPACE_URL, f"tessera-sim:{seed}:{index}:{model}")
            gpus.append(
                GpuDevice(
                    uuid=f"GPU-{uid}",
                    index=index,
                    memory=memory,
                    model=model,
                    product=f"Simulated {model.split('-')[0]} ({model})",
                )
            )
    return Machine(Node(name=_hostname(), gpus=tuple(gpus)), simulated=True, driver="simulated")


def nvml_machine() -> Machine | None:
    """The real GPUs, or None where NVML cannot be loaded or finds none."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus: list[GpuDevice] = []
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            gpus.append(
                GpuDevice(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    index=i,
                    memory=mem,
                    model=short_model(name, mem),
                    product=name,
                )
            )
        if not gpus:
            return None
        return Machine(Node(name=_hostname(), gpus=tuple(gpus)), simulated=False, driver=driver)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def short_model(product: str, memory: int) -> str:
    """``Tesla V100-SXM2-16GB`` to ``V100-16GB``: the family and its memory."""
    words = re.findall(r"[A-Z]+\d+[A-Za-z]*", product.replace("NVIDIA", "").replace("Tesla", ""))
    family = words[0] if words else re.sub(r"\W+", "", product) or "GPU"
    return f"{family}-{round(memory / GiB)}GB"


def discover(simulate: list[str] | None, seed: str) -> Machine:
    """Simulated GPUs if asked, else NVML's; simulated ``1xV100-16GB`` when NVML finds none."""
    if simulate:
        return simulated_machine(simulate, seed)
    real = nvml_machine()
    if real is not None:
        return real
    return simulated_machine(["1xV100-16GB"], seed)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hostname() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return re.sub(r"[^a-z0-9-]", "-", name) or "localhost"
