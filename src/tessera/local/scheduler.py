"""What runs where: a snapshot of the machine in, decisions out.

The control loop builds a ``Snapshot`` (nodes, projects, running and pending workloads) and asks
a ``Scheduler`` for ``Decisions`` (bindings, evictions and why each other workload waits). It
knows nothing else about the scheduler.

``CycleScheduler`` (the default) is the projects/fair-share cycle of ``tessera.core.cycle``:
allocate, reclaim, preempt and backfill, with fair share of over-quota GPUs by weight.
Consolidation is left out because it moves running pods, which a local process cannot do.

``QuotaScheduler`` (``--scheduler simple``) is the interim policy written before the cycle: pending workloads in order (project priority, workload
priority, submission), placed by ``tessera.core.placement.Placer``; a project never exceeds its
GPU limit; non-preemptible workloads (build, inference) must fit in the project's deserved
quota; preemptible ones (train) may run over quota on idle GPUs; and a workload within its
project's deserved quota that does not fit reclaims GPUs from over-quota preemptible workloads of
other projects (lowest project priority, newest first). There is no fair-share division of
over-quota GPUs by weight and no priority preemption inside a project yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.core.model import GpuKind, Node, ResourceRequest
from tessera.core.placement import NoFit, Placer
from tessera.core.state import ClusterState, Placement

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ProjectView:
    name: str
    deserved: float
    limit: float | None = None
    over_quota_weight: float = 1.0
    priority: int = 50


@dataclass(frozen=True, slots=True)
class WorkloadView:
    id: str
    name: str
    project: str
    request: ResourceRequest
    workers: int = 1
    min_workers: int = 1
    preemptible: bool = True
    priority: int = 50
    seq: int = 0
    placements: tuple[Placement, ...] = ()
    """Where its pods run (running workloads only)."""
    priority_class: str = "train"
    created_at: float = 0.0
    started_at: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]
    projects: Mapping[str, ProjectView]
    running: Sequence[WorkloadView]
    pending: Sequence[WorkloadView]


@dataclass(frozen=True, slots=True)
class Binding:
    workload_id: str
    placements: tuple[Placement, ...]
    message: str


@dataclass(frozen=True, slots=True)
class Eviction:
    workload_id: str
    reason: str


@dataclass
class Decisions:
    bindings: list[Binding] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    """Why each pending workload that was not bound still waits."""
    after_evictions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pending workloads that start once these evicted workloads have stopped."""


class Scheduler(Protocol):
    name: str

    def decide(self, snapshot: Snapshot) -> Decisions: ...


def placement_gpus(state: ClusterState, p: Placement) -> float:
    """GPUs a placement counts as for quota: whole devices, or the share of each device."""
    if p.exclusive:
        return float(len(p.devices))
    memory = state.by_name[p.node].dev_memory
    return sum(b / memory[i] for i, b in zip(p.devices, p.request_bytes, strict=True))


def estimate_gpus(nodes: Sequence[Node], request: ResourceRequest, workers: int) -> float:
    gpu = request.gpu
    if gpu.kind is GpuKind.NONE:
        return 0.0
    sizes = [g.memory for n in nodes for g in n.gpus if gpu.allows(g.model)]
    return gpu.gpus_on(max(sizes, default=1)) * workers


