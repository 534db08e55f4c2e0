"""One cycle's working state: the cluster, the workloads, the plan so far, and the Statement
transactions that change them. Quota accounting lives in ``quota`` (``session.quota``), the
plan's assembly and the waiting explanations in ``plan``, workload validation in ``validation``.

Actions change the session only through a ``Statement``: every change (assign, release,
eviction, binding) goes onto the cluster state's undo log and the session's own undo log, so
``discard()`` puts back exactly what was there and ``commit()`` keeps it. Statements nest.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tessera.core.constraints import NodeConstraint
from tessera.core.errors import InvalidRequest
from tessera.core.fairshare import Vector
from tessera.core.mig import MigChoice
from tessera.core.model import Node, ResourceRequest
from tessera.core.placement import NoFit, Placer
from tessera.core.projects import ProjectTree
from tessera.core.state import ClusterState, NodeState, Placement
from tessera.core.workloads import Workload

from .history import fair_shares
from .mig_state import MigState, live_room
from .pending import PendingIndex, pending_demand
from .quota import QuotaLedger, enter_all
from .types import CycleConfig, Eviction, Move, Snapshot
from .usable import movable_gpus, unusable_gpus
from .validation import validate_workload, validate_workloads
from .workload_state import FIT, PodPlacements, Wait, WorkloadState, pod_id

__all__ = ["FIT", "PodPlacements", "Session", "Statement", "Wait", "WorkloadState",
           "validate_workload"]


@dataclass
class _Bind:
    action: str
    pods: dict[int, Placement]
    message: str
    after: tuple[str, ...]


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
        validate_workloads(snapshot.workloads, self.tree)
        self.nodes: tuple[Node, ...] = tuple(snapshot.nodes)
        self.state = ClusterState(self.nodes)
        self._undo: list[Callable[[], None]] = []
        self._depth = 0
        self.mig_choices: dict[tuple[str, int], MigChoice] = {}
        """The partition each MIG pod bound in this cycle takes (``PodBinding.mig``)."""
        self.waits: dict[str, Wait] = {}
        self.bindings: dict[str, _Bind] = {}
        self.evictions: dict[str, Eviction] = {}
        self.moves: dict[tuple[str, int], Move] = {}
        self.moved: set[str] = set()
        self.pending: list[WorkloadState] = []
        self.waiting = PendingIndex(self.nodes)
        self.mig = MigState(snapshot.mig, {n.name for n in self.nodes}, self.on_undo)
        self.quota = QuotaLedger(self.tree, self.nodes, self.state)
        self.workloads: dict[str, WorkloadState] = {}
        specs = sorted(snapshot.workloads, key=lambda w: w.id)
        if not _add_all(self, specs):  # one by one: names the first placement that does not fit
            for spec in specs:
                self.add_workload(spec)
        self.placer = Placer(self.state, policy=config.policy)
        self.begin(snapshot)

    def add_workload(self, spec: Workload) -> None:
        """Put a workload of the snapshot into the session, its running pods on their nodes
        (quota is counted by ``begin``). The caller keeps ``workloads`` in id order."""
        spec = live_room(spec, self.mig)
        ws = WorkloadState(spec, self.tree.chain(spec.project))
        self.workloads[spec.id] = ws
        self.waiting.added(ws)
        for i, p in enumerate(ws.placements):
            if p is None:
                continue
            try:
                self.state.assign(pod_id(spec.id, i), p)
            except InvalidRequest as exc:
                raise InvalidRequest(f"workloads.{spec.id}.placements[{i}]", exc.rule) from None
            ws.pod_vectors[i] = self.quota.placement_vector(p)
        self.quota.held.enter(ws)

    def remove_workload(self, workload_id: str, keep_slot: bool = False) -> None:
        """Take a workload out (finished, gone, or changed: ``keep_slot``, added again next in
        its place of the id order): its pods leave their nodes (``begin`` counts quota)."""
        ws = self.workloads[workload_id] if keep_slot else self.workloads.pop(workload_id)
        self.waiting.removed(workload_id)
        self.quota.held.leave(ws)
        for i, p in enumerate(ws.placements):
            if p is not None:
                self.state.release(pod_id(workload_id, i))

    def begin(self, snapshot: Snapshot) -> None:
        """Start a cycle over the workloads as they are now: an empty plan, quota counted in
        workload id order, the pending list, the never-fits reasons and the fair shares. A
        session kept between cycles (``cycle.warm``) calls this again after applying changes."""
        config = self.config
        self.now = snapshot.now
        self._undo = []
        self._depth = 0
        self.mig_choices = {}
        self.waits = {}
        self.bindings = {}
        self.evictions = {}
        self.moves = {}
        self.moved = set()
        self.quota.recount()
        capacity = self.waiting.capacity(self.mig.gpu_count())
        self.pending = self.waiting.in_id_order()
        for ws in self.pending:
            if (why := self.waiting.never_fits(ws, self.placer, self.mig)) is not None:
                self.waits[ws.id] = Wait("unschedulable", why)
        # Fair share divides only capacity some pending request could use (cycle/usable.py).
        requested, gpus = pending_demand(self.quota, self.pending, self.waits)
        unusable = unusable_gpus(self.state, gpus, (
            lambda: movable_gpus(self.workloads.values(), self.state, self.evictable))
            if "consolidate" in config.actions else None)
        self.quota.share_out(fair_shares(self.tree, config.usage, self.workloads, self.quota, snapshot, capacity,
                                         requested, unusable))

    # -- changes (inside a Statement) -----------------------------------------------------------

    def assign_pod(self, ws: WorkloadState, pod: int, p: Placement, mig: MigChoice | None = None) -> None:
        """Place a pod. A pending MIG pod also takes its partition: ``mig`` where the caller
        chose it (room made by eviction), else what ``choose`` gives on that node now."""
        self.state.assign(pod_id(ws.id, pod), p)
        ws.set_placement(pod, p)
        self.quota.account(ws, pod, p, +1)
        key = (ws.id, pod)
        profile = ws.spec.pods[pod].mig
        if profile is not None and ws.spec.placement_of(pod) is None:
            if mig is None:
                mig = self.mig.choose(p.node, profile)
            if mig is not None:
                self.mig.hold(p.node, profile, mig, ws.id)
                self.mig_choices[key] = mig

        def undo() -> None:
            self.quota.account(ws, pod, None, -1)
            ws.set_placement(pod, None)
            self.mig_choices.pop(key, None)

        self._undo.append(undo)

    def release_pod(self, ws: WorkloadState, pod: int) -> Placement:
        p = self.state.release(pod_id(ws.id, pod))
        self.quota.account(ws, pod, None, -1)
        ws.set_placement(pod, None)

        def undo() -> None:
            ws.set_placement(pod, p)
            self.quota.account(ws, pod, p, +1)

        self._undo.append(undo)
        return p

    def evict(self, ws: WorkloadState, action: str, reason: str, for_workload: str) -> None:
        gpus = ws.vector()[0]
        for i, p in enumerate(ws.placements):
            if p is not None:
                self.release_pod(ws, i)
        ws.evicted = True
        self.mig.release(ws.id)
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
        if not self.mig.can_restore(ws.id):
            return False  # its MIG partition went to the pod it was evicted for
        stmt = Statement(self)
        self.mig.restore(ws.id)
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
        p = self.state.allocations.get(pod_id(workload_id, pod))
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
        """Place the workload's unplaced pods: the gang's ``required`` together or none (its
        anchors first: one that does not fit ends the attempt, cycle.anchors), then as many
        elastic ones as fit and ``extra_ok`` allows. Assigns inside the caller's statement.

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
            if len(placed) >= required and extra_ok is not None and not extra_ok(self.quota.demand(request)):
                continue
            if constraint is None:
                found = self.placer.place(request, explain=False)
            else:
                found = self.placer.place(request, explain=False, constraint=constraint, placed=self)
            if isinstance(found, NoFit):
                failed.add((request, constraint))
                if first_fail is None:
                    first_fail = request
                if spec.anchors and i in spec.anchors:
                    break  # the gang cannot start without it (cycle.anchors)
                continue
            self.assign_pod(ws, i, found)
            placed.append((i, found))
        if len(placed) < required or not placed:
            stmt.discard()
            return [], first_fail, len(placed)
        stmt.commit()
        return placed, first_fail, len(placed)

    def wait_kind(self, ws: WorkloadState) -> str:
        """The kind of the last reason given for ``ws`` waiting ("" if none)."""
        wait = self.waits.get(ws.id)
        return "" if wait is None else wait.kind

    def waiting_after(self, kinds: Collection[str]) -> list[WorkloadState]:
        """Pending workloads whose gang still needs pods and that were last told they wait for
        one of ``kinds``: those an eviction or a move could help."""
        waits = self.waits  # the reason's kind first (one dict look-up: most are out)
        return [ws for ws in self.pending if (w := waits.get(ws.id)) is not None and w.kind in kinds
                and ws.unplaced() and ws.required() > 0]

    def evictable(self, ws: WorkloadState, kind: str) -> bool:
        """Running, preemptible, not evicted or given a binding or move in this plan, and past
        its minimum runtime for ``kind`` (``reclaim`` or ``preempt``)."""
        return (ws.was_running and ws.preemptible and not ws.evicted and not self.settled(ws)
                and not self.protected(ws, kind))

    def settled(self, ws: WorkloadState) -> bool:
        """Already given a binding or a move in this plan: not to be evicted or moved again."""
        return ws.id in self.bindings or ws.id in self.moved

    def protected(self, ws: WorkloadState, kind: str) -> bool:
        """Minimum runtime: a workload that started less than that long ago is not evicted."""
        minimums = ws.min_runtimes or self.min_runtimes(ws)
        minimum = minimums[0] if kind == "preempt" else minimums[1]
        started = ws.spec.started_at
        return minimum > 0 and started is not None and self.now - started < minimum

    def min_runtimes(self, ws: WorkloadState) -> tuple[float, float]:
        """Its project's preempt and reclaim minimum runtimes, kept on the workload while the
        session is (tree and config fixed)."""
        if ws.min_runtimes is None:
            config = self.config
            ws.min_runtimes = (
                self.tree.min_runtime(ws.project, "preempt", config.preempt_min_runtime),
                self.tree.min_runtime(ws.project, "reclaim", config.reclaim_min_runtime))
        return ws.min_runtimes

    def where(self, placed: PodPlacements) -> str:
        parts = []
        for _, p in placed:
            devs = ",".join(str(d) for d in p.devices)
            parts.append(f"{p.node} GPU {devs}" if devs else p.node)
        return "; ".join(dict.fromkeys(parts))


def _add_all(session: Session, specs: Sequence[Workload]) -> bool:
    """``add_workload`` for every workload of a new session, their pods put on the nodes
    in one ``ClusterState.load``; False (nothing added) where a placement does not fit.
    The same steps in the same order, made in three passes (states and their pods, the load,
    then quota vectors and sums: ``quota.enter_all``) instead of a call per pod."""
    chain, mig = session.tree.chain, session.mig
    states: list[WorkloadState] = []
    items: list[tuple[str, Placement]] = []
    item = items.append
    for spec in specs:
        ws = WorkloadState(live_room(spec, mig), chain(spec.project))
        states.append(ws)
        if ws.was_running:  # (a pending workload has no placement)
            wid = ws.id
            for i, p in enumerate(ws.placements):
                if p is not None:
                    item((f"{wid}#{i}", p))  # pod_id(wid, i)
    if not session.state.load(items):
        return False
    workloads, added = session.workloads, session.waiting.added
    for ws in states:
        workloads[ws.id] = ws
        added(ws)
    enter_all(session.quota, states)
    return True
