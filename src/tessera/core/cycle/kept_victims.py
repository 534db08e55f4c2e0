"""Reclaim's victims in its workload order, and each victim's GPUs and nodes, from indexes a
warm session keeps between cycles (``cycle.warm``) instead of sorted and worked out again from
every workload each cycle.

Reclaim's workload order (lower priority, most recently started, then id) is preempt's order
within a project, which ``kept_running`` keeps per project for the running, preemptible
workloads, updated from the ids each warm cycle reports changed. Reclaim's victims are the
workloads of the projects above their floor that ``Session.evictable`` allows: they are taken
from the kept lists of those projects, put together and sorted (the lists are sorted runs,
which ``list.sort`` merges), then filtered by ``evictable``: the same victims in the same
order as sorting them all by that key (ids are unique, so no two keys tie).

Per victim, the GPUs it counts and the nodes it runs on (each once, in pod order) are kept by
workload state (``KeptVictims``): a victim runs where its spec put it (not evicted, not bound,
moved or shrunk in this plan: ``evictable``), and a workload whose spec changed between cycles
is a new state, so an entry stands while the state is the same object.
``tests/core/cycle/test_warm.py`` compares the kept entries with fresh ones after every warm
cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .kept_running import kept_running
from .kept_with import KeptWith
from .session import Session, WorkloadState

VictimFacts = tuple[WorkloadState, float, tuple[str, ...]]
"""(victim, the GPUs it counts, the nodes it runs on)."""


def ordered_victims(session: Session, above: Callable[[str], bool]) -> list[WorkloadState]:
    """The workloads ``evictable`` for reclaim of the projects ``above`` says yes to, in
    reclaim's workload order (priority, minus start time, id)."""
    by_project = kept_running(session).by_project
    rows = [e for project, entries in by_project.items() if entries and above(project) for e in entries]
    rows.sort()
    evictable = session.evictable
    return [ws for *_, ws in rows if evictable(ws, "reclaim")]


def facts_of(v: WorkloadState) -> VictimFacts:
    """The victim's GPUs and nodes as they are now."""
    placements = v.placements
    nodes: tuple[str, ...]
    if len(placements) == 1:  # most workloads: one pod
        nodes = () if placements[0] is None else (placements[0].node,)
    else:
        nodes = tuple(dict.fromkeys(p.node for p in placements if p is not None))
    return (v, v.vector()[0], nodes)


class KeptVictims:
    """Per workload id: the facts of its state when last a victim."""

    def __init__(self) -> None:
        self.facts: dict[str, VictimFacts] = {}
        self.last: list[str] = []
        """The ids of the victims last asked about (what is kept when the store is trimmed)."""

    def entries(self, victims: Iterable[WorkloadState]) -> list[VictimFacts]:
        """Each victim's facts, in the order given (kept ones where the state is the same)."""
        facts = self.facts
        out = []
        if len(facts) > 2 * len(self.last) + 1024:  # forget workloads long gone
            facts = self.facts = {wid: facts[wid] for wid in self.last if wid in facts}
        for v in victims:
            found = self.lookup(v)
            if found is None:
                found = facts[v.id] = facts_of(v)
            out.append(found)
        self.last = [v.id for v in victims]
        return out

    def lookup(self, v: WorkloadState) -> VictimFacts | None:
        """The facts kept for ``v`` if they are its state's (the same object)."""
        found = self.facts.get(v.id)
        return found if found is not None and found[0] is v else None

    def stale(self, session: Session) -> list[str]:
        """The session's workloads a victim could be taken from (running, preemptible) whose
        facts ``lookup`` gives but which differ from their facts now (the state as a new
        cycle starts); empty when right."""
        wrong = []
        for wid, ws in session.workloads.items():
            found = self.lookup(ws) if ws.was_running and ws.preemptible else None
            if found is not None and found != facts_of(ws):
                wrong.append(wid)
        return wrong


kept_victims: KeptWith[Session, KeptVictims] = KeptWith(lambda _session: KeptVictims())
"""This session's victim facts (made on first use; a warm session keeps them)."""
