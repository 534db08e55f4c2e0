"""A workload during one cycle (where its pods are now, what happened to it) and why one waits."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.fairshare import ZERO, Vector
from tessera.core.model import ResourceRequest
from tessera.core.state import Placement
from tessera.core.workloads import PRIORITY_CLASSES, Workload

from .anchors import anchors_first, failed_anchor, missing

PodPlacements = list[tuple[int, Placement]]

FIT = "\x00fit\x00"
"""Stands in a reason for why ``Wait.request`` does not fit, filled in from the final state."""


@dataclass(frozen=True, slots=True)
class Wait:
    kind: str
    reason: str
    request: ResourceRequest | None = None



class PlacementFacts:
    """What follows from a workload's placements: its unplaced pods and gang minimum left, and
    (filled in by their users) its gang's demand (``allocate.gang_demand``), its shape
    (``allocate.shape``) and its unplaced pods' demands (``QuotaLedger.unplaced_demands``).
    These depend on nothing else that changes within a session; ``WorkloadState.set_placement``
    drops the whole record."""

    __slots__ = ("demand", "required", "shape", "unplaced", "unplaced_demands")

    def __init__(self, ws: WorkloadState) -> None:
        placements = ws.placements
        spec = ws.spec
        out = [i for i, p in enumerate(placements) if p is None]
        if spec.anchors and out:  # anchors first (cycle.anchors)
            out = anchors_first(out, spec.anchors)
        self.unplaced = tuple(out)
        self.required = max(0, spec.gang_min - (len(placements) - len(out)))
        if spec.anchors:  # at least its anchors not placed
            self.required = max(self.required, len(missing(spec.anchors, placements)))
        self.demand: Vector | None = None
        self.shape: tuple[tuple[object, ...], int] | None = None
        self.unplaced_demands: tuple[Vector, ...] | None = None


class WorkloadState:
    """A workload during the cycle: where its pods are now and what happened to it."""

    __slots__ = (
        "_facts",
        "_vector",
        "bound",
        "chain",
        "evicted",
        "held",
        "id",
        "min_runtimes",
        "never",
        "placements",
        "pod_vectors",
        "preemptible",
        "priority",
        "project",
        "queue_key",
        "spec",
        "was_running",
    )

    def __init__(self, spec: Workload, chain: tuple[str, ...]) -> None:
        self.spec = spec
        self.id = spec.id
        self.chain = chain
        self.project = chain[0]
        pc = PRIORITY_CLASSES.get(spec.priority_class)
        if pc is None:  # refused by validation; the properties word it
            self.preemptible, self.priority = spec.is_preemptible, spec.priority_value
        else:  # what ``is_preemptible`` and ``priority_value`` give, without their calls
            self.preemptible = pc.preemptible if spec.preemptible is None else spec.preemptible
            self.priority = pc.value if spec.priority is None else spec.priority
        self.queue_key = (-self.priority, spec.created_at, spec.id)
        """Order within its project's queue: higher priority first, then older, then id."""
        n = len(spec.pods)
        snapshot = spec.placements
        self.placements: list[Placement | None] = list(snapshot) if snapshot else [None] * n
        self.pod_vectors: list[Vector | None] = [None] * n
        self.was_running = bool(snapshot) and snapshot.count(None) < len(snapshot)
        self.evicted = False
        self.bound: list[int] = []
        self._vector: Vector | None = None
        self._facts: PlacementFacts | None = None
        self.min_runtimes: tuple[float, float] | None = None
        """Its project's preempt and reclaim minimum runtimes (``Session.min_runtimes``)."""
        self.held: tuple[int, int, int] = (0, 0, 0)
        """Exact sums of its snapshot pods' quota (``QuotaLedger.enter``)."""
        self.never: tuple[tuple[int, ...], str | None] | None = None
        """(unplaced pods, why they can never be placed) when last asked (``Session``)."""

    def facts(self) -> PlacementFacts:
        """What follows from where its pods are now (kept until a placement changes)."""
        found = self._facts
        if found is None:
            found = self._facts = PlacementFacts(self)
        return found

    def unplaced(self) -> tuple[int, ...]:
        """Its pods not placed now, in the order they are tried: anchors first (cycle.anchors)."""
        found = self._facts
        if found is None:
            found = self._facts = PlacementFacts(self)
        return found.unplaced

    def set_placement(self, pod: int, p: Placement | None) -> None:
        """Every change of ``placements`` goes through here (it forgets what was derived)."""
        self.placements[pod] = p
        self._facts = None

    def placed_count(self) -> int:
        return len(self.placements) - len(self.unplaced())

    def required(self) -> int:
        """Pods that must start together now: the gang minimum less what already runs, and at
        least its anchors not placed (cycle.anchors)."""
        found = self._facts
        if found is None:
            found = self._facts = PlacementFacts(self)
        return found.required

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


def gang_reason(ws: WorkloadState, fitted: int, request: ResourceRequest | None) -> str:
    """Why the gang did not fit (``fitted`` of its required pods did); the placement part is
    filled in at the end of the cycle."""
    why = FIT if request is not None else "no room"
    anchor = failed_anchor(ws.spec.anchors, ws.placements, fitted) if ws.spec.anchors else None
    if anchor is not None:
        why = f"anchor pod {ws.spec.pod_label(anchor)} does not fit: {why}"
    required = ws.required()
    if required > 1:
        return f"waiting for {required - fitted} of {required} gang members to fit: {why}"
    return why


def pod_id(workload_id: str, pod: int) -> str:
    return f"{workload_id}#{pod}"
