"""reclaim: a project below its fair share takes resources back from projects above theirs.

For each waiting workload whose project (and ancestors) would stay within fair share, the
victims are preemptible, running workloads of other projects, not protected by their minimum
runtime. A victim may go only if, after it, its project and each ancestor below the common
ancestor with the reclaimer stay at or above their fair share (KAI's MaintainFairShare).
Victims are preferred from lower-priority projects, then the closest relatives of the reclaimer
in the tree, then the project most over its share, lower workload priority, most recently
started. The outcome is kept only if the workload
then fits, and if the GPUs evicted do not exceed the GPUs placed plus what the reclaiming
project is still short of its fair share afterwards (so nothing is evicted that the reclaimer
is not owed). Non-preemptible workloads are never victims.
"""

from __future__ import annotations

from tessera.core.cycle.session import Session, Statement, Wait, WorkloadState
from tessera.core.cycle.victims import NodeIndex, Tentative, drop_needless, evict_until_fits
from tessera.core.fairshare import EPS, Vector
from tessera.core.model import ResourceRequest
from tessera.core.projects import Resource
from tessera.core.units import format_gpus

from .allocate import gang_demand, shape

_TRIES = ("placement", "fair-share")


def reclaimer_caps(session: Session, ws: WorkloadState) -> dict[str, Vector]:
    """The reclaiming project must end within its fair share; its ancestors must end within
    theirs or no higher than now (reclaim between siblings does not grow their parent)."""
    caps: dict[str, Vector] = {}
    for name in ws.chain:
        share = session.shares.share[name]
        if name == ws.project:
            caps[name] = share
        else:
            a = session.alloc[name]
            caps[name] = (max(a[0], share[0]), max(a[1], share[1]), max(a[2], share[2]))
    return caps


def over_share(session: Session, project: str) -> bool:
    a = session.alloc[project]
    share = session.shares.share[project]
    return any(a[r] > share[r] + EPS for r in session.tree.governed)


