"""preempt: within one project, a waiting workload evicts running ones of lower priority.

Victims are preemptible workloads of the same project with a strictly lower priority that have
run at least their preemption minimum runtime; the lowest priority and most recently started
go first. Victims are taken first until the project's rules allow the workload (its limit,
deserved quota for a non-preemptible one, and fair share — which preemption may not grow a
project beyond: the cap is the larger of its fair share and what it holds now), then until it
fits. The outcome is kept only if the workload is placed; victims that turn out not to be
needed are put back.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import partial
from itertools import filterfalse

from tessera.core.cycle.kept_groups import KeptGroups
from tessera.core.cycle.kept_running import KeptRunning, PreemptEntry, kept_running
from tessera.core.cycle.mig_room import bind_in_room, find_room, mig_pod, where_mig
from tessera.core.cycle.session import PodPlacements, Session, Statement, WorkloadState
from tessera.core.cycle.victims import NodeIndex, Tentative, drop_needless, evict_until_fits
from tessera.core.fairshare import Vector

from .allocate import gang_demand

_TRIES = ("placement", "limit", "quota", "fair-share")

_KEEP_LISTS = True
"""Keep each (project, priority)'s victim list through the action (``execute``); False
filters it from the project's candidates for every waiting workload (tests compare)."""

_KEPT_GROUPS = True
"""Read each node index from the kept per-node lists (False: ``NodeIndex(victims)``; tests
compare)."""


class Preempt:
    name = "preempt"

    def execute(self, session: Session) -> None:
        waiting = session.waiting_after(_TRIES)
        if not waiting:
            return
        # Only projects with a waiting workload can preempt, and only a waiting workload of a
        # higher priority than its project's lowest evictable one has a victim: victims only
        # leave the list during the action (evicted, settled; a discarded attempt puts them
        # back), so one with none at the start has none later and does nothing. Leaving it out
        # of the fair order changes nothing either: a workload that does nothing changes no
        # project's key, so the others come in the same order (tests/core/cycle/test_actions_same.py).
        # Likewise a running workload of a priority no waiting one of its project outranks is
        # nobody's victim: it is not even checked.
        top: dict[str, int] = {}
        for w in waiting:
            if w.priority > top.get(w.project, w.priority - 1):
                top[w.project] = w.priority
        # The running, preemptible workloads per project, sorted, are kept with the session
        # (cycle/kept_running.py); what depends on this cycle (the clock, this plan) is
        # checked here as ``session.evictable(v, "preempt")`` checks it.
        kept = kept_running(session)
        protected = kept.protected(session.now)
        bindings, moved = session.bindings, session.moved
        # A project's candidates are its entries below its top priority that are not evicted,
        # protected, bound or moved: the lowest priority among them is the first such entry's.
        lowest: dict[str, int] = {}
        for p, t in top.items():
            for e in kept.by_project.get(p, ()):
                if e[0] >= t:
                    break
                if not e[3].evicted and e[2] not in protected and e[2] not in bindings and e[2] not in moved:
                    lowest[p] = e[0]
                    break
        waiting = [w for w in waiting if w.project in lowest and w.priority > lowest[w.project]]
        # The victims for one (project, priority below) change only when one of them is
        # evicted, put back or settled: the node index is rebuilt only then (a failed attempt
        # leaves them as they were), not once per waiting workload; it is read from the kept
        # per-node lists (``_index``), as far as the searches read it.
        cache: dict[tuple[str, int], tuple[list[WorkloadState], list[NodeIndex]]] = {}
        # The victim list itself changes only when an attempt of its project is kept: a kept
        # attempt evicts only victims of its own project (``allow``, the quota queue and the
        # MIG room all take from it) and binds only its workload, and a discarded one leaves
        # nothing; within the action a workload evicted or bound for good stays so. So a list
        # made once (the prefix of its project's candidates, those not evicted, bound or moved
        # since the action began) is after that its last self less what its project's kept
        # attempts evicted or bound since (``changed``, in order: a set difference in C).
        lists: dict[tuple[str, int], tuple[int, list[WorkloadState]]] = {}
        changed: dict[str, list[WorkloadState]] = {}
        for ws in session.quota.fair_order(waiting):
            if not ws.unplaced():
                continue
            key = (ws.project, ws.priority)
            done = changed.setdefault(ws.project, [])
            listed = lists.get(key) if _KEEP_LISTS else None
            if listed is None:
                entries = kept.by_project[ws.project]  # sorted by priority first: those below are a prefix
                below = bisect_left(entries, ws.priority, key=_entry_priority)
                # ``session.evictable`` inlined (the candidates' filter)
                victims = [e[3] for e in entries[:below] if not e[3].evicted and e[2] not in protected
                           and e[2] not in bindings and e[2] not in moved]
                lists[key] = (len(done), victims)
            elif listed[0] != len(done):
                victims = list(filterfalse(set(done[listed[0]:]).__contains__, listed[1]))
                if len(victims) == len(listed[1]):  # a filter of it: the same list
                    victims = listed[1]
                lists[key] = (len(done), victims)
            else:
                victims = listed[1]
            found = cache.get(key)
            if found is None or (found[0] is not victims and (len(found[0]) != len(victims) or any(
                    a is not b for a, b in zip(found[0], victims, strict=True)))):
                found = cache[key] = (victims, [])
            if found[0]:
                build = partial(_index, kept, ws.project)
                done.extend(self._try(session, ws, found[0], _lazy(found, build), build))

    def _try(self, session: Session, ws: WorkloadState, victims: list[WorkloadState],
             index: Callable[[], NodeIndex],
             build: Callable[[list[WorkloadState]], NodeIndex] = NodeIndex) -> list[WorkloadState]:
        """``index``: gives ``NodeIndex(victims)`` (built on first use: most attempts place
        without a node search), used as it is when no victim is taken for quota; else
        ``build(victims left)`` gives it. Returns the workloads a kept attempt evicted or bound
        (none when it was discarded)."""
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
                return []
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
            result = evict_until_fits(session, ws, index if not evicted else partial(build, queue), allow,
                                      evict, extra_ok, 4 * ws.required() + 4)
        if result is None:
            stmt.discard()
            return []
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
        return [*kept, ws]


def _lazy(found: tuple[list[WorkloadState], list[NodeIndex]],
          build: Callable[[list[WorkloadState]], NodeIndex] = NodeIndex) -> Callable[[], NodeIndex]:
    """The cached entry's node index, built (``build(victims)``) the first time it is asked for
    and kept there (so its pruning carries over to the next attempt, as when it was built
    eagerly)."""
    def get() -> NodeIndex:
        if not found[1]:
            found[1].append(build(found[0]))
        return found[1][0]
    return get


def _index(kept: KeptRunning, project: str, victims: list[WorkloadState]) -> NodeIndex:
    """``NodeIndex(victims)``, read from the project's kept per-node lists (``kept_groups``):
    ``victims`` are in the kept order (a filtered prefix of the project's entries, or what is
    left of one after the quota victims were taken from its front), none evicted, bound or
    moved when the index is made (before the node search evicts anyone), so each runs where its
    spec puts it (a workload shrunk in this plan counts as moved: ``shrink._keep``)."""
    if not _KEPT_GROUPS:
        return NodeIndex(victims)
    on = kept.on_nodes(project)
    return NodeIndex.of_groups(KeptGroups(victims, kept.preempt_nodes, on, 3))


def _entry_priority(e: PreemptEntry) -> int:
    return e[0]

