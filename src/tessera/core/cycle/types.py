"""The cycle's input (a snapshot, plain data) and output (a plan): the adapters' contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.core.fairshare import Vector
from tessera.core.mig import MigChoice, MigGpu
from tessera.core.model import Node
from tessera.core.placement import DEFAULT_POLICY
from tessera.core.projects import Project
from tessera.core.state import Placement
from tessera.core.usage import UsagePolicy, UsageRecord
from tessera.core.workloads import Workload

DEFAULT_ACTIONS = ("allocate", "consolidate", "shrink", "reclaim", "preempt", "backfill")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle looks at. ``now`` is seconds on the clock of ``Workload.started_at``."""

    nodes: tuple[Node, ...]
    projects: tuple[Project, ...]
    workloads: tuple[Workload, ...]
    now: float = 0.0
    mig: Mapping[str, tuple[MigGpu, ...]] = field(default_factory=dict)
    """Node -> its GPUs in MIG mode and their partitions, each busy one naming the workload
    holding it (``Partition.holder``): reclaim and preemption make room for a pending MIG pod
    (``ResourceRequest.mig``) by evicting holders (tessera.core.mig.make_room)."""
    usage: tuple[UsageRecord, ...] = ()
    """GPUs held in the past (finished workloads, earlier runs), for time-based fair share
    (``CycleConfig.usage``); running workloads count from ``started_at`` without a record."""


@dataclass(frozen=True, slots=True)
class CycleConfig:
    actions: tuple[str, ...] = DEFAULT_ACTIONS
    """Run in this order; any subset of allocate, consolidate, reclaim, preempt, backfill."""
    policy: str = DEFAULT_POLICY
    """Placement policy (see ``tessera.core.placement``)."""
    preempt_min_runtime: float = 0.0
    """Seconds a workload runs before priority preemption or consolidation may touch it,
    unless its project (or an ancestor) says otherwise."""
    reclaim_min_runtime: float = 0.0
    """Seconds a workload runs before reclaim may evict it, unless its project says otherwise."""
    max_victim_nodes: int = 64
    """Nodes examined per eviction or move decision (the search budget)."""
    max_moves: int = 8
    """Pods consolidation may move to make room for one pending workload."""
    usage: UsagePolicy | None = None
    """Time-based fair share (``tessera.core.usage``): window, half-life and weight of usage
    history; None: plain fair share. Projects may override window and half-life."""


@dataclass(frozen=True, slots=True)
class PodBinding:
    pod: int
    """Index into ``Workload.pods``."""
    placement: Placement
    """Node, device indices and bytes on each device (request and burst limit)."""
    mig: MigChoice | None = None
    """A MIG pod's partition: the GPU and slot, an idle one reused or idle ones removed first
    (``tessera.core.mig.choose`` over ``Snapshot.mig`` as this cycle left it)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """Start these pods of a workload here.

    ``after_evictions`` names the workloads evicted in this plan whose resources this binding
    uses: an adapter starts the pods only once those are gone.
    """

    workload_id: str
    project: str
    action: str
    pods: tuple[PodBinding, ...]
    message: str
    after_evictions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Eviction:
    workload_id: str
    project: str
    action: str
    reason: str
    gpus: float
    """GPUs it gives back (quota units)."""
    for_workload: str
    pods: tuple[int, ...] = ()
    """Empty: the whole workload. Else only these pods (indexes into ``Workload.pods``): an
    elastic workload shrunk towards its minimum (action ``shrink``), which keeps running."""


@dataclass(frozen=True, slots=True)
class Move:
    """Consolidation: restart one pod of a running workload at ``target``."""

    workload_id: str
    pod: int
    source: Placement
    target: Placement
    reason: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a pending workload (or the unplaced pods of a running one) still waits.

    ``kind``: ``limit`` (project or an ancestor at its hard limit), ``quota`` (a
    non-preemptible workload would go beyond deserved quota), ``fair-share`` (over its project's
    fair share and no idle room), ``placement`` (no room, and no eviction or move could make
    room within the rules), ``unschedulable`` (no node could ever hold it).
    """

    workload_id: str
    project: str
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class ProjectStatus:
    """Per project, amounts as (GPUs, CPU millicores, memory bytes); inf where ungoverned."""

    name: str
    fair_share: Vector
    requested: Vector
    allocated_before: Vector
    allocated_after: Vector
    from_usage: float = 0.0
    """GPUs of ``fair_share`` due to usage history (negative: taken away because the project
    used more than its weight's share); 0 without time-based fair share."""
    usage: float = 0.0
    """Its decayed GPU-seconds (``tessera.core.usage``); 0 without time-based fair share."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one cycle. Evictions and moves come before the bindings that need them."""

    bindings: tuple[Binding, ...]
    evictions: tuple[Eviction, ...]
    moves: tuple[Move, ...]
    waiting: tuple[Waiting, ...]
    projects: Mapping[str, ProjectStatus]
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)
    """Seconds per action; not part of plan equality."""

    def binding(self, workload_id: str) -> Binding | None:
        return next((b for b in self.bindings if b.workload_id == workload_id), None)

    def waiting_for(self, workload_id: str) -> Waiting | None:
        return next((w for w in self.waiting if w.workload_id == workload_id), None)

    @property
    def evicted(self) -> tuple[str, ...]:
        return tuple(e.workload_id for e in self.evictions)
