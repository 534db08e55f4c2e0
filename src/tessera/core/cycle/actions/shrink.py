"""shrink: elastic workloads give back their elastic pods before anyone is evicted whole.

An elastic workload runs between its gang minimum (``Workload.min_members``: ``--min-workers``,
``--min-gpus``, a PodGroup's ``minMember``) and its size (``--workers``, ``--max-gpus``, its
pods). It starts with its minimum when that fits and grows into idle capacity (allocate and
backfill place its further pods one by one). When a waiting workload whose project is within
its fair share finds no room, this action (run before reclaim) takes elastic pods back from
running workloads of *other* projects, newest pod first, one at a time, while the donor's
project (and each of its ancestors that is not the reclaimer's) stays at or above its fair share
(Run:ai's semi-preemptible workloads: the part within the project's deserved quota, which its
fair share always covers, is never taken; the part above it is). A donor's minimum is never
touched here; reclaim may still evict a whole workload afterwards, under its own rules.

Donors are preemptible, running, past their reclaim minimum runtime and not otherwise changed in
this plan. Preferred: lower project priority, the project most over its share, lower workload
priority, most recently started. The outcome is kept only if the waiting workload is then
placed and the GPUs taken do not exceed the GPUs placed plus what its project is still owed; the
pods taken come out as an ``Eviction`` of the donor with ``pods`` set (action ``shrink``) and
the donor keeps running with the rest.
"""

from __future__ import annotations

from tessera.core.cycle.anchors import shrinkable
from tessera.core.cycle.session import Session, Statement, WorkloadState
from tessera.core.cycle.types import Eviction
from tessera.core.cycle.workload_state import PodPlacements
from tessera.core.fairshare import EPS

from .allocate import Shape, gang_demand, shape

_TRIES = ("placement", "fair-share")


def elastic_pods(ws: WorkloadState) -> list[int]:
    """Its placed pods beyond the gang minimum that it had when the cycle began, newest (highest
    index) first, never an anchor (cycle.anchors): the ones it can give back and keep running."""
    placed = [i for i, p in enumerate(ws.placements) if p is not None and ws.spec.placement_of(i) is not None]
    return shrinkable(ws.spec.anchors, sorted(placed, reverse=True))[: max(0, len(placed) - ws.spec.gang_min)]


class Shrink:
    name = "shrink"

    def execute(self, session: Session) -> None:
        # Cheap test first: most workloads are not elastic (minimum = size), and then this
        # action costs one pass over the workloads and nothing else.
        donors = [v for v in session.workloads.values()
                  if v.was_running and v.spec.gang_min < len(v.spec.pods)
                  and session.evictable(v, "reclaim") and elastic_pods(v)]
        if not donors:
            return
        waiting = session.waiting_after(_TRIES)
        if not waiting:
            return
        quota = session.quota
        ratio = {v.project: quota.alloc[v.project][0] / max(quota.shares.gpu(v.project), EPS)
                 for v in donors}
        donors.sort(key=lambda v: (session.tree[v.project].priority, -ratio[v.project], v.priority,
                                   -(v.spec.started_at or 0.0), v.id))
        failed: set[tuple[str, Shape]] = set()
        for ws in quota.fair_order(waiting):
            key = (ws.project, shape(ws))
            if key in failed or not ws.unplaced() or ws.required() == 0:
                continue
            demand = gang_demand(session, ws)
            if quota.check(ws, demand) is not None:
                continue  # beyond its fair share (or a limit): not owed anything
            budget = demand[0] + quota.shortfall(ws.project)
            if not _ShrinkFor(session, ws, [v for v in donors if v.project != ws.project], budget).run():
                failed.add(key)  # the same shape of the same project fails alike this action


class _ShrinkFor:
    def __init__(self, session: Session, ws: WorkloadState, donors: list[WorkloadState],
                 budget: float) -> None:
        """``budget``: the most GPUs that may be taken (what it places plus what it is owed); the
        search stops there, as an outcome taking more would be refused anyway."""
        self.session = session
        self.ws = ws
        self.donors = donors
        self.budget = budget

    def _may_give(self, v: WorkloadState, gpus: float) -> bool:
        """After giving ``gpus``, the donor's project and its ancestors that are not the
        reclaimer's stay at or above their fair share."""
        quota = self.session.quota
        mine = set(self.ws.chain)
        for name in v.chain:
            if name in mine:
                break
            if quota.alloc[name][0] - gpus < quota.shares.gpu(name) - EPS:
                return False
        return True

    def run(self) -> bool:
        session, ws = self.session, self.ws
        stmt = Statement(session)
        taken: dict[str, list[tuple[int, float]]] = {}
        freed = 0.0
        for v in self.donors:
            if v.evicted or session.settled(v):
                continue
            for i in elastic_pods(v):
                vec = v.pod_vectors[i]
                gpus = 0.0 if vec is None else vec[0]
                if freed + gpus > self.budget + EPS:
                    stmt.discard()
                    return False
                if not self._may_give(v, gpus):
                    break
                session.release_pod(v, i)
                taken.setdefault(v.id, []).append((i, gpus))
                freed += gpus
                placed, _, _ = session.place_pods(ws)
                if placed:
                    return self._keep(stmt, placed, freed, taken)
        stmt.discard()
        return False

    def _keep(self, stmt: Statement, placed: PodPlacements, freed: float,
              taken: dict[str, list[tuple[int, float]]]) -> bool:
        session, ws = self.session, self.ws
        if freed > ws.vector()[0] + session.quota.shortfall(ws.project) + EPS:
            stmt.discard()  # more than it is owed
            return False
        for vid, pods in taken.items():
            v = session.workloads[vid]
            reason = (f"shrunk by {len(pods)} elastic pod(s) (to {v.placed_count()} of "
                      f"{len(v.spec.pods)}, minimum {v.spec.gang_min}) to make room for {ws.spec.label} "
                      f"of project {ws.project}, which is below its fair share")
            session.evictions[vid] = Eviction(vid, v.project, "shrink", reason, sum(g for _, g in pods),
                                              ws.id, tuple(sorted(i for i, _ in pods)))
            session.moved.add(vid)  # changed in this plan: not evicted, moved or shrunk again

            def undo(vid: str = vid) -> None:
                session.evictions.pop(vid, None)
                session.moved.discard(vid)

            session.on_undo(undo)
        session.record_binding(ws, placed, "shrink", f"placed on {session.where(placed)} by shrinking "
                               f"{', '.join(sorted(session.workloads[v].spec.label for v in taken))}", sorted(taken))
        stmt.commit()
        return True