class QuotaScheduler:
    name = "ordered placement with project quota (interim, until the fair-share cycle)"

    def __init__(self, policy: str = "fgd") -> None:
        self.policy = policy

    def decide(self, snapshot: Snapshot) -> Decisions:
        state = ClusterState(snapshot.nodes)
        placer = Placer(state, policy=self.policy)
        usage: dict[str, float] = {name: 0.0 for name in snapshot.projects}
        owned: dict[str, float] = {}
        for w in snapshot.running:
            gpus = 0.0
            for i, pl in enumerate(w.placements):
                state.assign(f"{w.id}/{i}", pl)
                gpus += placement_gpus(state, pl)
            owned[w.id] = gpus
            usage[w.project] = usage.get(w.project, 0.0) + gpus
        out = Decisions()
        evicted: set[str] = set()
        nofit: dict[tuple[ResourceRequest, int], str] = {}

        def project(name: str) -> ProjectView:
            return snapshot.projects.get(name) or ProjectView(name, 0.0)

        def order(w: WorkloadView) -> tuple[bool, int, int, int]:
            p = project(w.project)
            return (usage.get(w.project, 0.0) >= p.deserved - _EPS, -p.priority, -w.priority, w.seq)

        for w in sorted(snapshot.pending, key=order):
            p = project(w.project)
            used = usage.get(w.project, 0.0)
            estimate = estimate_gpus(snapshot.nodes, w.request, w.workers)
            if p.limit is not None and used + estimate > p.limit + _EPS:
                out.waiting[w.id] = (
                    f"project {p.name} is at its limit: {used:.2f} of {p.limit:g} GPUs allocated, "
                    f"this asks {estimate:.2f}"
                )
                continue
            in_quota = used + estimate <= p.deserved + _EPS
            if not w.preemptible and not in_quota:
                out.waiting[w.id] = (
                    f"non-preemptible workloads must fit in project {p.name}'s deserved quota: "
                    f"{used:.2f} of {p.deserved:g} GPUs allocated, this asks {estimate:.2f}"
                    " (submit it as preemptible, priority train, to run over quota)"
                )
                continue
            key = (w.request, w.workers)
            if key in nofit and not in_quota:
                out.waiting[w.id] = nofit[key]
                continue
            mark = state.checkpoint()
            placed = self._place(state, placer, w)
            victims: list[WorkloadView] = []
            if isinstance(placed, NoFit) and in_quota:
                victims, placed = self._reclaim(
                    state, placer, snapshot, w, usage, owned, evicted, placed
                )
            if isinstance(placed, NoFit):
                state.rollback(mark)
                nofit[key] = placed.reason
                out.waiting[w.id] = placed.reason
                continue
            state.commit(mark)
            nofit.clear()
            for v in victims:
                evicted.add(v.id)
                usage[v.project] -= owned[v.id]
                out.evictions.append(
                    Eviction(
                        v.id,
                        f"reclaimed: project {v.project} is over its deserved quota and project "
                        f"{p.name} needs its share for {w.name}",
                    )
                )
            gpus = sum(placement_gpus(state, pl) for pl in placed)
            usage[w.project] = used + gpus
            over = used + gpus > p.deserved + _EPS
            note = " (over quota: may be reclaimed)" if over else ""
            out.bindings.append(Binding(w.id, placed, f"placed on {_where(placed)}{note}"))
        placer.close()
        return out

    @staticmethod
    def _place(
        state: ClusterState, placer: Placer, w: WorkloadView
    ) -> tuple[Placement, ...] | NoFit:
        """Place up to ``workers`` pods, all or at least ``min_workers`` (gang), else nothing."""
        placed: list[Placement] = []
        reason = ""
        for i in range(w.workers):
            found = placer.place(w.request)
            if isinstance(found, NoFit):
                reason = found.reason
                break
            state.assign(f"{w.id}/{i}", found)
            placed.append(found)
        if len(placed) >= w.min_workers:
            return tuple(placed)
        for i in range(len(placed)):
            state.release(f"{w.id}/{i}")
        if w.workers > 1:
            reason = f"gang of {w.min_workers} pods does not fit: {reason}"
        return NoFit(reason)

    def _reclaim(
        self,
        state: ClusterState,
        placer: Placer,
        snapshot: Snapshot,
        w: WorkloadView,
        usage: dict[str, float],
        owned: dict[str, float],
        evicted: set[str],
        nofit: NoFit,
    ) -> tuple[list[WorkloadView], tuple[Placement, ...] | NoFit]:
        projects = snapshot.projects
        candidates = [
            v
            for v in snapshot.running
            if v.preemptible and v.project != w.project and v.id not in evicted
            and usage.get(v.project, 0.0) > projects.get(v.project, ProjectView(v.project, 0)).deserved + _EPS
        ]
        candidates.sort(key=lambda v: (projects.get(v.project, ProjectView("", 0)).priority, -v.seq))
        taken: list[WorkloadView] = []
        left = dict(usage)
        for v in candidates:
            deserved = projects.get(v.project, ProjectView(v.project, 0)).deserved
            if left[v.project] - owned[v.id] < deserved - _EPS:
                continue
            for i in range(len(v.placements)):
                state.release(f"{v.id}/{i}")
            left[v.project] -= owned[v.id]
            taken.append(v)
            placed = self._place(state, placer, w)
            if not isinstance(placed, NoFit):
                return taken, placed
        return [], nofit


