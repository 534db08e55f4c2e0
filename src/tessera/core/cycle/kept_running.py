"""The running, preemptible workloads that preempt and consolidate look at, kept between warm
cycles (``cycle.warm``) instead of found and sorted again from every running workload.

A session built for one cycle has no entry here: the first action that asks builds it from
``session.workloads``. A session the warm cycle keeps is told which workload ids it took out,
changed or added (``note_changed``, called by ``warm._apply`` before ``Session.begin``); only
those are looked at again. A few are taken out of and put into the sorted lists by binary
search; many (the first warm cycle after a cold one: every binding and eviction of its plan)
are taken out in one pass over each list they were in, and the new entries, sorted among
themselves, are merged in (one sort of two sorted runs, which ``list.sort`` merges in linear
time). Either way the lists are exactly the sorted lists a new index builds
(``tests/core/cycle/test_warm.py`` compares them after every warm cycle).

Entries are flat tuples whose first element is a number (priority, GPUs, start time) and
which hold the workload id before the workload state: ids are unique, so two entries never
compare equal up to the state (states are never compared), and ``list.sort`` compares the
first elements with its number fast path.

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
minimum runtimes, the GPUs its spec's placements count): a changed spec is a new
``WorkloadState``, reported by ``note_changed``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from operator import attrgetter
from typing import Any, TypeVar

from .kept_with import KeptWith
from .session import Session
from .workload_state import WorkloadState

PreemptEntry = tuple[int, float, str, WorkloadState]
"""(priority, minus its start time, id, state): preempt's order within a project."""
MovableEntry = tuple[float, str, WorkloadState]
"""(GPUs of its spec's placements, id, state): consolidate's order."""
TimedEntry = tuple[float, str, WorkloadState]
"""(start time, id, state), per preemption minimum runtime."""

_T = TypeVar("_T")

_shared = attrgetter("gpu.shared")
"""A pod request for a GPU portion or memory (movable by consolidate)."""

_BATCH = 32
"""Changes above ``len(entries) / _BATCH`` are applied by one filter and merge per list
rather than by binary searches (each insertion into a list of n entries moves n/2 of them)."""


