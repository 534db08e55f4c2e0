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

from tessera.core.cycle.session import Session, Statement, Wait, WorkloadState
from tessera.core.cycle.victims import NodeIndex, Tentative, drop_needless, evict_until_fits
from tessera.core.fairshare import EPS, Vector
from tessera.core.projects import Resource
from tessera.core.units import format_gpus

from .allocate import Shape, gang_demand, shape

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


def floor_of(session: Session, name: str, guaranteed: bool) -> Vector:
    """What a victim-side project must keep: its fair share, or, when the reclaimer only takes
    back its deserved quota, the smaller of fair share and deserved quota."""
    share = session.shares.share[name]
    if not guaranteed:
        return share
    d = session.deserved[name]
    return (min(share[0], d[0]), min(share[1], d[1]), min(share[2], d[2]))


def over_floor(session: Session, project: str) -> bool:
    a = session.alloc[project]
    floor = floor_of(session, project, guaranteed=True)
    return any(a[r] > floor[r] + EPS for r in session.tree.governed)


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
            and over_floor(session, v.project)
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

        failed: set[tuple[str, Shape]] = set()
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
        governed = tree.governed
        gpu_only = governed == (Resource.GPU,)
        demand = gang_demand(session, ws)
        sides: dict[str, tuple[tuple[str, ...], bool]] = {}

        def victim_side(v: WorkloadState) -> tuple[tuple[str, ...], bool]:
            """The victim's projects below the lowest common ancestor with the reclaimer, and
            whether the reclaimer's own side stays within deserved quota (then victims need
            only keep min(fair share, deserved), KAI's GuaranteeDeservedQuota)."""
            found = sides.get(v.project)
            if found is None:
                lca = tree.lowest_common_ancestor(v.project, ws.project)
                chain = tree.chain(v.project)
                mine = ws.chain if lca is None else ws.chain[: ws.chain.index(lca)]
                guaranteed = all(
                    demand[r] <= 0 or session.alloc[name][r] + demand[r] <= tree[name].quota(r).deserved_amount + EPS
                    for name in mine
                    for r in governed
                )
                found = sides[v.project] = (chain if lca is None else chain[: chain.index(lca)], guaranteed)
            return found

        slack: dict[tuple[str, bool], Vector] = {}
        """How far each victim-side project is above what it must keep; only evictions change it."""

        def slack_of(name: str, guaranteed: bool) -> Vector:
            found = slack.get((name, guaranteed))
            if found is None:
                a, floor = session.alloc[name], floor_of(session, name, guaranteed)
                found = slack[(name, guaranteed)] = (a[0] - floor[0], a[1] - floor[1], a[2] - floor[2])
            return found

        blocked: dict[str, bool] = {}
        """GPU-only: projects none of whose GPU victims this reclaimer may take (until an eviction)."""
        drained: dict[str, bool] = {}
        """GPU-only: projects with no GPU left to give anyone."""

        def allow(v: WorkloadState, tentative: Tentative) -> bool:
            if v.project == ws.project:
                return False
            vec = v.vector()
            side, guaranteed = victim_side(v)
            if gpu_only:
                g = vec[0]
                if g <= 0:
                    return True
                stop = blocked.get(v.project)
                if stop is None:
                    stop = blocked[v.project] = any(slack_of(name, guaranteed)[0] <= EPS for name in side)
                if stop:
                    return False
                for name in side:
                    t = tentative.get(name)
                    if g + (t[0] if t else 0.0) > slack_of(name, guaranteed)[0] + EPS:
                        return False
                return True
            for name in side:
                room = slack_of(name, guaranteed)
                t = tentative.get(name)
                for r in governed:
                    if vec[r] > 0 and vec[r] + (t[r] if t else 0.0) > room[r] + EPS:
                        return False
            return True

        def dead(v: WorkloadState) -> bool:
            """Its own project could not give it up to anyone: reclaim only lowers that slack."""
            vec = v.vector()
            if gpu_only:
                if vec[0] <= 0:
                    return False
                empty = drained.get(v.project)
                if empty is None:
                    empty = drained[v.project] = slack_of(v.project, True)[0] <= EPS
                return empty or vec[0] > slack_of(v.project, True)[0] + EPS
            room = slack_of(v.project, True)
            return any(vec[r] > 0 and vec[r] > room[r] + EPS for r in governed)

        def evict(v: WorkloadState) -> None:
            index.unprune(v)
            slack.clear()
            blocked.clear()
            drained.clear()
            share_v = session.shares.gpu(v.project)
            keeps = f"its fair share ({format_gpus(share_v)} GPUs)"
            if session.alloc[v.project][0] - v.vector()[0] < share_v - EPS:
                keeps = f"its deserved quota ({format_gpus(tree[v.project].gpu.deserved_amount)} GPUs)"
            session.evict(
                v,
                "reclaim",
                f"reclaimed for {ws.spec.label}: project {ws.project} is below its fair share of "
                f"{format_gpus(session.shares.gpu(ws.project))} GPUs, and project {v.project} "
                f"stays at or above {keeps}",
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
