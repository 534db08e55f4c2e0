"""reclaim: a project below its fair share takes resources back from projects above theirs.

For each waiting workload whose project (and ancestors) would stay within fair share, the
victims are preemptible, running workloads of other projects, not protected by their minimum
runtime. A victim may go only if, after it, its project and each ancestor below the common
ancestor with the reclaimer stay at or above their fair share (KAI's MaintainFairShare), or,
while the reclaimer's side stays within its deserved quota, at or above the smaller of fair
share and deserved quota (KAI's GuaranteeDeservedQuota).
Victims are preferred from lower-priority projects, then the closest relatives of the reclaimer
in the tree, then the project most over its share, lower workload priority, most recently
started. The outcome is kept only if the workload
then fits, and if the GPUs evicted do not exceed the GPUs placed plus what the reclaiming
project is still short of its fair share afterwards (so nothing is evicted that the reclaimer
is not owed). Non-preemptible workloads are never victims.
"""

from __future__ import annotations

from functools import partial

from tessera.core.cycle.kept_room import kept_room
from tessera.core.cycle.kept_victims import kept_victims, ordered_victims
from tessera.core.cycle.session import Session, WorkloadState
from tessera.core.cycle.takeable import VictimSizes
from tessera.core.cycle.victim_groups import EntriesByNode
from tessera.core.cycle.victims import Entry, NodeIndex
from tessera.core.fairshare import EPS, Vector

from .allocate import Shape, gang_demand, shape
from .reclaim_search import ReclaimSearch, floor_of

_TRIES = ("placement", "fair-share")


def over_floor(session: Session, project: str) -> bool:
    a = session.quota.alloc[project]
    floor = floor_of(session, project, guaranteed=True)
    return any(a[r] > floor[r] + EPS for r in session.tree.governed)


class Reclaim:
    """The action: for each waiting workload in fair order, a ``ReclaimSearch`` over the
    victims in this action's preference order (one order per set of ancestors)."""

    name = "reclaim"
    memo_failures = True
    """Skip later reclaimers of a (project, request shape) whose search found no victims that
    make room. Only that failure is remembered: one refused afterwards (the reclaimer's
    departments over their caps, more evicted than owed) says nothing about the next. (One cut
    short by the scan limit is remembered too; a later scan of the same shape may reach
    further, as nodes that fill stop counting: docs/scheduling.md, "Not done".)"""

    def execute(self, session: Session) -> None:
        waiting = session.waiting_after(_TRIES)
        if not waiting:
            return
        over: dict[str, bool] = {}

        def above(project: str) -> bool:
            # Whether its project is above its floor (once per project): the workloads of the
            # others are not asked about (both tests read the session only).
            found = over.get(project)
            if found is None:
                found = over[project] = over_floor(session, project)
            return found

        victims = ordered_victims(session, above)
        if not victims:
            return
        order = VictimOrder(session, victims)
        failed: set[tuple[str, Shape]] = set()
        splits: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        floors: dict[tuple[str, bool], Vector] = {}
        for ws in session.quota.fair_order(waiting):
            key = (ws.project, shape(ws))
            if key in failed or not ws.unplaced():
                continue
            if session.quota.check(ws, gang_demand(session, ws),
                                   fair_caps=_leaf_only(session, ws)) is not None:
                continue
            search = ReclaimSearch(session, ws, partial(order.index_for, ws), splits, floors)
            if search.run():
                order.evicted_for_good(search.kept)
            elif search.no_victims and self.memo_failures:
                failed.add(key)


class VictimOrder:
    """Victims in preference order for reclaimers under the same ancestors: lower project
    priority first; then the closest relatives (a sibling only has to stay at its own fair
    share, a cousin's department too); then the most over its share, lower workload priority,
    most recently started. One ``NodeIndex`` per set of ancestors, sharing their pruning, made
    when a search first needs it. Each victim's GPUs and nodes are worked out once for all of
    them, and so are the nodes per project and victim size (``VictimSizes``)."""

    def __init__(self, session: Session, victims: list[WorkloadState]) -> None:
        self.session = session
        self.victims = victims
        self.ratio: dict[str, float] = {}
        for v in victims:
            if v.project not in self.ratio:
                share = session.quota.shares.gpu(v.project)
                self.ratio[v.project] = (session.quota.alloc[v.project][0] / share if share > EPS
                                         else float("inf"))
        self.indexes: dict[tuple[str, ...], NodeIndex] = {}
        self._by_workload: list[Entry] | None = None
        self._sizes: VictimSizes | None = None
        self._base: EntriesByNode | None = None
        self._projects: list[str] = []
        """The project of each entry, in the entries' order."""
        self._nodes: dict[int, tuple[float, tuple[str, ...]]] = {}
        """Per victim (``id``): its GPUs and nodes when the entries were made."""

    def evicted_for_good(self, evicted: list[WorkloadState]) -> None:
        """A search committed: these stay evicted for the rest of the action."""
        for v in evicted:
            found = self._nodes.get(id(v))
            if found is None:
                continue  # not in the entries: evicted before they were made
            size, nodes = found
            if self._sizes is not None:
                self._sizes.evicted_for_good(v, size, nodes)
            for index in self.indexes.values():
                index.evicted_for_good(v, nodes)

    def index_for(self, ws: WorkloadState) -> NodeIndex:
        ancestors = ws.chain[1:]
        index = self.indexes.get(ancestors)
        if index is None:
            near = set(ancestors)
            tree, ratio = self.session.tree, self.ratio
            # The preference is (project part, workload part): sort once by the workload part,
            # then stably by the project part, computed once per project.
            by_workload = self._by_workload
            if by_workload is None:
                by_workload = self._by_workload = self._entries()
                self._projects = [e[0].project for e in by_workload]
                self._sizes = VictimSizes(by_workload)
                self._base = EntriesByNode(by_workload)
            assert self._sizes is not None and self._base is not None
            part: dict[str, tuple[object, ...]] = {}
            for project in ratio:
                closeness = sum(1 for name in tree.chain(project) if name in near)
                part[project] = (tree[project].priority, -closeness, -ratio[project])
            # Equal parts, equal ranks: the stable sort keeps the workload order among them.
            order = {key: k for k, key in enumerate(sorted(set(part.values())))}
            rank = {project: order[key] for project, key in part.items()}
            keys = list(map(rank.__getitem__, self._projects))
            ordered = sorted(range(len(keys)), key=keys.__getitem__)
            like = next(iter(self.indexes.values()), None)
            index = self.indexes[ancestors] = NodeIndex.of_order(self._base, ordered, keys, like,
                                                                 self._sizes)
            if like is None:
                index.kept = kept_room(self.session)
        return index

    def _entries(self) -> list[Entry]:
        """(victim, GPUs it counts, its nodes) in the workload part of the order (the victims
        come in it: ``ordered_victims``), kept between cycles (``KeptVictims``)."""
        entries = kept_victims(self.session).entries(self.victims)
        nodes_of = self._nodes
        for v, g, nodes in entries:
            nodes_of[id(v)] = (g, nodes)
        return entries


def _leaf_only(session: Session, ws: WorkloadState) -> dict[str, Vector]:
    inf = float("inf")
    return {name: session.quota.shares.share[name] if name == ws.project else (inf, inf, inf)
            for name in ws.chain}
