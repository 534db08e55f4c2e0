"""Dynamic MIG on Kubernetes, the scheduler's side (issue 20; docs/mig.md).

A pod asking ``tessera.io/gpu-mig-profile: 3g.20gb`` is placed by the core cycle for its CPU,
memory, predicates and quota (its request counts as the profile's fraction of a GPU), held by a
``MigConstraint`` to the nodes where a GPU in MIG mode can give it that profile. At bind the
scheduler picks the GPU and the memory slot with :func:`tessera.core.mig.choose` (an idle
partition of the profile first, else the free slot that fragments least, else removing idle
partitions) and writes it on the pod (``tessera.io/mig-partition``); tessera-node on that node
makes or reuses the partition and writes its ``MIG-…`` UUID into the pod's ConfigMap.

What exists on a node comes from tessera-node's inventory (``tessera.io/gpu-inventory``: per GPU
its MIG mode and partitions); who holds what comes from the pods: a partition at the slot a
live pod's annotation names is busy (made or still to be made), the idle ones it names to
remove are gone, and every other partition tessera made is idle. Partitions tessera did not
make (an operator's) are busy and never touched.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.core.constraints import NodeConstraint, PlacedPods
from tessera.core.mig import (
    COMPUTE,
    PROFILES,
    SERVES_SHARES,
    MigChoice,
    MigGpu,
    Partition,
    choose,
    supported_text,
)
from tessera.core.model import Node
from tessera.wire import MigHold as MigHold
from tessera.wire import hold_from_json as hold_from_json


@dataclass(frozen=True, slots=True)
class NodeMigGpu:
    """A GPU in MIG mode as tessera-node reports it."""

    uuid: str
    index: int
    model: str
    partitions: tuple[Partition, ...] = ()
    """What exists: ``busy`` is True for partitions tessera did not make."""


def mig_gpus(inventory: str) -> tuple[NodeMigGpu, ...]:
    """The GPUs in MIG mode of a node's ``tessera.io/gpu-inventory`` whose model tessera knows;
    () where the annotation is absent or unreadable (a bad annotation must not stop placement)."""
    if not inventory:
        return ()
    try:
        gpus = json.loads(inventory)["gpus"]
        out = []
        for g in gpus:
            if g.get("mig") is not True or g.get("model") not in PROFILES:
                continue
            table = PROFILES[g["model"]]
            parts = tuple(
                Partition(p["profile"].removesuffix("+me"), int(p["start"]),
                          not p.get("managed"),
                          str(p.get("uuid") or ""))
                for p in g.get("partitions") or () if p["profile"].removesuffix("+me") in table)
            out.append(NodeMigGpu(str(g["uuid"]), int(g["index"]), g["model"], parts))
        return tuple(out)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()


def _overlaps(model: str, a: Partition, start: int, slots: int) -> bool:
    size = PROFILES[model][a.profile].slots
    return a.start < start + slots and start < a.start + size


def blocked(gpus: Iterable[NodeMigGpu], hold: MigHold) -> Partition | None:
    """The partition tessera did not make (an operator's) that overlaps a hold whose own
    partition is not there: that hold can never be made (NVML refuses an overlapping GPU
    instance, and tessera never removes others' partitions); None when it can. A partition of
    the hold's own profile and slot is never taken for another's: it may be the hold's own,
    seen before tessera-node's journal names it."""
    g = next((g for g in gpus if g.uuid == hold.gpu), None)
    prof = PROFILES[g.model].get(hold.profile) if g is not None else None
    if g is None or prof is None or any(
            p.start == hold.start and p.profile == hold.profile for p in g.partitions):
        return None
    return next((p for p in g.partitions
                 if p.busy and _overlaps(g.model, p, hold.start, prof.slots)), None)


def layout(gpus: Iterable[NodeMigGpu], holds: Iterable[MigHold | tuple[MigHold, str]]) -> list[MigGpu]:
    """The node's MIG GPUs for :func:`choose`: what exists, with the slots live pods hold busy
    (made or still to be made) and the idle partitions they asked to remove gone. A hold may
    come with its pod (``namespace/name``), recorded as the partition's ``holder``."""
    by_gpu: dict[str, list[tuple[MigHold, str]]] = {}
    for item in holds:
        h, who = item if isinstance(item, tuple) else (item, "")
        by_gpu.setdefault(h.gpu, []).append((h, who))
    out = []
    for g in gpus:
        parts = list(g.partitions)
        table = PROFILES[g.model]
        for h, who in by_gpu.get(g.uuid, ()):
            prof = table.get(h.profile)
            if prof is None:
                continue
            mine = [p for p in parts if p.start == h.start and p.profile == h.profile]
            parts = [p for p in parts if p not in mine and (p.busy or (
                p.start not in h.remove and not _overlaps(g.model, p, h.start, prof.slots)))]
            parts.append(Partition(h.profile, h.start, True, mine[0].uuid if mine else "", who))
        out.append(MigGpu(g.uuid, g.model, tuple(sorted(parts, key=lambda p: p.start))))
    return out


def describe(node: str, gpus: Iterable[MigGpu]) -> str:
    """``mig-node-0 GPU-…: A100-40GB 3g.20gb busy, 3g.20gb idle``, for reasons."""
    parts = []
    for g in gpus:
        cut = ", ".join(f"{p.profile}@{p.start} {'busy' if p.busy else 'idle'}"
                        for p in g.partitions) or "not cut"
        parts.append(f"{node} {g.model}: {cut}")
    return "; ".join(parts)


def apply_choice(gpus: list[MigGpu], profile: str, choice: MigChoice) -> MigHold:
    """Marks the chosen slot busy in ``gpus`` (in place), so the next pod of this cycle sees it;
    the hold to write on the pod."""
    for i, g in enumerate(gpus):
        if g.key != choice.gpu:
            continue
        gone = {p.start for p in choice.destroy}
        reused = None if choice.reuse is None else choice.reuse.start
        parts = [p for p in g.partitions if p.start not in gone and p.start != reused]
        parts.append(Partition(profile, choice.start, True,
                               choice.reuse.uuid if choice.reuse else ""))
        gpus[i] = MigGpu(g.key, g.model, tuple(sorted(parts, key=lambda p: p.start)))
    return MigHold(choice.gpu, profile, choice.start, tuple(sorted(p.start for p in choice.destroy)))


_generations = itertools.count(1)


@dataclass
class MigView:
    """The cluster's MIG GPUs this cycle, per node, as :func:`choose` sees them."""

    nodes: dict[str, list[MigGpu]] = field(default_factory=dict)
    _room: dict[str, tuple[dict[str, float], str]] = field(default_factory=dict)
    _made: dict[tuple[Any, str, bool], MigConstraint] = field(default_factory=dict)
    serving_nodes: frozenset[str] = frozenset()
    """Nodes whose MIG GPUs may serve shares (label ``tessera.io/mig-serves-shares``)."""
    generation: int = field(default_factory=lambda: next(_generations))
    """Drawn per view: constraints of different cycles never compare equal."""

    @classmethod
    def build(cls, node_gpus: Mapping[str, tuple[NodeMigGpu, ...]],
              holds: Iterable[tuple[str, MigHold] | tuple[str, MigHold, str]]) -> MigView:
        """``holds``: (node, hold) or (node, hold, the pod as ``namespace/name``)."""
        per: dict[str, list[tuple[MigHold, str]]] = {}
        for node, h, *who in holds:
            per.setdefault(node, []).append((h, who[0] if who else ""))
        return cls({n: layout(g, per.get(n, ())) for n, g in node_gpus.items() if g})

    def for_cycle(self, workload_of: Mapping[str, str]) -> dict[str, tuple[MigGpu, ...]]:
        """``Snapshot.mig``: each busy partition's holder the workload of its pod
        (``workload_of``: ``namespace/name`` -> workload id); a pod not in the snapshot (being
        evicted, or no pod at all: an operator's partition) holds it as no one, never a victim."""
        return {n: tuple(MigGpu(g.key, g.model, tuple(
            replace(p, holder=workload_of.get(p.holder, "")) for p in g.partitions))
            for g in gs) for n, gs in self.nodes.items()}

    def release(self, node: str, pods: Iterable[str]) -> None:
        """These pods' partitions on ``node`` are idle now (they were evicted for a pod about
        to be bound there), as the cycle saw them when it chose that pod's partition."""
        gone = set(pods)
        gpus = self.nodes.get(node)
        if not gone or gpus is None:
            return
        for i, g in enumerate(gpus):
            gpus[i] = MigGpu(g.key, g.model, tuple(
                Partition(p.profile, p.start, False, p.uuid) if p.busy and p.holder in gone else p
                for p in g.partitions))

    def room(self, profile: str) -> tuple[dict[str, float], str]:
        """Nodes where ``profile`` can be had, each with a preference (:func:`preference`), and
        what exists (for the reason a pod waits)."""
        got = self._room.get(profile)
        if got is None:
            room: dict[str, float] = {}
            for n, g in self.nodes.items():
                choice = choose(g, profile)
                if choice is not None:
                    room[n] = preference(g, choice)
            models = {g.model for gs in self.nodes.values() for g in gs}
            if not self.nodes:
                why = f"no GPU in MIG mode in the cluster for MIG {profile}"
            elif not any(profile in PROFILES[m] for m in models):
                why = (f"no GPU in MIG mode has profile {profile} (MIG profiles here: "
                       f"{supported_text(models)})")
            else:
                why = (f"no room for MIG {profile} on their MIG GPUs ("
                       + "; ".join(describe(n, g) for n, g in sorted(self.nodes.items())) + ")")
            got = self._room[profile] = (room, why)
        return got

    def constraint(self, inner: NodeConstraint | None, profile: str,
                   serving: bool = False) -> MigConstraint:
        """One object per (pod constraint, profile) this cycle, so equal pods share a ranking.
        ``serving``: for a share served by the profile, only the nodes that allow it
        (``serving_nodes``, label ``tessera.io/mig-serves-shares``)."""
        got = self._made.get((inner, profile, serving))
        if got is None:
            room, why = self.room(profile)
            if serving:
                room = {n: v for n, v in room.items() if n in self.serving_nodes}
                why = f"{why} (or not labelled {SERVES_SHARES}=true)"
            got = self._made[(inner, profile, serving)] = MigConstraint(
                inner, profile, room, why, self.generation, serving)
        return got


def preference(gpus: list[MigGpu], choice: MigChoice) -> float:
    """How much a node is preferred for a profile, in the order :func:`choose` ranks within a
    node: an idle partition of it (1), else a free slot, on the GPU already the most cut (0.5 to
    0.9, by its busy compute), else only by removing idle partitions (0.1)."""
    if choice.reuse is not None:
        return 1.0
    if choice.destroy:
        return 0.1
    gpu = next(g for g in gpus if g.key == choice.gpu)
    used = sum(PROFILES[gpu.model][p.profile].compute for p in gpu.partitions)
    return 0.5 + 0.4 * used / COMPUTE


class MigConstraint:
    """A MIG pod's node constraint: its own (kube-scheduler's filters) and a node where a MIG
    GPU can give it the profile, preferred as :func:`preference` says."""

    def __init__(self, inner: NodeConstraint | None, profile: str, room: dict[str, float],
                 why: str, generation: int = 0, serving: bool = False) -> None:
        self.inner = inner
        self.profile = profile
        self.room = room
        self.why = why
        self.dynamic = bool(inner is not None and inner.dynamic)
        self._key = (inner, profile, generation, serving)
        self._hash = hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MigConstraint) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def allows(self, node: Node) -> bool:
        return node.name in self.room and (self.inner is None or self.inner.allows(node))

    def score(self, node: Node) -> float:
        base = self.inner.score(node) if self.inner is not None else 0.0
        return (base + self.room.get(node.name, 0.0)) / 2

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return self.inner is None or self.inner.admits(node, placed)

    def without_room(self) -> NodeConstraint | None:
        """The pod's own constraint, for the cycle's search that makes MIG room by eviction
        (tessera.core.constraints.without_room)."""
        return self.inner

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        out = [n for n in nodes if n.name not in self.room]
        rest = tuple(n for n in nodes if n.name in self.room)
        parts = [f"{len(out)} {self.why}"] if out else []
        if self.inner is not None and rest:
            more = self.inner.refusals(rest)
            if more:
                parts.append(more)
        return ", ".join(parts)
