"""Finding the machine's GPUs through NVML, or simulating some where there are none."""

from __future__ import annotations

import re
import socket
import uuid
from dataclasses import dataclass

from tessera.core import nvlink
from tessera.core.errors import InvalidRequest
from tessera.core.gpu_models import default_headroom
from tessera.core.model import GpuDevice, Node
from tessera.core.units import GiB
from tessera.node.headroom import headroom_for
from tessera.node.nvml import Nvml, NvmlUnavailable
from tessera.node.nvml import short_model as short_model  # re-exported for callers here

_SIM = re.compile(r"^(?:(\d+)x)?([A-Za-z][A-Za-z0-9]*)-(\d+)GB$")
SIM_RULE = "must look like 1xV100-16GB or 2xH100-80GB (COUNTxMODEL-MEMORYGB)"


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A GPU an operator put in MIG mode: served by MIG partitions (tessera.local.mig), not
    offered to the scheduling cycle as a whole or shared GPU."""

    uuid: str
    index: int
    """NVML's index."""
    model: str


@dataclass(frozen=True, slots=True)
class Machine:
    node: Node
    simulated: bool
    driver: str = ""
    mig: tuple[MigGpu, ...] = ()


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
                    headroom=default_headroom(model, memory),
                )
            )
    return Machine(Node(name=_hostname(), gpus=tuple(gpus)), simulated=True, driver="simulated")


def nvml_machine() -> Machine | None:
    """The real GPUs (tessera-node's NVML inventory), or None where NVML cannot be loaded or
    finds none."""
    try:
        with Nvml() as nvml:
            inventory = nvml.inventory()
            room = headroom_for(inventory, nvml)
    except NvmlUnavailable:
        return None
    # GPUs in MIG mode are left out of the node (a process cannot use one whole); the others
    # are numbered 0..n-1 for the cycle (pods name devices by UUID, never by NVML index).
    whole = [g for g in inventory.gpus if not g.mig_enabled]
    renumber = {g.index: i for i, g in enumerate(whole)}
    gpus = tuple(GpuDevice(uuid=g.uuid, index=renumber[g.index], memory=g.memory_total,
                           model=g.model, product=g.name, headroom=room[g.index].bytes)
                 for g in whole)
    islands = nvlink.islands(len(gpus), [(renumber[link.a], renumber[link.b])
                                         for link in inventory.links if link.nvlink
                                         and link.a in renumber and link.b in renumber])
    mig = tuple(MigGpu(g.uuid, g.index, g.model) for g in inventory.gpus if g.mig_enabled)
    return Machine(Node(name=_hostname(), gpus=gpus, nvlink=islands), simulated=False,
                   driver=inventory.driver_version, mig=mig)


def discover(simulate: list[str] | None, seed: str) -> Machine:
    """Simulated GPUs if asked, else NVML's; simulated ``1xV100-16GB`` when NVML finds none."""
    if simulate:
        return simulated_machine(simulate, seed)
    real = nvml_machine()
    if real is not None:
        return real
    return simulated_machine(["1xV100-16GB"], seed)


def _hostname() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return re.sub(r"[^a-z0-9-]", "-", name) or "localhost"
