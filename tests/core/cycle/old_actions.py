"""preempt and consolidate as they were before their fast paths (main at 2026-11-28 10:00):
the reference ``test_actions_same`` compares the actions against."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tessera.core.cycle.actions.allocate import Shape, gang_demand, shape
from tessera.core.cycle.mig_room import bind_in_room, find_room, mig_pod, where_mig
from tessera.core.cycle.session import PodPlacements, Session, Statement, WorkloadState
from tessera.core.cycle.victims import (
    NodeIndex,
    Tentative,
    cheapest_node,
    drop_needless,
    evict_until_fits,
)
from tessera.core.fairshare import Vector
from tessera.core.placement import NoFit
from tessera.core.state import Placement

_TRIES = ("placement", "limit", "quota", "fair-share")


class OldPreempt:
    name = "preempt"

    def execute(self, session: Session) -> None:
        waiting = session.waiting_after(_TRIES)
        if not waiting:
            return
        by_project: dict[str, list[WorkloadState]] = {}
        for v in session.workloads.values():
            if session.evictable(v, "preempt"):
                by_project.setdefault(v.project, []).append(v)
        for group in by_project.values():
            group.sort(key=lambda v: (v.priority, -(v.spec.started_at or 0.0), v.id))
        # The victims for one (project, priority below) change only when one of them is
        # evicted, put back or settled: the node index is rebuilt only then (a failed attempt
        # leaves them as they were), not once per waiting workload.
        cache: dict[tuple[str, int], tuple[list[WorkloadState], list[NodeIndex]]] = {}
        # The victim list itself changes only when the plan does (every kept attempt records a
        # binding, evictions and moves; a discarded one leaves nothing): filtered again only then.
        lists: dict[tuple[str, int], tuple[object, list[WorkloadState]]] = {}
        for ws in session.quota.fair_order(w for w in waiting if w.project in by_project):
            if not ws.unplaced():
                continue
            key = (ws.project, ws.priority)
            token = _plan_token(session)
            listed = lists.get(key)
            if listed is not None and listed[0] == token:
                victims = listed[1]
            else:
                victims = [
                    v
                    for v in by_project[ws.project]
                    if v.priority < ws.priority and not v.evicted and not session.settled(v)
                ]
                lists[key] = (token, victims)
            found = cache.get(key)
            if found is None or len(found[0]) != len(victims) or any(
                    a is not b for a, b in zip(found[0], victims, strict=True)):
                found = cache[key] = (victims, [])
            if found[0]:
                self._try(session, ws, found[0], _lazy(found))

    def _try(self, session: Session, ws: WorkloadState, victims: list[WorkloadState],
             index: Callable[[], NodeIndex]) -> bool:
        """``index``: gives ``NodeIndex(victims)`` (built on first use: most attempts place
        without a node search), used as it is when no victim is taken for quota."""
        caps: dict[str, Vector] = {}
        for name in ws.chain:
            a, share = session.quota.alloc[name], session.quota.shares.share[name]
            caps[name] = (max(a[0], share[0]), max(a[1], share[1]), max(a[2], share[2]))
        demand = gang_demand(session, ws)

        def evict(v: WorkloadState) -> None:
            session.evict(
                v,
                "preempt",
                f"preempted by {ws.spec.label} (priority {ws.priority} > {v.priority}) in project {ws.project}",
                ws.id,
            )

        stmt = Statement(session)
        evicted: list[WorkloadState] = []
        queue = list(victims)
        while (why := session.quota.check(ws, demand, fair_caps=caps)) is not None:
            if not queue or why.kind == "quota":
                # Deserved quota for non-preemptible work is held by non-preemptible work,
                # which is never evicted: taking preemptible victims cannot help.
                stmt.discard()
                return False
            v = queue.pop(0)
            evict(v)
            evicted.append(v)

        def allow(v: WorkloadState, tentative: Tentative) -> bool:
            return v.project == ws.project and v.priority < ws.priority

        def extra_ok(d: Vector) -> bool:
            return session.quota.check(ws, d, fair_caps=caps) is None

        result: tuple[PodPlacements, list[WorkloadState]] | None
        is_mig = mig_pod(ws) is not None
        if is_mig:
            # A MIG pod: the victims whose partitions make room for its profile (mig_room).
            found = find_room(session, ws, queue, allow)
            result = None if found is None else bind_in_room(session, ws, *found, evict)
        else:
            result = evict_until_fits(session, ws, index if not evicted else partial(NodeIndex, queue), allow,
                                      evict, extra_ok, 4 * ws.required() + 4)
        if result is None:
            stmt.discard()
            return False
        placed, more = result

        def ok() -> bool:
            return session.quota.within(ws.chain, caps)

        # MIG room victims are each needed (make_room); the quota victims may be put back.
        kept = drop_needless(session, evicted, ok) + more if is_mig else \
            drop_needless(session, evicted + more, ok)
        where = where_mig(session, ws, placed) if is_mig else session.where(placed)
        message = f"placed on {where} by preempting {', '.join(v.id for v in kept) or 'nobody'}"
        session.record_binding(ws, placed, "preempt", message, [v.id for v in kept])
        stmt.commit()
        return True


def _lazy(found: tuple[list[WorkloadState], list[NodeIndex]]) -> Callable[[], NodeIndex]:
    """The cached entry's node index, built the first time it is asked for and kept there (so
    its pruning carries over to the next attempt, as when it was built eagerly)."""
    def get() -> NodeIndex:
        if not found[1]:
            found[1].append(NodeIndex(found[0]))
        return found[1][0]
    return get


def _plan_token(session: Session) -> object:
    """Changes whenever the plan does within this action (see ``execute``)."""
    return (len(session.bindings), len(session.evictions), len(session.moved))


class OldConsolidate:
    name = "consolidate"

    def execute(self, session: Session) -> None:
        waiting = session.waiting_after(("placement",))
        if not waiting or session.config.max_moves <= 0:
            return
        movable = [
            v
            for v in session.workloads.values()
            if v.spec.movable and session.evictable(v, "preempt") and all(r.gpu.shared for r in v.spec.pods)
        ]
        if not movable:
            return
        movable.sort(key=lambda v: (v.vector()[0], v.id))
        index = NodeIndex(movable)
        failed: set[Shape] = set()
        for ws in session.quota.fair_order(waiting):
            key = shape(ws)
            if key in failed or not ws.unplaced():
                continue
            if session.quota.check(ws, gang_demand(session, ws)) is not None:
                continue
            if not self._try(session, ws, index):
                failed.add(key)

    def _try(self, session: Session, ws: WorkloadState, index: NodeIndex) -> bool:
        def allow(v: WorkloadState, tentative: Tentative) -> bool:
            return True

        def extra_ok(d: Vector) -> bool:
            return session.quota.check(ws, d) is None

        stmt = Statement(session)
        moved: list[tuple[WorkloadState, int, Placement]] = []
        placed = None
        for _ in range(4 * ws.required() + 4):
            placed, fail, _fitted = session.place_pods(ws, extra_ok)
            if placed or fail is None:
                break
            pairs = cheapest_node(
                session, fail, index, allow, pod_level=True, constraint=session.constraint_for(ws, fail)
            )
            if not pairs or len(moved) + len(pairs) > session.config.max_moves:
                break
            for v, i in pairs:  # type: ignore[misc]
                moved.append((v, i, session.release_pod(v, i)))
        if not placed:
            stmt.discard()
            return False
        for v, i, _source in moved:
            found = session.placer.place(
                v.spec.pods[i], explain=False, constraint=v.spec.constraint_of(i), placed=session
            )
            if isinstance(found, NoFit):
                stmt.discard()
                return False
            session.assign_pod(v, i, found)
        for v, i, source in moved:
            target = v.placements[i]
            assert target is not None
            session.record_move(v, i, source, target, f"moved to make room for {ws.spec.label}")
        message = f"placed on {session.where(placed)} after consolidating {len(moved)} pod(s)"
        session.record_binding(ws, placed, "consolidate", message)
        stmt.commit()
        return True
