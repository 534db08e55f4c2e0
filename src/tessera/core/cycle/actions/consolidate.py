"""consolidate: move running fractional workloads so that a waiting one fits (defragmentation).

For a waiting workload that its project's rules allow but that finds no room, pods of
preemptible, fractional workloads (every pod a GPU portion or memory request) that have run
their preemption minimum runtime are taken off the node where moving the fewest GPUs makes
room; the waiting workload is placed; then every moved pod must be placed again elsewhere. If
any moved pod cannot be re-placed, or more than ``max_moves`` pods would move, nothing happens.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tessera.core.cycle.kept_groups import KeptGroups
from tessera.core.cycle.kept_running import kept_running
from tessera.core.cycle.session import Session, Statement, WorkloadState
from tessera.core.cycle.victims import NodeIndex, Tentative, cheapest_node
from tessera.core.fairshare import Vector
from tessera.core.placement import NoFit
from tessera.core.state import Placement

from .allocate import Shape, gang_demand, shape


class Consolidate:
    name = "consolidate"

    def execute(self, session: Session) -> None:
        waiting = session.waiting_after(("placement",))
        if not waiting or session.config.max_moves <= 0:
            return
        # The movable workloads and their node index are found when the first waiting workload
        # its project's rules allow comes (often none does): until then nothing has changed,
        # so they are what they were when the action began; the index is built at the first
        # node search (an attempt that places without one moves nobody).
        movable: tuple[list[WorkloadState], KeptGroups | None] | None = None
        index: list[NodeIndex] = []
        failed: set[Shape] = set()
        for ws in session.quota.fair_order(waiting):
            key = shape(ws)
            if key in failed or not ws.unplaced():
                continue
            if session.quota.check(ws, gang_demand(session, ws)) is not None:
                continue
            if movable is None:
                movable = _movable(session)
            if not movable[0]:
                return
            if not self._try(session, ws, partial(_index, movable, index)):
                failed.add(key)

    def _try(self, session: Session, ws: WorkloadState, index: Callable[[], NodeIndex]) -> bool:
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
                session, fail, index(), allow, pod_level=True, constraint=session.constraint_for(ws, fail)
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


def _movable(session: Session) -> tuple[list[WorkloadState], KeptGroups | None]:
    """Running workloads consolidation may move: movable, preemptible past their minimum
    runtime, every pod a GPU share; fewest GPUs first. The sorted list is kept with the
    session (cycle/kept_running.py); the clock and this plan are checked here as
    ``session.evictable(v, "preempt")`` checks them. With them, their node index's groups
    from the kept per-node lists (``kept_groups``), or None where those do not apply: a
    workload shrunk in this plan (it no longer runs everywhere its spec says, and it may
    sort elsewhere)."""
    kept = kept_running(session)
    protected = kept.protected(session.now)
    bindings, moved = session.bindings, session.moved
    entries = [e for e in kept.movables(session) if not e[2].evicted and e[1] not in protected
               and e[1] not in bindings and e[1] not in moved]
    found = [e[2] for e in entries]
    # The kept key is the GPUs of the spec's placements: what a running workload holds until
    # this plan evicts, shrinks (both recorded in ``evictions``), binds or moves it. A shrunk
    # one holds less now: sorted again as it is now, as before.
    evictions = session.evictions
    if evictions and any(e[1] in evictions for e in entries):
        if any(e[0] != e[2].vector()[0] for e in entries if e[1] in evictions):
            found.sort(key=lambda v: (v.vector()[0], v.id))
        return found, None
    return found, KeptGroups(found, kept.movable_nodes, kept.movable_on, 2)


def _index(movable: tuple[list[WorkloadState], KeptGroups | None], built: list[NodeIndex]) -> NodeIndex:
    """The node index of ``movable``, made on first call and kept in ``built``: over the kept
    groups where they apply (``NodeIndex(found)``'s groups, each made when first read)."""
    if not built:
        found, groups = movable
        built.append(NodeIndex(found) if groups is None or not _LAZY else NodeIndex.of_groups(groups))
    return built[0]


_LAZY = True
"""Whether the index reads the kept groups (tests compare with ``NodeIndex(found)``)."""