def _where(placements: Sequence[Placement]) -> str:
    parts = []
    for p in placements:
        devs = ",".join(str(d) for d in p.devices)
        parts.append(f"{p.node} GPU {devs}" if devs else p.node)
    return "; ".join(parts)


class CycleScheduler:
    """The core's projects/fair-share cycle behind the ``Scheduler`` interface."""

    name = "tessera.core.cycle (fair share, reclaim, priority preemption)"

    def __init__(self, policy: str = "fgd") -> None:
        self.name = f"{CycleScheduler.name}; placement policy {policy}"
        from tessera.core.cycle import CycleConfig

        self.config = CycleConfig(
            actions=("allocate", "reclaim", "preempt", "backfill"), policy=policy
        )

    def decide(self, snapshot: Snapshot) -> Decisions:
        import time

        from tessera.core.cycle import Project, Quota, run_cycle
        from tessera.core.cycle import Snapshot as CycleSnapshot
        from tessera.core.cycle import Workload as CycleWorkload

        projects = tuple(
            Project(p.name, gpu=Quota(p.deserved, p.limit, p.over_quota_weight), priority=p.priority)
            for p in snapshot.projects.values()
        )
        now = time.time()
        workloads: list[CycleWorkload] = []
        for w, running in [(w, True) for w in snapshot.running] + [
            (w, False) for w in snapshot.pending
        ]:
            placements: tuple[Placement | None, ...] = ()
            if running:
                placements = tuple(w.placements) + (None,) * (w.workers - len(w.placements))
            workloads.append(
                CycleWorkload(
                    id=w.id,
                    project=w.project,
                    pods=(w.request,) * w.workers,
                    priority_class=w.priority_class,
                    min_members=w.min_workers,
                    created_at=w.created_at,
                    started_at=(w.started_at or now) if running else None,
                    placements=placements,
                    preemptible=w.preemptible,
                    priority=w.priority,
                    name=w.name,
                )
            )
        plan = run_cycle(CycleSnapshot((*snapshot.nodes,), projects, tuple(workloads), now), self.config)
        pending = {w.id for w in snapshot.pending}
        out = Decisions()
        for e in plan.evictions:
            out.evictions.append(Eviction(e.workload_id, e.reason))
        for b in plan.bindings:
            if b.workload_id not in pending:
                continue
            if b.after_evictions:
                names = {w.id: w.name for w in snapshot.running}
                victims = ", ".join(names.get(v, v) for v in b.after_evictions)
                out.waiting[b.workload_id] = f"waiting for {victims} to stop: {b.message}"
                out.after_evictions[b.workload_id] = tuple(b.after_evictions)
                continue
            pods = sorted(b.pods, key=lambda pb: pb.pod)
            out.bindings.append(Binding(b.workload_id, tuple(pb.placement for pb in pods), b.message))
        for wait in plan.waiting:
            if wait.workload_id in pending and wait.workload_id not in out.waiting:
                out.waiting[wait.workload_id] = wait.reason
        return out
