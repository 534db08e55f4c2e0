"""The running, preemptible workloads that preempt and consolidate look at, kept between warm
cycles (``cycle.warm``) instead of found and sorted again from every running workload.

A session built for one cycle has no entry here: the first action that asks builds it from
``session.workloads``. A session the warm cycle keeps is told which workload ids it took out,
changed or added (``note_changed``, called by ``warm._apply`` before ``Session.begin``); only
those are looked at again, and the sorted lists are kept sorted by merging them in.

What depends on the cycle is decided per cycle, exactly as ``Session.evictable`` decides it:

- evicted in this plan, or given a binding or a move: checked per workload at use (those sets
  belong to the plan);
- the preemption minimum runtime: a workload is protected while ``now - started < minimum``.
  For one minimum, that test is monotone in ``started`` (floating-point subtraction is
  monotone), so the workloads with that minimum are kept sorted by ``started`` and the
  protected ones are the suffix found by a binary search with that very test: no rounding
  of ``started + minimum`` is involved, and the clock may go back as well as forward.

Everything here is only an index over ``WorkloadState`` facts that do not change while the
workload's spec does not (running, preemptible, movable, pod shapes, priority, start time,
minimum runtimes): a changed spec is a new ``WorkloadState``, reported by ``note_changed``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable
from typing import Any
from weakref import WeakKeyDictionary

from .session import Session
from .workload_state import WorkloadState

_PreemptKey = tuple[int, float, str]


class KeptRunning:
    """Per session: the running, preemptible workloads, in the orders preempt and consolidate
    use them, and the ones with a preemption minimum runtime by start time."""

    def __init__(self, session: Session) -> None:
        self._build(session)

    def _build(self, session: Session) -> None:
        """Every list made from ``session.workloads``: appended, then each sorted once."""
        self.entries: dict[str, WorkloadState] = {}
        self.by_project: dict[str, list[tuple[_PreemptKey, WorkloadState]]] = {}
        self.movable: list[tuple[tuple[float, str], WorkloadState]] = []
        self.timed: dict[float, list[tuple[float, str, WorkloadState]]] = {}
        self.dirty: set[str] = set()
        self._where: dict[str, tuple[tuple[_PreemptKey, WorkloadState],
                                     tuple[tuple[float, str], WorkloadState] | None,
                                     tuple[float, tuple[float, str, WorkloadState]] | None]] = {}
        for ws in session.workloads.values():
            self._add(session, ws, list.append)
        for group in self.by_project.values():
            group.sort()
        self.movable.sort()
        for timed in self.timed.values():
            timed.sort()

    # -- upkeep --------------------------------------------------------------------------------

    def refresh(self, session: Session) -> None:
        """Apply the ids reported changed since the last cycle: each entry taken out of and
        put into the sorted lists by binary search (each entry's key holds the workload id,
        unique: the tuples never compare the workload states)."""
        if not self.dirty:
            return
        dirty, self.dirty = self.dirty, set()
        if len(dirty) > len(self.entries) // 8:  # many changes (a cold cycle's plan applied)
            self._build(session)  # one sort beats as many insorts
            return
        workloads = session.workloads
        for wid in dirty:
            if wid in self.entries:
                self._remove(wid)
        for wid in dirty:
            ws = workloads.get(wid)
            if ws is not None:
                self._add(session, ws, insort)

    def _remove(self, wid: str) -> None:
        ws = self.entries.pop(wid)
        pentry, mentry, tentry = self._where.pop(wid)
        _drop(self.by_project[ws.project], pentry)
        if mentry is not None:
            _drop(self.movable, mentry)
        if tentry is not None:
            _drop(self.timed[tentry[0]], tentry[1])

    def _add(self, session: Session, ws: WorkloadState,
             put: Callable[[list[Any], Any], None]) -> None:
        """``put``: insort, or append (the lists sorted once afterwards)."""
        if not (ws.was_running and ws.preemptible):
            return
        self.entries[ws.id] = ws
        started = ws.spec.started_at
        pentry = ((ws.priority, -(started or 0.0), ws.id), ws)
        put(self.by_project.setdefault(ws.project, []), pentry)
        mentry = None
        if ws.spec.movable and all(r.gpu.shared for r in ws.spec.pods):
            mentry = ((_running_gpus(session, ws), ws.id), ws)
            put(self.movable, mentry)
        minimum = session.min_runtimes(ws)[0]
        tentry = None
        if minimum > 0 and started is not None:
            tentry = (minimum, (started, ws.id, ws))
            put(self.timed.setdefault(minimum, []), tentry[1])
        self._where[ws.id] = (pentry, mentry, tentry)

    # -- per cycle -----------------------------------------------------------------------------

    def protected(self, now: float) -> set[str]:
        """Ids protected by the preemption minimum runtime at ``now`` (exactly
        ``Session.protected(ws, "preempt")``)."""
        out: set[str] = set()
        for m, group in self.timed.items():
            def is_protected(e: tuple[float, str, WorkloadState], m: float = m) -> bool:
                return now - e[0] < m
            # The first entry whose workload is protected (the test is False, then True).
            first = bisect_left(group, True, key=is_protected)
            out.update(e[1] for e in group[first:])
        return out


def _drop(group: list[Any], entry: object) -> None:
    i = bisect_left(group, entry)
    assert group[i] is entry
    del group[i]


def _running_gpus(session: Session, ws: WorkloadState) -> float:
    """``ws.vector()[0]`` as the cycle begins (its spec's placements), summed in the same
    order, whatever this cycle has done to it so far."""
    total = 0.0
    for p in ws.spec.placements:
        if p is not None:
            total = total + session.quota.placement_vector(p)[0]
    return total


_KEPT: WeakKeyDictionary[Session, KeptRunning] = WeakKeyDictionary()


def kept_running(session: Session) -> KeptRunning:
    """This session's index, up to date with the changes reported (built on first use)."""
    kept = _KEPT.get(session)
    if kept is None:
        kept = _KEPT[session] = KeptRunning(session)
    else:
        kept.refresh(session)
    return kept


def note_changed(session: Session, ids: Iterable[str]) -> None:
    """Workload ids taken out, changed or added to a kept session since its last cycle
    (``cycle.warm`` calls this before ``Session.begin``)."""
    kept = _KEPT.get(session)
    if kept is not None:
        kept.dirty.update(ids)