class Reclaim:
    name = "reclaim"

    def execute(self, session: Session) -> None:
        waiting = [
            ws
            for ws in session.pending
            if ws.unplaced() and ws.required() > 0 and getattr(session.waits.get(ws.id), "kind", "") in _TRIES
        ]
        if not waiting:
            return
        tree = session.tree
        victims = [
            v
            for v in session.workloads.values()
            if v.was_running
            and v.preemptible
            and not v.evicted
            and not session.settled(v)
            and over_share(session, v.project)
            and not session.protected(v, "reclaim")
        ]
        if not victims:
            return

        ratio: dict[str, float] = {}
        for v in victims:
            share = session.shares.gpu(v.project)
            ratio[v.project] = session.alloc[v.project][0] / share if share > EPS else float("inf")
        indexes: dict[tuple[str, ...], NodeIndex] = {}

        def index_for(ws: WorkloadState) -> NodeIndex:
            """Victims in preference order for reclaimers under these ancestors: lower project
            priority first; then the closest relatives (a sibling only has to stay at its own
            fair share, a cousin's department too); then the most over its share, lower
            workload priority, most recently started."""
            ancestors = ws.chain[1:]
            index = indexes.get(ancestors)
            if index is None:
                near = set(ancestors)

                def preference(v: WorkloadState) -> tuple[object, ...]:
                    closeness = sum(1 for name in v.chain if name in near)
                    return (
                        tree[v.project].priority,
                        -closeness,
                        -ratio[v.project],
                        v.priority,
                        -(v.spec.started_at or 0.0),
                        v.id,
                    )

                like = next(iter(indexes.values()), None)
                index = indexes[ancestors] = NodeIndex(sorted(victims, key=preference), like)
            return index

        failed: set[tuple[str, tuple[tuple[ResourceRequest, ...], int]]] = set()
        for ws in session.fair_order(waiting):
            key = (ws.project, shape(ws))
            if key in failed or not ws.unplaced():
                continue
            if session.quota_check(ws, gang_demand(session, ws), fair_caps=_leaf_only(session, ws)) is not None:
                continue
            if not self._try(session, ws, index_for(ws)):
                failed.add(key)

    def _try(self, session: Session, ws: WorkloadState, index: NodeIndex) -> bool:
        tree = session.tree
        lca_cache: dict[str, tuple[str, ...]] = {}

        def victim_side(v: WorkloadState) -> tuple[str, ...]:
            side = lca_cache.get(v.project)
            if side is None:
                lca = tree.lowest_common_ancestor(v.project, ws.project)
                chain = tree.chain(v.project)
                side = chain if lca is None else chain[: chain.index(lca)]
                lca_cache[v.project] = side
            return side

        slack: dict[str, Vector] = {}
        """How far above its fair share each victim-side project is; only evictions change it."""
        governed = tree.governed
        gpu_only = governed == (Resource.GPU,)

        def slack_of(name: str) -> Vector:
            found = slack.get(name)
            if found is None:
                a, share = session.alloc[name], session.shares.share[name]
                found = slack[name] = (a[0] - share[0], a[1] - share[1], a[2] - share[2])
            return found

        def allow(v: WorkloadState, tentative: Tentative) -> bool:
            if v.project == ws.project:
                return False
            vec = v.vector()
            if gpu_only:
                g = vec[0]
                if g <= 0:
                    return True
                for name in victim_side(v):
                    t = tentative.get(name)
                    if g + (t[0] if t else 0.0) > slack_of(name)[0] + EPS:
                        return False
                return True
            for name in victim_side(v):
                room = slack_of(name)
                t = tentative.get(name)
                for r in governed:
                    if vec[r] > 0 and vec[r] + (t[r] if t else 0.0) > room[r] + EPS:
                        return False
            return True

        def dead(v: WorkloadState) -> bool:
            """Its own project could not give it up to anyone: reclaim only lowers that slack."""
            room = slack_of(v.project)
            vec = v.vector()
            if gpu_only:
                return vec[0] > 0 and vec[0] > room[0] + EPS
            return any(vec[r] > 0 and vec[r] > room[r] + EPS for r in governed)

        def evict(v: WorkloadState) -> None:
            index.unprune(v)
            slack.clear()
            share_v = session.shares.gpu(v.project)
            session.evict(
                v,
                "reclaim",
                f"reclaimed for {ws.spec.label}: project {ws.project} is below its fair share of "
                f"{format_gpus(session.shares.gpu(ws.project))} GPUs, and project {v.project} "
                f"stays at or above its own ({format_gpus(share_v)} GPUs)",
                ws.id,
            )

        caps = reclaimer_caps(session, ws)

        def extra_ok(demand: Vector) -> bool:
            return session.quota_check(ws, demand, fair_caps=caps) is None

        stmt = Statement(session)
        result = evict_until_fits(
            session, ws, index, allow, evict, extra_ok, max_rounds=4 * ws.required() + 4, dead=dead
        )
        if result is None:
            stmt.discard()
            previous = session.waits.get(ws.id)
            base = previous.reason if previous is not None else "no room"
            kind = previous.kind if previous is not None else "placement"
            request = previous.request if previous is not None else None
            suffix = "; reclaim found no over-share workloads whose eviction makes room"
            session.wait(ws, Wait(kind, base + suffix, request))
            return False
        placed, evicted = result
        if not session.within(ws.chain, caps):
            stmt.discard()
            return False
        kept = drop_needless(session, evicted, lambda: session.within(ws.chain, caps))
        for v in set(evicted) - set(kept):
            index.unprune(v)
        evicted_gpus = sum(session.evictions[v.id].gpus for v in kept)
        placed_gpus = sum(session.placement_vector(p)[0] for _, p in placed)
        if evicted_gpus > placed_gpus + session.shortfall(ws.project) + EPS:
            stmt.discard()
            session.wait(
                ws,
                Wait(
                    "placement",
                    f"making room needs {format_gpus(evicted_gpus)} GPUs evicted to place "
                    f"{format_gpus(placed_gpus)}, more than project {ws.project} is owed",
                ),
            )
            return False
        message = f"placed on {session.where(placed)} by reclaiming from {', '.join(v.id for v in kept) or 'nobody'}"
        session.record_binding(ws, placed, "reclaim", message, [v.id for v in kept])
        stmt.commit()
        return True


def _leaf_only(session: Session, ws: WorkloadState) -> dict[str, Vector]:
    inf = float("inf")
    return {name: session.shares.share[name] if name == ws.project else (inf, inf, inf) for name in ws.chain}