class KeptRunning:
    """Per session: the running, preemptible workloads, in the orders preempt and consolidate
    use them, and the ones with a preemption minimum runtime by start time."""

    def __init__(self, session: Session) -> None:
        self.entries: dict[str, WorkloadState] = {}
        self.by_project: dict[str, list[PreemptEntry]] = {}
        self.timed: dict[float, list[TimedEntry]] = {}
        self.dirty: set[str] = set()
        self._where: dict[str, tuple[PreemptEntry, tuple[float, TimedEntry] | None]] = {}
        self.movable_made = False
        """Whether consolidate has asked (``movables``): until then its lists are not made."""
        self.movable: list[MovableEntry] = []
        self.movable_entry: dict[str, MovableEntry] = {}
        self.movable_nodes: dict[str, tuple[str, ...]] = {}
        """Per movable workload: the nodes its spec's placements use (pod order, each once)."""
        self.movable_on: dict[str, list[MovableEntry]] = {}
        """Per node: the movable entries with a pod there, in ``movable``'s order
        (consolidate's node index, ``kept_groups``)."""
        self.preempt_on: dict[str, dict[str, list[PreemptEntry]]] = {}
        """Per project whose lists preempt asked for (``on_nodes``), per node: its entries with
        a pod there, in ``by_project``'s order (preempt's node indexes, ``kept_groups``)."""
        self.preempt_nodes: dict[str, tuple[str, ...]] = {}
        """Per entry of such a project: the nodes its spec's placements use."""
        self._minimum: dict[str, float] = {}
        """Per project: its preemption minimum runtime (tree and config fixed per session)."""
        self._merge(session, session.workloads.values())

    # -- upkeep --------------------------------------------------------------------------------

    def refresh(self, session: Session, batch: bool | None = None) -> None:
        """Apply the ids reported changed since the last cycle (``batch``: by filter and
        merge, or by binary searches; None: whichever costs less)."""
        if not self.dirty:
            return
        dirty, self.dirty = self.dirty, set()
        workloads = session.workloads
        gone = [wid for wid in dirty if wid in self.entries]
        states = [ws for ws in map(workloads.get, dirty) if ws is not None]
        if batch is None:
            batch = len(dirty) * _BATCH > len(self.entries)
        if batch:
            self._remove_many(gone)
            self._merge(session, states)
            return
        for wid in gone:
            self._remove(wid)
        for ws in states:
            self._insert(session, ws)

    def _entry(self, session: Session, ws: WorkloadState) -> tuple[PreemptEntry, tuple[float, TimedEntry] | None]:
        """Record ``ws`` (a candidate) in ``entries`` and ``_where``; its entries."""
        wid = ws.id
        started = ws.spec.started_at
        pentry = (ws.priority, -(started or 0.0), wid, ws)
        minimum = self._minimum.get(ws.project)
        if minimum is None:
            minimum = self._minimum[ws.project] = session.min_runtimes(ws)[0]
        tentry = (minimum, (started, wid, ws)) if minimum > 0 and started is not None else None
        self.entries[wid] = ws
        found = self._where[wid] = (pentry, tentry)
        return found

    def _insert(self, session: Session, ws: WorkloadState) -> None:
        if not (ws.was_running and ws.preemptible):
            return
        pentry, tentry = self._entry(session, ws)
        insort(self.by_project.setdefault(ws.project, []), pentry)
        on = self.preempt_on.get(ws.project)
        if on is not None:
            nodes = self.preempt_nodes[ws.id] = _spec_nodes(ws)
            for node in nodes:
                insort(on.setdefault(node, []), pentry)
        if self.movable_made:
            mentry = self._movable_entry(session, ws)
            if mentry is not None:
                insort(self.movable, mentry)
                for node in self.movable_nodes[ws.id]:
                    insort(self.movable_on.setdefault(node, []), mentry)
        if tentry is not None:
            insort(self.timed.setdefault(tentry[0], []), tentry[1])

    def _merge(self, session: Session, states: Iterable[WorkloadState]) -> None:
        """Add many: each list's new entries sorted, then merged into it."""
        projects: dict[str, list[PreemptEntry]] = {}
        timed: dict[float, list[TimedEntry]] = {}
        preempt_on: dict[str, dict[str, list[PreemptEntry]]] = {}
        added: list[WorkloadState] = []
        asked, entries, where, minimums = self.preempt_on, self.entries, self._where, self._minimum
        for ws in states:
            if not (ws.was_running and ws.preemptible):
                continue
            # ``_entry`` inlined (60,000 workloads in a new session at 5,000 nodes)
            wid, project = ws.id, ws.project
            started = ws.spec.started_at
            pentry = (ws.priority, -(started or 0.0), wid, ws)
            minimum = minimums.get(project)
            if minimum is None:
                minimum = minimums[project] = session.min_runtimes(ws)[0]
            tentry = (minimum, (started, wid, ws)) if minimum > 0 and started is not None else None
            entries[wid] = ws
            where[wid] = (pentry, tentry)
            added.append(ws)
            group = projects.get(project)
            if group is None:
                projects[project] = [pentry]
            else:
                group.append(pentry)
            if asked and project in asked:
                on_p = preempt_on.setdefault(project, {})
                spec_nodes = self.preempt_nodes[wid] = _spec_nodes(ws)
                for node in spec_nodes:
                    here = on_p.get(node)
                    if here is None:
                        on_p[node] = [pentry]
                    else:
                        here.append(pentry)
            if tentry is not None:
                at = timed.get(tentry[0])
                if at is None:
                    timed[tentry[0]] = [tentry[1]]
                else:
                    at.append(tentry[1])
        for p, new in projects.items():
            self.by_project[p] = _merged(self.by_project.get(p), new)
        for p, new_on_p in preempt_on.items():
            kept_on = self.preempt_on[p]
            for node, new_p in new_on_p.items():
                kept_on[node] = _merged(kept_on.get(node), new_p)
        for m, new_timed in timed.items():
            self.timed[m] = _merged(self.timed.get(m), new_timed)
        if self.movable_made:
            self._merge_movable(session, added)

    def _movable_entry(self, session: Session, ws: WorkloadState) -> MovableEntry | None:
        """Record a candidate's movable entry and nodes, if consolidate may move it."""
        spec = ws.spec
        if not (spec.movable and all(map(_shared, spec.pods))):
            return None
        mentry = self.movable_entry[ws.id] = (_spec_gpus(session, ws), ws.id, ws)
        self.movable_nodes[ws.id] = _spec_nodes(ws)
        return mentry

    def _merge_movable(self, session: Session, states: Iterable[WorkloadState]) -> None:
        movable: list[MovableEntry] = []
        for ws in states:
            mentry = self._movable_entry(session, ws)
            if mentry is not None:
                movable.append(mentry)
        if not movable:
            return
        movable.sort()
        on_node: dict[str, list[MovableEntry]] = {}
        nodes = self.movable_nodes
        for mentry in movable:  # in order: each node's new entries sorted as they come
            for node in nodes[mentry[1]]:
                at = on_node.get(node)
                if at is None:
                    on_node[node] = [mentry]
                else:
                    at.append(mentry)
        self.movable = _merged(self.movable, movable)
        for node, new_on in on_node.items():
            self.movable_on[node] = _merged(self.movable_on.get(node), new_on)

    def movables(self, session: Session) -> list[MovableEntry]:
        """``movable`` (made from the candidates the first time consolidate asks: a cycle
        whose consolidate finds nothing to try never makes it)."""
        if not self.movable_made:
            self.movable_made = True
            self._merge_movable(session, self.entries.values())
        return self.movable

    def _remove(self, wid: str) -> None:
        ws = self.entries.pop(wid)
        pentry, tentry = self._where.pop(wid)
        _drop(self.by_project[ws.project], pentry)
        on = self.preempt_on.get(ws.project)
        if on is not None:
            for node in self.preempt_nodes.pop(wid):
                _drop(on[node], pentry)
        mentry = self.movable_entry.pop(wid, None)
        if mentry is not None:
            _drop(self.movable, mentry)
            for node in self.movable_nodes.pop(wid):
                _drop(self.movable_on[node], mentry)
        if tentry is not None:
            _drop(self.timed[tentry[0]], tentry[1])

    def _remove_many(self, wids: list[str]) -> None:
        """Take many out: one filter of each list that held one of them."""
        if not wids:
            return
        gone = set(wids)
        projects: set[str] = set()
        minimums: set[float] = set()
        movable = False
        nodes: set[str] = set()
        on_nodes: dict[str, set[str]] = {}
        for wid in wids:
            project = self.entries.pop(wid).project
            projects.add(project)
            if project in self.preempt_on:
                on_nodes.setdefault(project, set()).update(self.preempt_nodes.pop(wid))
            _, tentry = self._where.pop(wid)
            if self.movable_entry.pop(wid, None) is not None:
                movable = True
                nodes.update(self.movable_nodes.pop(wid))
            if tentry is not None:
                minimums.add(tentry[0])
        for p in projects:
            self.by_project[p] = [e for e in self.by_project[p] if e[2] not in gone]
        for p, touched in on_nodes.items():
            on = self.preempt_on[p]
            for node in touched:
                on[node] = [e for e in on[node] if e[2] not in gone]
        if movable:
            self.movable = [e for e in self.movable if e[1] not in gone]
            for node in nodes:
                self.movable_on[node] = [e for e in self.movable_on[node] if e[1] not in gone]
        for m in minimums:
            self.timed[m] = [e for e in self.timed[m] if e[1] not in gone]

    # -- per cycle -----------------------------------------------------------------------------

    def on_nodes(self, project: str) -> dict[str, list[PreemptEntry]]:
        """Per node, ``project``'s entries with a pod there in ``by_project``'s order (made the
        first time preempt asks for the project, then kept like the rest); the nodes of each
        are in ``preempt_nodes``."""
        found = self.preempt_on.get(project)
        if found is None:
            found = self.preempt_on[project] = {}
            nodes = self.preempt_nodes
            get = found.get
            for e in self.by_project.get(project, ()):
                spec_nodes = nodes[e[2]] = _spec_nodes(e[3])
                for node in spec_nodes:
                    at = get(node)
                    if at is None:
                        found[node] = [e]
                    else:
                        at.append(e)
        return found

    def protected(self, now: float) -> set[str]:
        """Ids protected by the preemption minimum runtime at ``now`` (exactly
        ``Session.protected(ws, "preempt")``)."""
        out: set[str] = set()
        for m, group in self.timed.items():
            def is_protected(e: TimedEntry, m: float = m) -> bool:
                return now - e[0] < m
            # The first entry whose workload is protected (the test is False, then True).
            first = bisect_left(group, True, key=is_protected)
            out.update(e[1] for e in group[first:])
        return out


