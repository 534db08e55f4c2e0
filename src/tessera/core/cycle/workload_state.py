"""A workload during one cycle (where its pods are now, what happened to it) and why one waits."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.fairshare import ZERO, Vector
from tessera.core.model import ResourceRequest
from tessera.core.state import Placement
from tessera.core.workloads import Workload

from .anchors import anchors_first, missing

PodPlacements = list[tuple[int, Placement]]

FIT = "\x00fit\x00"
"""Stands in a reason for why ``Wait.request`` does not fit, filled in from the final state."""


@dataclass(frozen=True, slots=True)
class Wait:
    kind: str
    reason: str
    request: ResourceRequest | None = None



class WorkloadState:
    """A workload during the cycle: where its pods are now and what happened to it."""

    __slots__ = (
        "_vector",
        "bound",
        "chain",
        "evicted",
        "id",
        "min_runtimes",
        "placements",
        "pod_vectors",
        "preemptible",
        "priority",
        "project",
        "spec",
        "was_running",
    )

    def __init__(self, spec: Workload, chain: tuple[str, ...]) -> None:
        self.spec = spec
        self.id = spec.id
        self.chain = chain
        self.project = chain[0]
        self.preemptible = spec.is_preemptible
        self.priority = spec.priority_value
        n = len(spec.pods)
        self.placements: list[Placement | None] = list(spec.placements) if spec.placements else [None] * n
        self.pod_vectors: list[Vector | None] = [None] * n
        self.was_running = spec.running
        self.evicted = False
        self.bound: list[int] = []
        self._vector: Vector | None = None
        self.min_runtimes: tuple[float, float] | None = None
        """Its project's preempt and reclaim minimum runtimes (``Session.protected``)."""

    def unplaced(self) -> list[int]:
        """Its pods not placed now, in the order they are tried: anchors first (cycle.anchors)."""
        out = [i for i, p in enumerate(self.placements) if p is None]
        anchors = self.spec.anchors
        return anchors_first(out, anchors) if anchors and out else out

    def placed_count(self) -> int:
        return sum(1 for p in self.placements if p is not None)

    def required(self) -> int:
        """Pods that must start together now: the gang minimum less what already runs, and at
        least its anchors not placed (cycle.anchors)."""
        needed = max(0, self.spec.gang_min - self.placed_count())
        if self.spec.anchors:
            return max(needed, len(missing(self.spec.anchors, self.placements)))
        return needed

    def vector(self) -> Vector:
        """Quota its placed pods count as now."""
        total = self._vector
        if total is None:
            total = ZERO
            for v in self.pod_vectors:
                if v is not None:
                    total = (total[0] + v[0], total[1] + v[1], total[2] + v[2])
            self._vector = total
        return total


def pod_id(workload_id: str, pod: int) -> str:
    return f"{workload_id}#{pod}"
