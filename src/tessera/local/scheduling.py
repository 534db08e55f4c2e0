"""Embedded mode's scheduling: the store's projects and workloads as the core's types, and the
core's cycle over them.

This is the only translation embedded mode makes: a stored ``Workload`` becomes a
``tessera.core.cycle.Workload`` (its running pods' placements included) and the ``Plan`` that
``WarmCycle.run`` returns (``run_cycle``'s plan, with the session kept between cycles) is
applied as it is by the control loop, as the Kubernetes adapter does.
Consolidation is left out of the actions because it moves running pods, which a local process
cannot do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from tessera.core.compute import ComputeShare
from tessera.core.constraints import NodeConstraint
from tessera.core.cycle import (
    CycleConfig,
    Plan,
    Project,
    ProjectStatus,
    Quota,
    Snapshot,
    Waiting,
    WarmCycle,
    Workload,
)
from tessera.core.mig import MigGpu
from tessera.core.model import GpuRequest, Node, ResourceRequest
from tessera.core.requests import gpu_request_from_dict
from tessera.core.state import Placement
from tessera.core.usage_history import UsageHistory
from tessera.local import store
from tessera.local.departments import DepartmentTree
from tessera.local.records import Phase, PodRecord
from tessera.local.usage_history_store import HistoryRow

ACTIONS = ("allocate", "shrink", "reclaim", "preempt", "backfill")
"""The cycle's actions in embedded mode (no consolidate: a process cannot be moved; shrink
stops single pods of an elastic workload, tessera.local.elastic)."""


def core_project(p: store.Project) -> Project:
    return Project(p.name, gpu=Quota(p.deserved, p.limit, p.over_quota_weight), priority=p.priority)


def pod_placement(pod: PodRecord) -> Placement:
    """Where a stored pod runs (the pod record written by the control loop when it started)."""
    return Placement(
        node=pod["node"],
        devices=tuple(pod["devices"]),
        request_bytes=tuple(pod["requestBytes"]),
        limit_bytes=tuple(pod["limitBytes"]),
        exclusive=pod["exclusive"],
        gpus=float(pod["mig"]["fraction"]) if pod.get("mig") else None,
        compute=int(pod.get("compute", 0)),
    )


def _with_compute(gpu: GpuRequest, share: dict[str, object] | None) -> GpuRequest:
    """The GPU request with its compute request (``Control.compute``, tessera.core.compute),
    which placement keeps within 1 per device."""
    if not share or gpu.compute is not None:
        return gpu
    return dataclasses.replace(gpu, compute=ComputeShare.from_dict(share).request)


def core_workload(w: store.Workload, placements: Sequence[Placement] | None, now: float,
                  mig: NodeConstraint | None = None,
                  served: tuple[str, float] | None = None, free: int | None = None) -> Workload:
    """A stored workload as the cycle sees it: pending (``placements`` None) or running on
    ``placements``. One that is already stopping is not preemptible (it is going anyway). A
    MIG workload asks its profile's fraction (``ResourceRequest.mig``); pending, ``mig`` is
    where it may go (``tessera.local.mig.RoomNow``). ``served``: a pending share asked as the
    profile that would serve it, and its fraction (``tessera.local.mig_serving``). ``free``:
    a running elastic workload that may resize, and how many more pods it may grow by
    (tessera.local.elastic); None: it runs as a gang of the pods that run."""
    running = placements is not None
    profile = w.control.mig_profile
    gpus = w.gpus_requested
    device = w.control.mig_device if running and not profile else None
    if device:  # a share served by a partition (docs/mig.md): counted and evicted as its profile
        profile, gpus = device["profile"], float(device["fraction"])
    elif served is not None and not running:
        profile, gpus = served
    request = ResourceRequest(_with_compute(gpu_request_from_dict(w.request), w.control.compute)) if not profile \
        else ResourceRequest(GpuRequest.none(), gpus=gpus, mig=profile)
    # A running workload that cannot resize (fixed world size, docs/scheduling.md) is a gang of
    # the pods that run; an elastic one keeps its minimum and may grow by ``free`` pods.
    size = w.workers if placements is None else len(placements) + (free or 0)
    gang = w.min_workers if not running else None if free is None else min(w.min_workers, len(placements or ()))
    return Workload(
        id=w.id,
        project=w.project_name,
        pods=(request,) * size,
        constraints=(mig,) * w.workers if mig is not None and not running else (),
        priority_class=w.priority_class,
        min_members=gang,
        created_at=w.created,
        started_at=(w.started or now) if running else None,
        placements=(*placements, *(None,) * (free or 0)) if placements is not None else (),
        preemptible=w.preemptible and (not running or w.phase == Phase.RUNNING),
        priority=w.priority,
        name=w.name,
    )


class LocalCycle:
    """The core's projects/fair-share cycle with embedded mode's actions and placement policy."""

    def __init__(self, policy: str = "fgd", tenancy_db: Path | None = None,
                 history: UsageHistory | None = None, history_db: Path | None = None) -> None:
        """``tenancy_db``: the API's tenancy store, whose departments go above their projects
        (tessera.local.departments). ``history``: time-based fair share
        (``--fair-share-history``, tessera.core.usage_history); None: plain fair share.
        ``history_db``: the store it is kept in across restarts (tessera.local.usage_history_store)."""
        self.history = history or UsageHistory(None)
        self.kept = None if history_db is None else HistoryRow(history_db, self.history)
        if self.kept is not None:
            self.kept.load()
        self.config = CycleConfig(actions=ACTIONS, policy=policy, usage=self.history.policy)
        self.warm = WarmCycle(self.config)
        """The session kept between cycles (tessera.core.cycle.warm): same plans as run_cycle."""
        self.statuses: dict[str, ProjectStatus] = {}
        """Each project's status after the last cycle (fair share, of which from usage history)."""
        self.tree: Callable[[tuple[Project, ...]], tuple[Project, ...]] = (
            (lambda projects: projects) if tenancy_db is None else DepartmentTree(tenancy_db))
        self.name = ("tessera.core.cycle (fair share, reclaim, priority preemption); "
                     f"placement policy {policy}")

    def run(self, nodes: Iterable[Node], projects: Iterable[store.Project],
            workloads: Iterable[Workload], now: float,
            mig: Mapping[str, tuple[MigGpu, ...]] | None = None) -> Plan:
        """``mig``: the machine's GPUs in MIG mode and their partitions (``Snapshot.mig``)."""
        snapshot = Snapshot(tuple(nodes), self.tree(tuple(core_project(p) for p in projects)),
                            tuple(workloads), now, dict(mig or {}))
        plan = self.warm.run(self.history.apply(snapshot), self.config)
        self.statuses = dict(plan.projects)
        if self.kept is not None:
            self.kept.save(now)
        return plan

    def observe(self, nodes: Iterable[Node], workloads: Iterable[Workload], now: float) -> None:
        """A control cycle that ran no scheduling cycle: the usage history still sees it."""
        if self.history.policy is not None:
            self.history.observe(tuple(workloads), tuple(nodes), now)
            if self.kept is not None:
                self.kept.save(now)

    def close(self) -> None:
        """The server stops: write the usage history now."""
        if self.kept is not None:
            self.kept.close()


def refused(pending: Iterable[Workload], reason: str) -> Plan:
    """A plan that binds nothing and tells every pending workload ``reason`` (the cycle refused
    the machine's state as a whole)."""
    waits = tuple(Waiting(w.id, w.project, "unschedulable", reason) for w in pending)
    return Plan((), (), (), waits, {})