def _merged(old: list[_T] | None, new: list[_T]) -> list[_T]:
    """``old`` (sorted, or None) with ``new`` merged in: ``new`` sorted, appended, and the two
    sorted runs merged by ``list.sort`` (it finds the runs and merges them)."""
    new.sort()
    if not old:
        return new
    old += new
    old.sort()
    return old


def _drop(group: list[Any], entry: object) -> None:
    i = bisect_left(group, entry)
    assert group[i] is entry
    del group[i]


def _spec_nodes(ws: WorkloadState) -> tuple[str, ...]:
    """The nodes its spec's placements use, in pod order, each once."""
    placements = ws.spec.placements
    if len(placements) == 1:  # most workloads: one pod
        return () if placements[0] is None else (placements[0].node,)
    return tuple(dict.fromkeys(p.node for p in placements if p is not None))


def _spec_gpus(session: Session, ws: WorkloadState) -> float:
    """``ws.vector()[0]`` as the cycle begins (its spec's placements), summed in the same
    order, whatever this cycle has done to it so far. A pod still where its spec puts it
    counts its kept quota vector (``pod_vectors``: ``placement_vector`` of that very
    placement, set whenever it is assigned); another is worked out again."""
    total = 0.0
    now, vectors = ws.placements, ws.pod_vectors
    for i, p in enumerate(ws.spec.placements):
        if p is not None:
            v = vectors[i]
            if v is None or now[i] is not p:
                v = session.quota.placement_vector(p)
            total = total + v[0]
    return total


_KEPT: KeptWith[Session, KeptRunning] = KeptWith(KeptRunning)


def kept_running(session: Session) -> KeptRunning:
    """This session's index, up to date with the changes reported (built on first use)."""
    kept = _KEPT.get(session)
    if kept is None:
        return _KEPT(session)
    kept.refresh(session)
    return kept


def note_changed(session: Session, ids: Iterable[str]) -> None:
    """Workload ids taken out, changed or added to a kept session since its last cycle
    (``cycle.warm`` calls this before ``Session.begin``)."""
    kept = _KEPT.get(session)
    if kept is not None:
        kept.dirty.update(ids)
