"""One reclaimer's victim search: which over-share workloads of other projects may go so that
one waiting workload fits, and whether the outcome is kept.

Read top-down in ``ReclaimSearch.run``: evict victims (in the action's preference order) until
the workload fits; undo it all unless the reclaimer's projects stay within their fair share;
put back every victim that did not make room; undo it all if more GPUs would be evicted than the
reclaimer is owed; else bind. The rule a single victim must pass is ``allow`` (its side of the
project tree keeps what it must).
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.core.cycle.mig_room import bind_in_room, find_room, mig_pod, where_mig
from tessera.core.cycle.session import PodPlacements, Session, Statement, Wait, WorkloadState
from tessera.core.cycle.victims import NodeIndex, Tentative, drop_needless, evict_until_fits
from tessera.core.fairshare import EPS, Vector
from tessera.core.model import ResourceRequest
from tessera.core.projects import Resource
from tessera.core.units import format_gpus

from .allocate import gang_demand


def reclaimer_caps(session: Session, ws: WorkloadState) -> dict[str, Vector]:
    """The reclaiming project must end within its fair share; its ancestors must end within
    theirs or no higher than now (reclaim between siblings does not grow their parent)."""
    caps: dict[str, Vector] = {}
    for name in ws.chain:
        share = session.quota.shares.share[name]
        if name == ws.project:
            caps[name] = share
        else:
            a = session.quota.alloc[name]
            caps[name] = (max(a[0], share[0]), max(a[1], share[1]), max(a[2], share[2]))
    return caps


def floor_of(session: Session, name: str, guaranteed: bool) -> Vector:
    """What a victim-side project must keep: its fair share, or, when the reclaimer only takes
    back its deserved quota, the smaller of fair share and deserved quota."""
    share = session.quota.shares.share[name]
    if not guaranteed:
        return share
    d = session.quota.deserved[name]
    return (min(share[0], d[0]), min(share[1], d[1]), min(share[2], d[2]))


class ReclaimSearch:
    """The victim search for one waiting workload ``ws`` over the victims of ``index``."""

    def __init__(self, session: Session, ws: WorkloadState,
                 index: NodeIndex | Callable[[], NodeIndex],
                 splits: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
                 floors: dict[tuple[str, bool], Vector] | None = None,
                 ) -> None:
        """``index``: the victims' index, or a function giving it (called only when a node
        search needs it: many searches place or stop before); ``splits``: ``split``'s
        answers, and ``floors``: ``floor_of``'s (fair shares and deserved quotas are fixed for
        the cycle), shared by the searches of one action."""
        self.session = session
        self.ws = ws
        self._index = index
        self.tree = session.tree
        self.governed = self.tree.governed
        self.gpu_only = self.governed == (Resource.GPU,)
        self.demand = gang_demand(session, ws)
        self.caps = reclaimer_caps(session, ws)
        self._sides: dict[str, tuple[tuple[str, ...], bool]] = {}
        self._guaranteed: dict[tuple[str, ...], bool] = {}
        self.splits = {} if splits is None else splits
        self.floors = {} if floors is None else floors
        self._takes: dict[str, float] = {}
        """``takes_up_to``'s answers (until an eviction)."""
        self._slack: dict[tuple[str, bool], Vector] = {}
        """How far each victim-side project is above what it must keep; only evictions change it."""
        self._blocked: dict[str, bool] = {}
        """GPU-only: projects none of whose GPU victims this reclaimer may take (until an eviction)."""
        self._evicted = 0.0
        self.no_victims = False
        """``run`` failed because no victims make room (not because the outcome was refused)."""
        self.kept: list[WorkloadState] = []
        """After ``run`` succeeded: the workloads it evicted."""

    @property
    def index(self) -> NodeIndex:
        if not isinstance(self._index, NodeIndex):
            self._index = self._index()
        return self._index

    # -- the search, top-down --------------------------------------------------------------------

    def run(self) -> bool:
        """Bind ``ws`` by reclaiming, inside one statement; False (and nothing changed) if not."""
        session, ws = self.session, self.ws
        if mig_pod(ws) is not None:
            return self.run_mig()
        stmt = Statement(session)
        result = evict_until_fits(session, ws, self._index, self.allow, self.evict,
                                  self.within_caps, max_rounds=4 * ws.required() + 4,
                                  blocked=self.blocked,
                                  budget=self.owed,
                                  takes_up_to=self.takes_up_to if self.gpu_only else None,
                                  over_caps=self.over_caps, takeable_only=True)
        if result is None:
            stmt.discard()
            self.no_victims = True
            self._explain_no_victims()
            return False
        placed, evicted = result
        if not session.quota.within(ws.chain, self.caps):
            stmt.discard()
            return False
        kept = self._keep_only_needed(evicted)
        if self._takes_more_than_owed(kept, placed):
            stmt.discard()
            return False
        message = (f"placed on {session.where(placed)} by reclaiming from "
                   f"{', '.join(v.id for v in kept) or 'nobody'}")
        session.record_binding(ws, placed, "reclaim", message, [v.id for v in kept])
        stmt.commit()
        self.kept = kept
        return True

    def run_mig(self) -> bool:
        """A MIG pod: victims whose partitions make room for its profile (``mig_room``), by the
        same rules (``allow``), kept only within the caps and what the reclaimer is owed."""
        session, ws = self.session, self.ws
        candidates = {v.id: v for group in self.index.by_node.values() for v in group}
        stmt = Statement(session)
        found = find_room(session, ws, candidates.values(), self.allow)
        result = None if found is None else bind_in_room(session, ws, *found, self.evict)
        if result is None:
            stmt.discard()
            self.no_victims = True
            self._explain_no_victims()
            return False
        placed, kept = result
        if not session.quota.within(ws.chain, self.caps) or self._takes_more_than_owed(kept, placed):
            stmt.discard()
            return False
        message = (f"placed on {where_mig(session, ws, placed)} by reclaiming from "
                   f"{', '.join(v.id for v in kept) or 'nobody'}")
        session.record_binding(ws, placed, "reclaim", message, [v.id for v in kept])
        stmt.commit()
        self.kept = kept
        return True

    def _keep_only_needed(self, evicted: list[WorkloadState]) -> list[WorkloadState]:
        """Put back every victim whose pods still fit where they were."""
        return drop_needless(self.session, evicted,
                             lambda: self.session.quota.within(self.ws.chain, self.caps))

    def _takes_more_than_owed(self, kept: list[WorkloadState], placed: PodPlacements) -> bool:
        """More GPUs evicted than placed plus what the reclaimer is still short of its fair
        share: say so on the workload."""
        session, ws = self.session, self.ws
        evicted_gpus = sum(session.evictions[v.id].gpus for v in kept)
        placed_gpus = sum(session.quota.placement_vector(p)[0] for _, p in placed)
        if evicted_gpus <= placed_gpus + session.quota.shortfall(ws.project) + EPS:
            return False
        session.wait(ws, Wait(
            "placement",
            f"making room needs {format_gpus(evicted_gpus)} GPUs evicted to place "
            f"{format_gpus(placed_gpus)}, more than project {ws.project} is owed",
        ))
        return True

    def _explain_no_victims(self) -> None:
        previous = self.session.waits.get(self.ws.id)
        base = previous.reason if previous is not None else "no room"
        kind = previous.kind if previous is not None else "placement"
        request = previous.request if previous is not None else None
        suffix = "; reclaim found no over-share workloads whose eviction makes room"
        self.session.wait(self.ws, Wait(kind, base + suffix, request))

    # -- the rules for one victim ----------------------------------------------------------------

    def allow(self, v: WorkloadState, tentative: Tentative) -> bool:
        """May ``v`` go, on top of what the search has tentatively taken already? Every project
        on its side of the tree must keep what it must (``floor_of``)."""
        if v.project == self.ws.project:
            return False
        vec = v.vector()
        side, guaranteed = self.victim_side(v)
        if self.gpu_only:
            g = vec[0]
            if g <= 0:
                return True
            stop = self._blocked.get(v.project)
            if stop is None:
                stop = self._blocked[v.project] = any(
                    self.slack_of(name, guaranteed)[0] <= EPS for name in side)
            if stop:
                return False
            for name in side:
                t = tentative.get(name)
                if g + (t[0] if t else 0.0) > self.slack_of(name, guaranteed)[0] + EPS:
                    return False
            return True
        for name in side:
            room = self.slack_of(name, guaranteed)
            t = tentative.get(name)
            for r in self.governed:
                if vec[r] > 0 and vec[r] + (t[r] if t else 0.0) > room[r] + EPS:
                    return False
        return True

    def owed(self) -> float:
        """GPUs this search may still evict: the larger of what the workload asks and what its
        project is short of its fair share, less what it evicted already (the rule checked in
        the end, ``_takes_more_than_owed``; here it ranks the victim sets)."""
        quota = self.session.quota
        short = quota.shares.gpu(self.ws.project) - quota.alloc[self.ws.project][0]
        return max(self.demand[0], short) - self._evicted

    def blocked(self, project: str) -> bool:
        """GPU-only: ``allow`` refuses every GPU-holding victim of ``project`` whatever was
        taken before (the same test as its first step)."""
        if not self.gpu_only:
            return False
        if project == self.ws.project:
            return True
        stop = self._blocked.get(project)
        if stop is None:
            side, guaranteed = self.side_of(project)
            stop = self._blocked[project] = any(
                self.slack_of(name, guaranteed)[0] <= EPS for name in side)
        return stop

    def takes_up_to(self, project: str) -> float:
        """GPU-only: ``allow`` takes a victim of ``project`` holding more than 0 GPUs, with
        nothing taken yet, iff it holds at most this; -1 when it takes only victims holding
        none (``blocked``), minus infinity when it takes none (the reclaimer's own project)."""
        found = self._takes.get(project)
        if found is None:
            if project == self.ws.project:
                found = float("-inf")
            else:
                # blocked(project) is "some slack <= EPS": the least slack decides both
                side, guaranteed = self.side_of(project)
                least = min(self.slack_of(name, guaranteed)[0] for name in side)
                found = -1.0 if least <= EPS else least + EPS
            self._takes[project] = found
        return found

    def victim_side(self, v: WorkloadState) -> tuple[tuple[str, ...], bool]:
        return self.side_of(v.project)

    def side_of(self, project: str) -> tuple[tuple[str, ...], bool]:
        """The victim's projects below the lowest common ancestor with the reclaimer, and
        whether the reclaimer's own side stays within deserved quota (then victims need only
        keep min(fair share, deserved), KAI's GuaranteeDeservedQuota)."""
        found = self._sides.get(project)
        if found is None:
            side, mine = self.split(project)
            guaranteed = self._guaranteed.get(mine)
            if guaranteed is None:
                tree, session, demand = self.tree, self.session, self.demand
                guaranteed = self._guaranteed[mine] = all(
                    demand[r] <= 0
                    or session.quota.alloc[name][r] + demand[r] <= tree[name].quota(r).deserved_amount + EPS
                    for name in mine
                    for r in self.governed
                )
            found = self._sides[project] = (side, guaranteed)
        return found

    def split(self, project: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the victim's chain below the lowest common ancestor, the reclaimer's): the tree's
        shape only, so kept for the whole action (``splits``)."""
        key = (project, self.ws.project)
        found = self.splits.get(key)
        if found is None:
            tree, ws = self.tree, self.ws
            lca = tree.lowest_common_ancestor(project, ws.project)
            chain = tree.chain(project)
            mine = ws.chain if lca is None else ws.chain[: ws.chain.index(lca)]
            side = chain if lca is None else chain[: chain.index(lca)]
            found = self.splits[key] = (side, mine)
        return found

    def slack_of(self, name: str, guaranteed: bool) -> Vector:
        found = self._slack.get((name, guaranteed))
        if found is None:
            floor = self.floors.get((name, guaranteed))
            if floor is None:
                floor = self.floors[(name, guaranteed)] = floor_of(self.session, name, guaranteed)
            a = self.session.quota.alloc[name]
            found = self._slack[(name, guaranteed)] = (a[0] - floor[0], a[1] - floor[1],
                                                       a[2] - floor[2])
        return found

    def over_caps(self, victims: list[WorkloadState], request: ResourceRequest) -> bool:
        """Would evicting ``victims`` and placing the pod ``request`` leave one of the
        reclaimer's departments above its cap (the test ``run`` makes in the end)? Victims of a
        relative lower the departments they share with the reclaimer; those of another
        department do not, so there the pod grows the reclaimer's department. Per pod, not per
        gang: the search makes room one pod at a time (each round's evictions are in the
        allocations already), and ``run`` checks the whole outcome."""
        alloc, governed = self.session.quota.alloc, self.governed
        demand = self.session.quota.demand(request)
        for name in self.ws.chain[1:]:
            cap, a = self.caps[name], alloc[name]
            for r in governed:
                if demand[r] <= 0:
                    continue
                freed = sum(v.vector()[r] for v in victims if name in v.chain)
                if a[r] + demand[r] - freed > cap[r] + EPS:
                    return True
        return False

    def within_caps(self, demand: Vector) -> bool:
        return self.session.quota.check(self.ws, demand, fair_caps=self.caps) is None

    # -- evicting ----------------------------------------------------------------------------------

    def evict(self, v: WorkloadState) -> None:
        """Evict ``v`` (undone with the statement), saying what its project keeps."""
        session, ws = self.session, self.ws
        self._evicted += v.vector()[0]
        self._slack.clear()
        self._blocked.clear()
        self._takes.clear()
        share_v = session.quota.shares.gpu(v.project)
        keeps = f"its fair share ({format_gpus(share_v)} GPUs)"
        if session.quota.alloc[v.project][0] - v.vector()[0] < share_v - EPS:
            keeps = f"its deserved quota ({format_gpus(self.tree[v.project].gpu.deserved_amount)} GPUs)"
        session.evict(
            v,
            "reclaim",
            f"reclaimed for {ws.spec.label}: project {ws.project} is below its fair share of "
            f"{format_gpus(session.quota.shares.gpu(ws.project))} GPUs, and project {v.project} "
            f"stays at or above {keeps}",
            ws.id,
        )
