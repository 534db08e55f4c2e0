"""One cycle's working state: the cluster, quota accounting, fair shares and the plan so far.

Actions change the session only through a ``Statement``: every change (assign, release,
eviction, binding) goes onto the cluster state's undo log and the session's own undo log, so
``discard()`` puts back exactly what was there and ``commit()`` keeps it. Statements nest.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from tessera.core.constraints import NodeConstraint
from tessera.core.errors import InvalidRequest
from tessera.core.fairshare import EPS, ZERO, FairShares, Vector, compute_fair_shares
from tessera.core.model import GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement import NoFit, Placer
from tessera.core.projects import ProjectTree, Resource
from tessera.core.requests import check_against_cluster
from tessera.core.state import ClusterState, NodeState, Placement
from tessera.core.units import format_bytes, format_gpus
from tessera.core.workloads import Workload

from .explain import FitExplainer
from .types import (
    Binding,
    CycleConfig,
    Eviction,
    Move,
    PodBinding,
    ProjectStatus,
    Snapshot,
    Waiting,
)

PodPlacements = list[tuple[int, Placement]]


def fmt_amount(resource: Resource, amount: float) -> str:
    if resource is Resource.GPU:
        return f"{format_gpus(amount)} GPU{'' if abs(amount) <= 1 + EPS else 's'}"
    if resource is Resource.CPU:
        return f"{amount / 1000:g} CPU"
    return f"{format_bytes(amount)} of memory"


class WorkloadState:
    """A workload during the cycle: where its pods are now and what happened to it."""

    __slots__ = (
        "_vector",
        "bound",
        "chain",
        "evicted",
        "id",
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

    def unplaced(self) -> list[int]:
        return [i for i, p in enumerate(self.placements) if p is None]

    def placed_count(self) -> int:
        return sum(1 for p in self.placements if p is not None)

    def required(self) -> int:
        """Pods that must start together now: the gang minimum less what already runs."""
        return max(0, self.spec.gang_min - self.placed_count())

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


@dataclass
class _Bind:
    action: str
    pods: dict[int, Placement]
    message: str
    after: tuple[str, ...]


FIT = "\x00fit\x00"
"""Stands in a reason for why ``Wait.request`` does not fit, filled in from the final state."""


@dataclass(frozen=True, slots=True)
class Wait:
    kind: str
    reason: str
    request: ResourceRequest | None = None


class Statement:
    """A transaction over the session (KAI's Statement): commit or discard as one."""

    __slots__ = ("_done", "_mark", "_session", "_undo_mark")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._mark = session.state.checkpoint()
        self._undo_mark = len(session._undo)
        self._done = False
        session._depth += 1

    def commit(self) -> None:
        s = self._session
        self._finish()
        s.state.commit(self._mark)
        if s._depth == 0:
            s._undo.clear()

    def discard(self) -> None:
        s = self._session
        self._finish()
        s.state.rollback(self._mark)
        undo = s._undo
        while len(undo) > self._undo_mark:
            undo.pop()()

    def _finish(self) -> None:
        if self._done:
            raise RuntimeError("statement already committed or discarded")
        self._done = True
        self._session._depth -= 1


class Session:
    def __init__(self, snapshot: Snapshot, config: CycleConfig) -> None:
        self.config = config
        self.now = snapshot.now
        self.tree = ProjectTree(snapshot.projects)
        _validate_workloads(snapshot.workloads, self.tree)
        self.nodes: tuple[Node, ...] = tuple(snapshot.nodes)
        self.state = ClusterState(self.nodes)
        self._undo: list[Callable[[], None]] = []
        self._depth = 0
        self.alloc: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in self.tree.order}
        self.alloc_np: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in self.tree.order}
        self.deserved: dict[str, Vector] = {
            name: (p.gpu.deserved_amount, p.quota(Resource.CPU).deserved_amount, p.quota(Resource.MEMORY).deserved_amount)
            for name, p in self.tree.projects.items()
        }
        self.workloads: dict[str, WorkloadState] = {}
        self._demand: dict[ResourceRequest, Vector] = {}
        self._never: dict[GpuRequest, str | None] = {}
        self.waits: dict[str, Wait] = {}
        self.bindings: dict[str, _Bind] = {}
        self.evictions: dict[str, Eviction] = {}
        self.moves: dict[tuple[str, int], Move] = {}
        self.moved: set[str] = set()
        for spec in sorted(snapshot.workloads, key=lambda w: w.id):
            ws = WorkloadState(spec, self.tree.chain(spec.project))
            self.workloads[spec.id] = ws
            for i, p in enumerate(ws.placements):
                if p is None:
                    continue
                try:
                    self.state.assign(_pod_id(spec.id, i), p)
                except InvalidRequest as exc:
                    raise InvalidRequest(f"workloads.{spec.id}.placements[{i}]", exc.rule) from None
                self._account(ws, i, p, +1)
        self.allocated_before = {p: _vec(v) for p, v in self.alloc.items()}
        capacity: Vector = (
            float(sum(len(n.gpus) for n in self.nodes)),
            float(sum(n.cpu_milli for n in self.nodes)),
            float(sum(n.memory for n in self.nodes)),
        )
        self.pending: list[WorkloadState] = [ws for ws in self.workloads.values() if ws.unplaced()]
        self.placer = Placer(self.state, policy=config.policy)
        self._max_host = (
            max((n.cpu_milli for n in self.nodes), default=0),
            max((n.memory for n in self.nodes), default=0),
        )
        for ws in self.pending:
            why = self._never_fits(ws)
            if why is not None:
                self.waits[ws.id] = Wait("unschedulable", why)
        requested: dict[str, Vector] = {p: _vec(v) for p, v in self.alloc.items()}
        for ws in self.pending:
            if ws.id in self.waits:
                continue  # what can never run does not take a share from those that can
            for i in ws.unplaced():
                d = self.demand(ws.spec.pods[i])
                r = requested[ws.project]
                requested[ws.project] = (r[0] + d[0], r[1] + d[1], r[2] + d[2])
        self.shares: FairShares = compute_fair_shares(self.tree, capacity, requested)

    # -- quota ----------------------------------------------------------------------------------

    def demand(self, request: ResourceRequest) -> Vector:
        """Quota a pending pod counts as. A memory request counts as its share of the smallest
        device (of an allowed model) that can hold it, which is the most it can cost; KAI used
        the smallest device in the cluster even when it could not hold the request (#1847)."""
        d = self._demand.get(request)
        if d is None:
            gpu = request.gpu
            gpus = 0.0
            if gpu.kind is GpuKind.MEMORY:
                assert gpu.memory is not None
                sizes = [
                    g.memory for n in self.nodes for g in n.gpus if gpu.allows(g.model) and g.memory >= gpu.memory
                ]
                gpus = gpu.gpus_on(min(sizes)) if sizes else float(gpu.devices)
            elif gpu.kind is not GpuKind.NONE:
                gpus = gpu.gpus_on(1)
            d = (gpus, float(request.cpu_milli), float(request.memory))
            self._demand[request] = d
        return d

    def placement_vector(self, p: Placement) -> Vector:
        if p.exclusive:
            gpus = float(len(p.devices))
        else:
            memory = self.state.by_name[p.node].dev_memory
            gpus = sum(b / memory[i] for i, b in zip(p.devices, p.request_bytes, strict=True))
        return (gpus, float(p.cpu_milli), float(p.memory))

    def _account(self, ws: WorkloadState, pod: int, p: Placement | None, sign: int) -> None:
        ws._vector = None
        if sign > 0:
            assert p is not None
            v = self.placement_vector(p)
            ws.pod_vectors[pod] = v
        else:
            old = ws.pod_vectors[pod]
            assert old is not None
            v = old
            ws.pod_vectors[pod] = None
        targets = [self.alloc] if ws.preemptible else [self.alloc, self.alloc_np]
        for table in targets:
            for name in ws.chain:
                a = table[name]
                a[0] += sign * v[0]
                a[1] += sign * v[1]
                a[2] += sign * v[2]

    def shortfall(self, project: str) -> float:
        """GPUs the project is below its fair share (0 if at or above)."""
        return max(0.0, self.shares.gpu(project) - self.alloc[project][0])

    def quota_check(
        self,
        ws: WorkloadState,
        demand: Vector,
        *,
        fair: bool = True,
        fair_caps: dict[str, Vector] | None = None,
    ) -> Wait | None:
        """Why ``demand`` more for this workload breaks a quota rule, or None.

        Checked on the project and each ancestor: the hard limit; for a non-preemptible
        workload, deserved quota (it may only use in-quota resources); and, when ``fair``,
        the fair share (or ``fair_caps`` where given, used by preemption).
        """
        tree = self.tree
        resources = tree.governed
        for name in ws.chain:
            project = tree[name]
            level = "project" if tree.is_leaf(name) else "department"
            a = self.alloc[name]
            for r in resources:
                if demand[r] <= 0:
                    continue
                limit = project.quota(r).limit_amount
                if a[r] + demand[r] > limit + EPS:
                    return Wait(
                        "limit",
                        f"{level} {name} is at its limit of {fmt_amount(r, limit)}: "
                        f"{_num(r, a[r])} in use, this needs {_num(r, demand[r])} more",
                    )
        if not ws.preemptible:
            for name in ws.chain:
                a = self.alloc_np[name]
                for r in resources:
                    deserved = tree[name].quota(r).deserved_amount
                    if demand[r] > 0 and a[r] + demand[r] > deserved + EPS:
                        return Wait(
                            "quota",
                            f"non-preemptible ({ws.spec.priority_class}) workloads only use "
                            f"deserved quota: {name} has {_num(r, a[r])} of its "
                            f"{fmt_amount(r, deserved)} deserved in non-preemptible use, "
                            f"this needs {_num(r, demand[r])} more",
                        )
        if fair:
            for name in ws.chain:
                a = self.alloc[name]
                caps = self.shares.share[name] if fair_caps is None else fair_caps[name]
                for r in resources:
                    over = a[r] + demand[r] - caps[r]
                    if demand[r] > 0 and over > EPS:
                        return Wait("fair-share", f"would exceed fair share of {name} by {fmt_amount(r, over)}")
        return None

    def project_key(self, leaf: str) -> tuple[tuple[float, int, str], ...]:
        """Fair order: at each level from the top, the least saturated (allocated ÷ fair share)
        first, then higher priority, then name."""
        key = []
        for name in reversed(self.tree.chain(leaf)):
            share = self.shares.share[name][0]
            alloc = self.alloc[name][0]
            ratio = alloc / share if share > EPS else math.inf
            key.append((ratio, -self.tree[name].priority, name))
        return tuple(key)

    def fair_order(self, workloads: Iterable[WorkloadState]) -> Iterator[WorkloadState]:
        """Workloads by project fair order, recomputed as allocations change; within a project
        by priority (higher first), then age (older first), then id."""
        per: dict[str, deque[WorkloadState]] = {}
        for ws in sorted(workloads, key=lambda w: (-w.priority, w.spec.created_at, w.id)):
            per.setdefault(ws.project, deque()).append(ws)
        heap = [(self.project_key(p), p) for p in sorted(per)]
        heapq.heapify(heap)
        while heap:
            key, p = heapq.heappop(heap)
            fresh = self.project_key(p)
            if fresh != key:
                heapq.heappush(heap, (fresh, p))
                continue
            queue = per[p]
            yield queue.popleft()
            if queue:
                heapq.heappush(heap, (self.project_key(p), p))

    # -- changes (inside a Statement) -----------------------------------------------------------

    def assign_pod(self, ws: WorkloadState, pod: int, p: Placement) -> None:
        self.state.assign(_pod_id(ws.id, pod), p)
        ws.placements[pod] = p
        self._account(ws, pod, p, +1)

        def undo() -> None:
            self._account(ws, pod, None, -1)
            ws.placements[pod] = None

        self._undo.append(undo)

    def release_pod(self, ws: WorkloadState, pod: int) -> Placement:
        p = self.state.release(_pod_id(ws.id, pod))
        self._account(ws, pod, None, -1)
        ws.placements[pod] = None

        def undo() -> None:
            ws.placements[pod] = p
            self._account(ws, pod, p, +1)

        self._undo.append(undo)
        return p

    def evict(self, ws: WorkloadState, action: str, reason: str, for_workload: str) -> None:
        gpus = ws.vector()[0]
        for i, p in enumerate(ws.placements):
            if p is not None:
                self.release_pod(ws, i)
        ws.evicted = True
        self.evictions[ws.id] = Eviction(ws.id, ws.project, action, reason, gpus, for_workload)

        def undo() -> None:
            ws.evicted = False
            del self.evictions[ws.id]

        self._undo.append(undo)

    def restore(self, ws: WorkloadState) -> bool:
        """Undo an eviction if every pod fits back where it was (used to drop needless victims)."""
        placements = ws.spec.placements
        if any(p is not None and self.state.fits(p) is not None for p in placements):
            return False
        stmt = Statement(self)
        for i, p in enumerate(placements):
            if p is None:
                continue
            if self.state.fits(p) is not None:
                stmt.discard()
                return False
            self.assign_pod(ws, i, p)
        ws.evicted = False
        old = self.evictions.pop(ws.id)

        def undo() -> None:
            ws.evicted = True
            self.evictions[ws.id] = old

        self._undo.append(undo)
        stmt.commit()
        return True

    def record_binding(
        self,
        ws: WorkloadState,
        placed: PodPlacements,
        action: str,
        message: str,
        after: Sequence[str] = (),
    ) -> None:
        previous = self.bindings.get(ws.id)
        pods = dict(previous.pods) if previous else {}
        pods.update(placed)
        merged_after = tuple(dict.fromkeys([*(previous.after if previous else ()), *after]))
        self.bindings[ws.id] = _Bind(previous.action if previous else action, pods, message, merged_after)
        bound_before = list(ws.bound)
        ws.bound.extend(i for i, _ in placed)
        wait = self.waits.pop(ws.id, None)

        def undo() -> None:
            if previous is None:
                del self.bindings[ws.id]
            else:
                self.bindings[ws.id] = previous
            ws.bound[:] = bound_before
            if wait is not None:
                self.waits[ws.id] = wait

        self._undo.append(undo)

    def record_move(self, ws: WorkloadState, pod: int, source: Placement, target: Placement, reason: str) -> None:
        """A pod moves; moved twice in one plan, it is one move from where it ran at snapshot."""
        key = (ws.id, pod)
        previous = self.moves.get(key)
        if previous is not None:
            source = previous.source
        if (source.node, source.devices) == (target.node, target.devices):
            self.moves.pop(key, None)
        else:
            self.moves[key] = Move(ws.id, pod, source, target, reason)
        first = ws.id not in self.moved
        self.moved.add(ws.id)

        def undo() -> None:
            if previous is None:
                self.moves.pop(key, None)
            else:
                self.moves[key] = previous
            if first:
                self.moved.discard(ws.id)

        self._undo.append(undo)

    def on_undo(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` if the enclosing statement is discarded."""
        if self._depth:
            self._undo.append(undo)

    def wait(self, ws: WorkloadState, wait: Wait) -> None:
        """Outside statements only: the reason a workload still waits (the latest one wins)."""
        self.waits[ws.id] = wait

    # -- placing pods ----------------------------------------------------------------------------

    def node_of(self, workload_id: str, pod: int) -> str | None:
        """``PlacedPods`` for dynamic constraints: where that pod is at this moment."""
        p = self.state.allocations.get(_pod_id(workload_id, pod))
        return None if p is None else p.node

    def constraint_for(self, ws: WorkloadState, request: ResourceRequest) -> NodeConstraint | None:
        """The constraint of the first unplaced pod of ``ws`` asking ``request``."""
        spec = ws.spec
        if not spec.constraints:
            return None
        for i in ws.unplaced():
            if spec.pods[i] == request:
                return spec.constraints[i]
        return None

    def node_allowed(self, constraint: NodeConstraint | None, ns: NodeState) -> bool:
        """May a pod with this constraint use this node now (static and dynamic filter)?"""
        if constraint is None:
            return True
        if not self.placer.static(constraint)[0][ns.index]:
            return False
        return not constraint.dynamic or constraint.admits(ns.node, self)

    def place_pods(
        self,
        ws: WorkloadState,
        extra_ok: Callable[[Vector], bool] | None = None,
    ) -> tuple[PodPlacements, ResourceRequest | None, int]:
        """Place the workload's unplaced pods: the gang's ``required`` together or none, then as
        many elastic ones as fit and ``extra_ok`` allows. Assigns inside the caller's statement.

        Returns the pods placed (empty if the gang did not fit), the first request that did not
        fit, and how many pods fitted before the gang was given up.
        """
        required = ws.required()
        placed: PodPlacements = []
        failed: set[tuple[ResourceRequest, NodeConstraint | None]] = set()
        first_fail: ResourceRequest | None = None
        stmt = Statement(self)
        spec = ws.spec
        for i in ws.unplaced():
            request = spec.pods[i]
            constraint = spec.constraints[i] if spec.constraints else None
            if (request, constraint) in failed:
                if len(placed) < required:
                    break
                continue
            if len(placed) >= required and extra_ok is not None and not extra_ok(self.demand(request)):
                continue
            if constraint is None:
                found = self.placer.place(request, explain=False)
            else:
                found = self.placer.place(request, explain=False, constraint=constraint, placed=self)
            if isinstance(found, NoFit):
                failed.add((request, constraint))
                if first_fail is None:
                    first_fail = request
                continue
            self.assign_pod(ws, i, found)
            placed.append((i, found))
        if len(placed) < required or not placed:
            stmt.discard()
            return [], first_fail, len(placed)
        stmt.commit()
        return placed, first_fail, len(placed)

    def gang_reason(self, ws: WorkloadState, fitted: int, request: ResourceRequest | None) -> str:
        """Why the gang did not fit; the placement part is filled in at the end of the cycle."""
        why = FIT if request is not None else "no room"
        required = ws.required()
        if required > 1:
            return f"waiting for {required - fitted} of {required} gang members to fit: {why}"
        return why

    def settled(self, ws: WorkloadState) -> bool:
        """Already given a binding or a move in this plan: not to be evicted or moved again."""
        return ws.id in self.bindings or ws.id in self.moved

    def protected(self, ws: WorkloadState, kind: str) -> bool:
        """Minimum runtime: a workload that started less than that long ago is not evicted."""
        default = self.config.preempt_min_runtime if kind == "preempt" else self.config.reclaim_min_runtime
        minimum = self.tree.min_runtime(ws.project, kind, default)
        started = ws.spec.started_at
        return minimum > 0 and started is not None and self.now - started < minimum

    def within(self, chain: Sequence[str], caps: dict[str, Vector] | None) -> bool:
        """Every project of ``chain`` is within its limit (and ``caps`` where given)."""
        for name in chain:
            a = self.alloc[name]
            project = self.tree[name]
            for r in self.tree.governed:
                cap = project.quota(r).limit_amount
                if caps is not None:
                    cap = min(cap, caps[name][r])
                if a[r] > cap + EPS:
                    return False
        return True

    def where(self, placed: PodPlacements) -> str:
        parts = []
        for _, p in placed:
            devs = ",".join(str(d) for d in p.devices)
            parts.append(f"{p.node} GPU {devs}" if devs else p.node)
        return "; ".join(dict.fromkeys(parts))

    def over_quota_note(self, ws: WorkloadState) -> str:
        deserved = self.tree[ws.project].gpu.deserved_amount
        if self.alloc[ws.project][0] > deserved + EPS:
            return f" (project {ws.project} is over its deserved quota: preemptible, may be reclaimed)"
        return ""

    def _never_fits(self, ws: WorkloadState) -> str | None:
        cpu, memory = self._max_host
        for i in ws.unplaced()[: max(ws.required(), 1)]:
            request = ws.spec.pods[i]
            constraint = ws.spec.constraint_of(i)
            if constraint is not None and not any(self.placer.static(constraint)[0]):
                refused = constraint.refusals(self.nodes)
                return f"0/{len(self.nodes)} nodes are available: {refused or 'no node is allowed'}"
            if request.cpu_milli > cpu:
                return f"no node can ever hold it: it asks {request.cpu_milli / 1000:g} CPU, the largest node has {cpu / 1000:g}"
            if request.memory > memory:
                return (
                    f"no node can ever hold it: it asks {format_bytes(request.memory)} of memory, "
                    f"the largest node has {format_bytes(memory)}"
                )
            gpu = request.gpu
            if gpu not in self._never:
                try:
                    check_against_cluster(gpu, self.nodes)
                    self._never[gpu] = None
                except InvalidRequest as exc:
                    self._never[gpu] = f"no node can ever hold it: {exc}"
            why = self._never[gpu]
            if why is not None:
                return why
        return None

    # -- output ----------------------------------------------------------------------------------

    def plan_parts(
        self,
    ) -> tuple[tuple[Binding, ...], tuple[Eviction, ...], tuple[Move, ...], tuple[Waiting, ...], dict[str, ProjectStatus]]:
        bindings = tuple(
            Binding(
                wid,
                self.workloads[wid].project,
                b.action,
                tuple(PodBinding(i, p) for i, p in sorted(b.pods.items())),
                b.message,
                b.after,
            )
            for wid, b in self.bindings.items()
        )
        evictions = tuple(self.evictions.values())
        moves = tuple(self.moves.values())
        waiting = []
        explainer = FitExplainer(self.state)
        explainers: dict[NodeConstraint, tuple[FitExplainer, str]] = {}
        for ws in self.pending:
            if not ws.unplaced():
                continue
            wait = self.waits.get(ws.id) or Wait("placement", "not tried this cycle")
            reason = wait.reason
            if wait.request is not None and FIT in reason:
                constraint = self.constraint_for(ws, wait.request)
                if constraint is None:
                    reason = reason.replace(FIT, explainer.explain(wait.request))
                else:
                    found = explainers.get(constraint)
                    if found is None:
                        allowed = self.placer.static(constraint)[0]
                        subset = [ns for ns in self.state.nodes if allowed[ns.index]]
                        refused = constraint.refusals(self.nodes)
                        head = f"0/{len(self.nodes)} nodes are available: {refused}; " if refused else ""
                        found = explainers[constraint] = (
                            FitExplainer(self.state, subset),
                            f"{head}on the {len(subset)} node(s) it may use: ",
                        )
                    reason = reason.replace(FIT, found[1] + found[0].explain(wait.request))
            waiting.append(Waiting(ws.id, ws.project, wait.kind, _elastic_prefix(ws, reason)))
        projects = {
            name: ProjectStatus(
                name,
                self.shares.share[name],
                self.shares.requested[name],
                self.allocated_before[name],
                _vec(self.alloc[name]),
            )
            for name in self.tree.order
        }
        return bindings, evictions, moves, tuple(waiting), projects


def _elastic_prefix(ws: WorkloadState, reason: str) -> str:
    if ws.placed_count() and ws.placed_count() >= ws.spec.gang_min:
        return f"{len(ws.unplaced())} elastic pod(s) wait: {reason}"
    return reason


def _num(resource: Resource, amount: float) -> str:
    if resource is Resource.GPU:
        return format_gpus(amount)
    if resource is Resource.CPU:
        return f"{amount / 1000:g}"
    return format_bytes(amount)


def _vec(v: Sequence[float]) -> Vector:
    return (v[0], v[1], v[2])


def _pod_id(workload_id: str, pod: int) -> str:
    return f"{workload_id}#{pod}"


def validate_workload(w: Workload, tree: ProjectTree) -> None:
    """Refuse a workload the cycle would refuse (adapters call this at submission)."""
    w.validate()
    if w.project not in tree:
        raise InvalidRequest(f"workloads.{w.id}.project", "names a project that does not exist", w.project)
    if not tree.is_leaf(w.project):
        raise InvalidRequest(
            f"workloads.{w.id}.project",
            "names a department (a project with child projects); only leaf projects hold workloads",
            w.project,
        )


def _validate_workloads(workloads: Iterable[Workload], tree: ProjectTree) -> None:
    seen: set[str] = set()
    for w in workloads:
        if w.id in seen:
            raise InvalidRequest(f"workloads.{w.id}", "is given twice; workload ids must be unique")
        seen.add(w.id)
        validate_workload(w, tree)
