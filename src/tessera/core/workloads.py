"""Workloads: a pod group of one project, with a priority class, a gang minimum and placements.

A workload is one or more pods (a distributed training job is several), each with its own
``ResourceRequest``. ``min_members`` pods must be placed together or none (a gang); pods above
the minimum are elastic and placed when they fit. A pod with a placement is running; a
workload with none is pending.

Priority classes follow Run:ai/KAI: ``train`` (50) is preemptible and may run over quota;
``build`` (100) and ``inference`` (125) are not preemptible, so they only use in-quota
resources and are never evicted. ``build-preemptible`` (75) is an interactive class that may
be evicted. A workload can override preemptibility.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera.core.constraints import NodeConstraint
from tessera.core.errors import InvalidRequest
from tessera.core.model import ResourceRequest
from tessera.core.state import Placement


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool


PRIORITY_CLASSES: Mapping[str, PriorityClass] = {
    pc.name: pc
    for pc in (
        PriorityClass("train", 50, True),
        PriorityClass("build-preemptible", 75, True),
        PriorityClass("build", 100, False),
        PriorityClass("interactive", 100, False),
        PriorityClass("inference", 125, False),
    )
}


def priority_class(name: str, field: str = "priority_class") -> PriorityClass:
    pc = PRIORITY_CLASSES.get(name)
    if pc is None:
        raise InvalidRequest(field, f"must be one of {', '.join(PRIORITY_CLASSES)}", name)
    return pc


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload as the adapter sees it at snapshot time.

    ``placements[i]`` is where pod ``i`` runs, or None while it waits. ``created_at`` and
    ``started_at`` are seconds on the same clock as ``Snapshot.now``.
    """

    id: str
    project: str
    pods: tuple[ResourceRequest, ...]
    priority_class: str = "train"
    min_members: int | None = None
    """Pods that must start together; None means all of them."""
    created_at: float = 0.0
    started_at: float | None = None
    placements: tuple[Placement | None, ...] = ()
    """Empty, or one entry per pod."""
    preemptible: bool | None = None
    """Overrides the class's preemptibility."""
    priority: int | None = None
    """Overrides the class's priority value."""
    name: str = ""
    constraints: tuple[NodeConstraint | None, ...] = ()
    """Empty, or one entry per pod: where that pod may run and which nodes it prefers
    (``tessera.core.constraints``); None means any node."""
    movable: bool = True
    """Consolidation may move its pods (the adapter can restart a pod elsewhere: on
    Kubernetes, a controller recreates an evicted pod; a bare pod cannot be moved)."""
    anchors: tuple[int, ...] = ()
    """Indexes of the pods the gang cannot run without (a Ray head, a Kubeflow Master, an
    elastic training's rendezvous host): it starts, and grows, only with every one of them
    placed, and shrink never gives one back (``tessera.core.cycle.anchors``)."""
    pod_names: tuple[str, ...] = ()
    """Empty, or one name per pod, for reasons that name a pod (else its index)."""

    @classmethod
    def gang(
        cls,
        id: str,
        project: str,
        request: ResourceRequest,
        size: int = 1,
        min_members: int | None = None,
        **kw: object,
    ) -> Workload:
        """``size`` identical pods (workers), of which ``min_members`` start together."""
        return cls(id, project, (request,) * size, min_members=min_members, **kw)  # type: ignore[arg-type]

    @property
    def gang_min(self) -> int:
        return len(self.pods) if self.min_members is None else self.min_members

    @property
    def cls(self) -> PriorityClass:
        return priority_class(self.priority_class)

    @property
    def is_preemptible(self) -> bool:
        return self.cls.preemptible if self.preemptible is None else self.preemptible

    @property
    def priority_value(self) -> int:
        return self.cls.value if self.priority is None else self.priority

    def pod_label(self, pod: int) -> str:
        """The pod's name in reasons: its ``pod_names`` entry, else ``<label> pod <index>``."""
        return self.pod_names[pod] if self.pod_names else f"{self.label} pod {pod}"

    def constraint_of(self, pod: int) -> NodeConstraint | None:
        return self.constraints[pod] if self.constraints else None

    def placement_of(self, pod: int) -> Placement | None:
        return self.placements[pod] if self.placements else None

    @property
    def running(self) -> bool:
        return self.placements.count(None) < len(self.placements)

    @property
    def label(self) -> str:
        return self.name or self.id

    def validate(self) -> None:
        field = f"workloads.{self.id}"
        if not isinstance(self.id, str) or not self.id:
            raise InvalidRequest("workloads.id", "must be a non-empty string", self.id)
        if not self.pods:
            raise InvalidRequest(f"{field}.pods", "must hold at least one pod")
        priority_class(self.priority_class, f"{field}.priority_class")
        if self.min_members is not None:
            if isinstance(self.min_members, bool) or not isinstance(self.min_members, int):
                raise InvalidRequest(f"{field}.min_members", "must be a whole number", self.min_members)
            if self.min_members < 1:
                raise InvalidRequest(f"{field}.min_members", "must be 1 or more", self.min_members)
            if self.min_members > len(self.pods):
                raise InvalidRequest(
                    f"{field}.min_members",
                    f"must not exceed the gang's size of {len(self.pods)} pods",
                    self.min_members,
                )
        if self.placements and len(self.placements) != len(self.pods):
            raise InvalidRequest(
                f"{field}.placements",
                f"must be empty or give one entry (or null) per pod ({len(self.pods)})",
                len(self.placements),
            )
        if self.constraints and len(self.constraints) != len(self.pods):
            raise InvalidRequest(
                f"{field}.constraints",
                f"must be empty or give one entry (or null) per pod ({len(self.pods)})",
                len(self.constraints),
            )
        if self.pod_names and len(self.pod_names) != len(self.pods):
            raise InvalidRequest(
                f"{field}.pod_names",
                f"must be empty or give one name per pod ({len(self.pods)})",
                len(self.pod_names),
            )
        for a in self.anchors:
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(self.pods):
                raise InvalidRequest(f"{field}.anchors",
                                     f"must be indexes of its pods (0 to {len(self.pods) - 1})", a)
        if len(set(self.anchors)) != len(self.anchors):
            raise InvalidRequest(f"{field}.anchors", "must not name a pod twice", self.anchors)
        if self.running and self.started_at is None:
            raise InvalidRequest(f"{field}.started_at", "is required for a running workload")
