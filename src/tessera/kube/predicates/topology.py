"""Topology-aware placement: all pods of a workload within one domain of a topology level.

Nodes carry their topology in labels; a level names one of them:

| level | node label |
| --- | --- |
| ``zone`` | ``topology.kubernetes.io/zone`` |
| ``block`` | ``tessera.io/topology-block`` |
| ``rack`` | ``tessera.io/topology-rack`` |
| ``host`` | ``kubernetes.io/hostname`` |
| ``nvlink`` | ``nvidia.com/gpu.clique`` (the NVLink domain GPU feature discovery labels) |

A workload (its pods, or its PodGroup) asks with ``tessera.io/topology-required: rack`` (all
its pods in one rack, or it waits) or ``tessera.io/topology-preferred: rack`` (one rack if one
has room, else anywhere). KAI's spelling is read too: ``kai.scheduler/topology-required-placement``
and ``kai.scheduler/topology-preferred-placement``, whose value is the node label itself.

The domain is chosen per cycle for the whole workload (a gang is placed as a whole inside it):
the domain where its pods already run, else the smallest domain whose free GPUs can hold all its
pending pods (estimated per node from free devices), else, for a required level, the roomiest one
(the workload waits, with the reason). The choice reaches placement as a static filter
(required) or a preference (preferred).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, Node, ResourceRequest
from tessera.core.units import portion_bytes

REQUIRED = "tessera.io/topology-required"
PREFERRED = "tessera.io/topology-preferred"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_PREFERRED = "kai.scheduler/topology-preferred-placement"

LEVELS = {
    "zone": "topology.kubernetes.io/zone",
    "block": "tessera.io/topology-block",
    "rack": "tessera.io/topology-rack",
    "host": "kubernetes.io/hostname",
    "nvlink": "nvidia.com/gpu.clique",
}

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    key: str
    """The node label whose value is the domain."""
    required: bool
    source: str
    """The annotation it came from (for reasons)."""
    level: str


def topology_request(annotations: Mapping[str, str]) -> TopologyRequest | None:
    """The workload's topology wish; InvalidRequest naming the annotation if malformed."""
    found: list[TopologyRequest] = []
    for ann, required in ((REQUIRED, True), (PREFERRED, False)):
        value = annotations.get(ann)
        if value is None:
            continue
        level = value.strip()
        if level not in LEVELS:
            raise InvalidRequest(ann, f"must be a topology level: one of {', '.join(LEVELS)}", value)
        found.append(TopologyRequest(LEVELS[level], required, ann, level))
    for ann, required in ((KAI_REQUIRED, True), (KAI_PREFERRED, False)):
        value = annotations.get(ann)
        if value is None:
            continue
        key = value.strip()
        if len(key) > 316 or not _LABEL_KEY.match(key):
            raise InvalidRequest(ann, "must be a node label key (KAI: the topology level's nodeLabel)",
                                 value)
        level = next((n for n, k in LEVELS.items() if k == key), key)
        found.append(TopologyRequest(key, required, ann, level))
    if len(found) > 1:
        raise InvalidRequest(found[1].source, f"give one topology annotation, not {found[0].source} too")
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class Domain:
    """Where a workload's pods must (or should) go this cycle."""

    key: str
    value: str | None
    """None: no node carries the level's label."""
    required: bool
    level: str
    source: str

    def text(self) -> str:
        where = f"{self.level} {self.value}" if self.value is not None else f"any {self.level}"
        return f"were outside the workload's {where} ({self.source})"


def pods_that_fit(request: ResourceRequest, node: Node, used: Mapping[int, tuple[int, bool]]) -> int:
    """How many pods asking ``request`` the node's free GPUs could still take (an estimate:
    CPU and memory are left to placement). ``used``: device index -> (bytes held, exclusive)."""
    gpu = request.gpu
    if gpu.kind is GpuKind.NONE:
        return 10**6
    devices = [g for g in node.gpus if not gpu.models or g.model in gpu.models]
    if gpu.kind is GpuKind.WHOLE:
        free = sum(1 for g in devices if used.get(g.index, (0, False))[0] == 0)
        return free // max(gpu.devices, 1)
    slots = 0
    for g in devices:
        held, exclusive = used.get(g.index, (0, False))
        if exclusive:
            continue
        need = gpu.memory if gpu.kind is GpuKind.MEMORY else portion_bytes(gpu.portion or Decimal(0), g.memory)
        if need and need > 0:
            slots += max(0, g.memory - held) // need
    return slots // max(gpu.devices, 1)


def choose_domain(want: TopologyRequest, pending: list[ResourceRequest], running_on: list[str],
                  nodes: Mapping[str, Node], labels: Mapping[str, Mapping[str, str]],
                  allowed: Callable[[Node], bool],
                  used: Mapping[str, Mapping[int, tuple[int, bool]]]) -> Domain:
    """The domain of ``want``'s level for a workload: where its pods run, else the smallest
    domain with room for all of ``pending``, else the roomiest (see the module's docstring)."""
    key = want.key
    for n in running_on:
        value = labels.get(n, {}).get(key)
        if value is not None:
            return Domain(key, value, want.required, want.level, want.source)
    room: dict[str, int] = {}
    for name, node in nodes.items():
        value = labels.get(name, {}).get(key)
        if value is None or not allowed(node):
            continue
        fit = min((pods_that_fit(r, node, used.get(name, {})) for r in set(pending)), default=0)
        room[value] = room.get(value, 0) + fit
    if not room:
        return Domain(key, None, want.required, want.level, want.source)
    enough = sorted((c, v) for v, c in room.items() if c >= len(pending))
    if enough:
        return Domain(key, enough[0][1], want.required, want.level, want.source)
    best = max(room.items(), key=lambda kv: (kv[1], kv[0]))
    return Domain(key, best[0], want.required, want.level, want.source)
