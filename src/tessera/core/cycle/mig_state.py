"""The MIG GPUs during one cycle (``Snapshot.mig``): which partition each running workload
holds, followed through the session's changes so that reclaim and preemption can make MIG
room by eviction (``tessera.core.mig.make_room``, docs/mig.md).

An eviction makes the evicted workload's partitions idle; a MIG pod bound in the cycle holds
the partition :func:`tessera.core.mig.choose` gives it (recorded in the plan as
``PodBinding.mig``, so the adapter makes what the cycle decided); a victim put back holds its
partitions again if they are still there. Every change is undone with the session's statement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from tessera.core.constraints import NodeConstraint, PlacedPods, without_room
from tessera.core.errors import InvalidRequest
from tessera.core.mig import PROFILES, MigChoice, MigGpu, Partition, choose
from tessera.core.model import Node
from tessera.core.workloads import Workload


class MigState:
    """Per node, its MIG GPUs as :func:`choose` sees them now."""

    def __init__(self, nodes: Mapping[str, tuple[MigGpu, ...]], known: set[str],
                 on_undo: Callable[[Callable[[], None]], None]) -> None:
        self.nodes: dict[str, list[MigGpu]] = {}
        for node, gpus in sorted(nodes.items()):
            if node not in known:
                raise InvalidRequest(f"mig.{node}", "names a node that is not in the snapshot")
            seen: set[str] = set()
            for g in gpus:
                if g.model not in PROFILES:
                    raise InvalidRequest(f"mig.{node}.{g.key}", "is not a MIG model tessera knows",
                                         g.model)
                if g.key in seen:
                    raise InvalidRequest(f"mig.{node}.{g.key}", "names a GPU twice on the node")
                seen.add(g.key)
            self.nodes[node] = list(gpus)
        self.released: dict[str, list[tuple[str, int, Partition]]] = {}
        """Evicted workload -> (node, GPU index, its busy partition as it was)."""
        self._on_undo = on_undo

    def gpu_count(self) -> int:
        return sum(len(g) for g in self.nodes.values())

    def holders(self) -> set[str]:
        return {p.holder for gs in self.nodes.values() for g in gs for p in g.partitions
                if p.busy and p.holder}

    def _set(self, node: str, i: int, gpu: MigGpu) -> None:
        gpus = self.nodes[node]
        old = gpus[i]
        gpus[i] = gpu

        def undo() -> None:
            gpus[i] = old

        self._on_undo(undo)

    def release(self, workload: str) -> None:
        """``workload`` was evicted: its partitions become idle (they stay until needed)."""
        gone: list[tuple[str, int, Partition]] = []
        for node, gpus in self.nodes.items():
            for i, g in enumerate(gpus):
                mine = [p for p in g.partitions if p.busy and p.holder == workload]
                if not mine:
                    continue
                gone += [(node, i, p) for p in mine]
                self._set(node, i, MigGpu(g.key, g.model, tuple(
                    Partition(p.profile, p.start, False, p.uuid) if p in mine else p
                    for p in g.partitions)))
        if gone:
            self.released[workload] = gone

            def undo() -> None:
                self.released.pop(workload, None)

            self._on_undo(undo)

    def can_restore(self, workload: str) -> bool:
        """Its idle partitions are all still there (not reused or removed for another pod)."""
        for node, i, p in self.released.get(workload, ()):
            idle = Partition(p.profile, p.start, False, p.uuid)
            if idle not in self.nodes[node][i].partitions:
                return False
        return True

    def restore(self, workload: str) -> None:
        """An eviction undone: it holds its partitions again (``can_restore`` first)."""
        gone = self.released.pop(workload, None)
        if gone is None:
            return
        for node, i, p in gone:
            g = self.nodes[node][i]
            idle = Partition(p.profile, p.start, False, p.uuid)
            self._set(node, i, MigGpu(g.key, g.model, tuple(
                p if q == idle else q for q in g.partitions)))

        def undo() -> None:
            self.released[workload] = gone

        self._on_undo(undo)

    def choose(self, node: str, profile: str) -> MigChoice | None:
        gpus = self.nodes.get(node)
        return choose(gpus, profile) if gpus else None

    def hold(self, node: str, profile: str, choice: MigChoice, workload: str) -> None:
        """A MIG pod of ``workload`` takes the partition ``choice`` says on ``node``."""
        gpus = self.nodes[node]
        i = next(k for k, g in enumerate(gpus) if g.key == choice.gpu)
        g = gpus[i]
        gone = set(choice.destroy)
        parts = [p for p in g.partitions if p not in gone and p != choice.reuse]
        parts.append(Partition(profile, choice.start, True,
                               choice.reuse.uuid if choice.reuse else "", workload))
        self._set(node, i, MigGpu(g.key, g.model, tuple(sorted(parts, key=lambda p: p.start))))


class LiveRoom:
    """A pending MIG pod's constraint in the cycle: the adapter's (``inner``; it may say where
    there was room when the snapshot was taken) and, asked at each placement, room for the
    profile on the node's MIG GPUs as the cycle has left them so far, so that two MIG pods
    placed in one cycle never take the same room."""

    dynamic = True

    def __init__(self, inner: NodeConstraint | None, profile: str, state: MigState) -> None:
        self.inner = inner
        self.profile = profile
        self.state = state
        self._key = (inner, profile)
        self._hash = hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LiveRoom) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def allows(self, node: Node) -> bool:
        return node.name in self.state.nodes and (self.inner is None or self.inner.allows(node))

    def score(self, node: Node) -> float:
        return 0.0 if self.inner is None else self.inner.score(node)

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        if self.inner is not None and self.inner.dynamic and not self.inner.admits(node, placed):
            return False
        return self.state.choose(node.name, self.profile) is not None

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        if self.inner is not None:
            return self.inner.refusals(nodes)
        n = sum(1 for x in nodes if x.name not in self.state.nodes)
        return f"{n} no GPU in MIG mode" if n else ""

    def without_room(self) -> NodeConstraint | None:
        return without_room(self.inner)


def live_room(spec: Workload, mig: MigState) -> Workload:
    """A pending MIG pod goes only where the cycle's MIG state has room for its profile
    (``LiveRoom`` around the adapter's constraint)."""
    for r in spec.pods:  # (a plain loop: no generator frame per workload)
        if r.mig is not None:
            break
    else:
        return spec
    constraints: list[NodeConstraint | None] = []
    for i, r in enumerate(spec.pods):
        c = spec.constraint_of(i)
        constraints.append(c if r.mig is None or spec.placement_of(i) is not None
                           else LiveRoom(c, r.mig, mig))
    return replace(spec, constraints=tuple(constraints))
