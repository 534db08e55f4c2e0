"""Choosing which running workloads to evict (or move) so that a pending one fits.

The search is node-targeted: when a pod does not fit, look at the nodes that hold eligible
victims (in the order the action prefers them) and, on each, take victims in that order until
the pod would fit there, counting only what those victims free on that node. The node that
needs the fewest GPUs freed wins (ties: the node whose victims come first). Evict those, try
the whole workload again, repeat. Afterwards the caller puts back every victim whose pods still
fit where they were, so the victims kept are only the ones that made room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tessera.core.constraints import NodeConstraint
from tessera.core.fairshare import EPS, Vector
from tessera.core.model import GpuKind, ResourceRequest
from tessera.core.state import NodeState, Placement

from .room_fit import at_least, fewest, fits_after, free_all_on, free_on
from .room_seen import RoomSeen
from .session import PodPlacements, Session, Statement, WorkloadState

Tentative = dict[str, list[float]]
"""GPU/CPU/memory a search has tentatively taken from each project (and its ancestors)."""

Allow = Callable[[WorkloadState, Tentative], bool]


class NodeIndex:
    """Eligible victims grouped by the nodes their pods run on, in preference order."""

    def __init__(self, victims: Iterable[WorkloadState], like: NodeIndex | None = None) -> None:
        """``like``: another index over the same victims (in another order) whose pruning
        this one shares, since what is pruned does not depend on the order."""
        by_node: dict[str, list[WorkloadState]] = {}
        get = by_node.get
        for v in victims:
            for p in v.placements:
                if p is None:
                    continue
                group = get(p.node)
                if group is None:
                    by_node[p.node] = [v]
                elif group[-1] is not v:
                    group.append(v)
        self.by_node = by_node
        self._gpus: dict[str, tuple[float, ...]] = {}
        self.request_ids: dict[ResourceRequest, int] = {} if like is None else like.request_ids
        self.room_seen: dict[str, RoomSeen] = {} if like is None else like.room_seen
        """Memo of the "would every victim left make room" test: (node's state signature,
        those victims, answer), reused while neither changed."""
        self.pruned: set[str] = set() if like is None else like.pruned
        self.no_room: dict[ResourceRequest, set[str]] = {} if like is None else like.no_room
        """Nodes where even every live victim would not make room for that request."""

    def request_id(self, request: ResourceRequest) -> int:
        """A small number per distinct request (equal requests, equal numbers)."""
        found = self.request_ids.get(request)
        if found is None:
            found = self.request_ids[request] = len(self.request_ids)
        return found

    def gpus(self, node: str) -> tuple[float, ...]:
        """The GPUs each victim on ``node`` counts (its ``vector()[0]``, which stays as it is
        while it is a victim: it runs where it ran, or is evicted and put back there)."""
        found = self._gpus.get(node)
        if found is None:
            found = self._gpus[node] = tuple(v.vector()[0] for v in self.by_node[node])
        return found

    def prune(self, session: Session, node: str) -> None:
        """Skip a node whose victims are all gone; a discarded statement brings it back."""
        self.pruned.add(node)

        def undo() -> None:
            self.pruned.discard(node)

        session.on_undo(undo)

    def mark_no_room(self, session: Session, request: ResourceRequest, node: str) -> None:
        nodes = self.no_room.setdefault(request, set())
        nodes.add(node)

        def undo() -> None:
            nodes.discard(node)

        session.on_undo(undo)

    def unprune(self, v: WorkloadState, placements: Iterable[Placement | None] | None = None) -> None:
        """A victim put back or evicted: its nodes must be looked at again."""
        for p in v.placements if placements is None else placements:
            if p is not None:
                self.pruned.discard(p.node)
                for nodes in self.no_room.values():
                    nodes.discard(p.node)


def take(tentative: Tentative, v: WorkloadState) -> None:
    vec = v.vector()
    for name in v.chain:
        t = tentative.setdefault(name, [0.0, 0.0, 0.0])
        t[0] += vec[0]
        t[1] += vec[1]
        t[2] += vec[2]


def cheapest_node(
    session: Session,
    request: ResourceRequest,
    index: NodeIndex,
    allow: Allow,
    *,
    pod_level: bool = False,
    dead: Callable[[WorkloadState], bool] | None = None,
    constraint: NodeConstraint | None = None,
    blocked: Callable[[str], bool] | None = None,
    dead_above: Callable[[str], float] | None = None,
    budget: float = float("inf"),
    takes_up_to: Callable[[str], float] | None = None,
    over_caps: Callable[[list[WorkloadState], ResourceRequest], bool] | None = None,
) -> list[WorkloadState] | list[tuple[WorkloadState, int]] | None:
    """Victims on the one node where freeing the fewest GPUs lets ``request`` fit.

    With ``pod_level`` the result is (workload, pod) pairs on that node (for moves); otherwise
    whole workloads, all of whose pods would go. Nodes ``constraint`` (the pending pod's) does
    not allow are not considered. ``dead`` says a victim can no longer be taken
    by anyone for the rest of the action (unless the statement is discarded); nodes with only
    such victims are pruned from the index.

    ``blocked(project)`` says ``allow`` refuses every GPU-holding victim of that project,
    whatever was taken before: asked once per project and call, it stands in for ``allow``
    on those victims (the same answer, without asking per victim). Likewise
    ``dead_above(project)``, with ``dead``: the GPUs above which a victim of that project is
    dead (``dead(v)`` is ``v``'s GPUs > that), asked once per project and call.

    ``takes_up_to(project)``: with ``blocked`` and GPU-only rules, the most GPUs a victim of
    that project may hold for ``allow`` to take it when nothing was taken yet (negative: none).
    A node where no project's smallest victim is within that has no victim this search may
    take; it is handled without asking per victim (the same outcome: only the pruning and the
    no-room marks, the latter memoised per node state).

    ``budget``: GPUs the caller may still evict (reclaim: what the reclaimer is owed). Nodes
    and victim sets within it come before those above it; among equals, fewer workloads, then
    fewer GPUs.

    ``over_caps(victims, request)``: the caller's own rules would refuse the outcome of evicting
    these and placing ``request`` (reclaim: the reclaimer's departments would end above their
    caps). Such sets rank after
    every set that passes, and only sets that pass count towards the four feasible nodes.
    """
    nodes_budget = session.config.max_victim_nodes
    best: tuple[float, int, list[tuple[WorkloadState, int]], tuple[bool, bool, int]] | None = None
    examined = 0
    scanned = 0
    feasible = 0
    gpu = request.gpu
    # No node makes room by freeing fewer GPUs than the pod takes: stop at one that does.
    floor = session.quota.demand(request)[0] + EPS
    gone: list[str] = []
    pruned = index.pruned
    skip: list[set[str]] = []
    if dead is not None:
        skip = [nodes for shape, nodes in index.no_room.items() if nodes and at_least(request, shape)]
    models_ok: dict[int, bool] = {}
    nodes = session.state.by_name
    rid = index.request_id(request)
    refused: dict[str, bool] = {}

    limits: dict[str, float] = {}

    def is_dead(v: WorkloadState) -> bool:
        if dead_above is None:
            assert dead is not None
            return dead(v)
        limit = limits.get(v.project)
        if limit is None:
            limit = limits[v.project] = dead_above(v.project)
        return v.vector()[0] > limit

    def is_refused(project: str) -> bool:
        found = refused.get(project)
        if found is None:
            assert blocked is not None
            found = refused[project] = blocked(project)
        return found

    bounds: dict[str, tuple[float, float]] = {}
    """Per project, for ``untakable``: (the most GPUs a victim may hold to be taken, -1 if the
    project is refused; the most it may hold not to be dead), asked once per project and call."""
    gpus_on = index.gpus

    def untakable(node: str, group: list[WorkloadState]) -> list[WorkloadState] | None:
        """The victims left on a node (not evicted, not dead) if this search may take none of
        them, else None."""
        assert takes_up_to is not None
        others: list[WorkloadState] = []
        for v, g in zip(group, gpus_on(node), strict=True):
            if v.evicted:
                continue
            project = v.project
            bound = bounds.get(project)
            if bound is None:
                take_limit = -1.0 if is_refused(project) else takes_up_to(project)
                if dead is None:
                    dead_limit = float("inf")
                elif dead_above is None:
                    dead_limit = float("nan")  # ask ``dead`` per victim
                else:
                    dead_limit = limits[project] if project in limits else dead_above(project)
                    limits[project] = dead_limit
                bound = bounds[project] = (take_limit, dead_limit)
            if g <= 0 or g <= bound[0]:
                return None
            if g <= bound[1] or (bound[1] != bound[1] and dead is not None and not dead(v)):
                others.append(v)
        return others

    # Nodes marked during this call are behind the scan: one set for the call is the same.
    skip_set: set[str] = skip[0] if len(skip) == 1 else set().union(*skip)
    for order, (node, group) in enumerate(index.by_node.items()):
        if node in pruned or node in skip_set:
            continue
        scanned += 1
        if scanned > 4 * nodes_budget:
            break
        ns = nodes[node]
        if constraint is not None and not session.node_allowed(constraint, ns):
            continue
        if gpu.kind is not GpuKind.NONE:
            ok = models_ok.get(ns.static_id)
            if ok is None:
                ok = models_ok[ns.static_id] = any(gpu.allows(m) for m in ns.dev_models)
            if not ok:
                continue
        untaken = untakable(node, group) if takes_up_to is not None and not pod_level else None
        if untaken is not None:
            if not untaken:
                gone.append(node)
            elif dead is not None and not _room_with(session, index, ns, request, untaken, rid):
                index.mark_no_room(session, request, node)
            if examined >= nodes_budget or feasible >= 4 or (
                    best is not None and best[3] <= (False, False, 1) and best[0] <= floor):
                break
            continue
        free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
        tenants = list(ns.dev_tenants)
        compute = list(ns.dev_compute)
        cpu, mem = ns.free_cpu, ns.free_mem
        tentative: Tentative = {}
        chosen: list[tuple[WorkloadState, int]] = []
        cost = 0.0
        counted = False
        live = False
        others: list[WorkloadState] = []
        for v in group:
            if v.evicted:
                continue
            if blocked is not None and v.vector()[0] > 0 and is_refused(v.project):
                if dead is None or not is_dead(v):
                    others.append(v)
                continue
            if not allow(v, tentative):
                if dead is None or not is_dead(v):
                    others.append(v)
                continue
            live = True
            if not counted:
                examined += 1  # the budget counts nodes with a victim this search may take
                counted = True
            take(tentative, v)
            for i, p in enumerate(v.placements):
                if p is None or p.node != node:
                    continue
                free_on(p, free, tenants, compute)
                cpu += p.cpu_milli
                mem += p.memory
                chosen.append((v, i))
                vec = v.pod_vectors[i]
                cost += vec[0] if pod_level and vec is not None else 0.0
            if not pod_level:
                cost += v.vector()[0]
            if fits_after(ns, request, free, tenants, cpu, mem, compute):
                if not pod_level:
                    # The other victims here of the projects already taken from, if this
                    # search may take them too: the fewest of them that make room (within the
                    # budget if possible), not the first ones in preference order. (Other
                    # projects stay out: the preference order between projects keeps the
                    # reclaimer's department within its share.)
                    pool = list(chosen)
                    mine = {x.project for x, _ in chosen}
                    for w in group:
                        if w.evicted or w.project not in mine or any(w is x for x, _ in pool) \
                                or not allow(w, tentative):
                            continue
                        take(tentative, w)
                        pool.extend((w, i) for i, q in enumerate(w.placements)
                                    if q is not None and q.node == node)
                    chosen, cost = fewest(ns, request, pool, budget)
                # Moves (pod_level) rank by GPUs moved alone, as before; evictions by
                # (over the caller's caps, beyond the budget, workloads), then GPUs.
                if pod_level:
                    rank = (False, False, 0)
                else:
                    taken = list(dict.fromkeys(w for w, _ in chosen))
                    over = over_caps is not None and over_caps(taken, request)
                    rank = (over, cost > budget + EPS, len(taken))
                if not rank[0]:
                    feasible += 1
                if best is None or rank < best[3] or (rank == best[3] and cost < best[0] - EPS):
                    best = (cost, order, chosen, rank)
                break
        else:
            if not live and not others:
                gone.append(node)
            elif dead is not None:
                # Would even every victim left here make room? (Quota rules aside.)
                more_cpu, more_mem = free_all_on(node, others, free, tenants, compute)
                cpu += more_cpu
                mem += more_mem
                if not fits_after(ns, request, free, tenants, cpu, mem, compute):
                    index.mark_no_room(session, request, node)
        if examined >= nodes_budget or feasible >= 4 or (
                best is not None and best[3] <= (False, False, 1) and best[0] <= floor):
            break
    for node in gone:
        index.prune(session, node)
    if best is None:
        return None
    if pod_level:
        return best[2]
    return list(dict.fromkeys(v for v, _ in best[2]))


def _room_with(session: Session, index: NodeIndex, ns: NodeState, request: ResourceRequest,
               others: list[WorkloadState], rid: int) -> bool:
    """Would ``request`` fit on ``ns`` with every pod of ``others`` there gone? What the node
    would have free is memoised per node, and each request's answer with it, while the node's
    state (its signature object, renewed on every change) and the victims are the same.
    ``rid``: ``index.request_id(request)``, the answers' key (hashing the request per node
    visited cost more than the test it saved)."""
    sig = ns.signature()
    ids = tuple(map(id, others))
    seen = index.room_seen.get(ns.name)
    if seen is None or seen.sig is not sig or seen.victims != ids:
        free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
        tenants = list(ns.dev_tenants)
        compute = list(ns.dev_compute)
        more_cpu, more_mem = free_all_on(ns.name, others, free, tenants, compute)
        seen = index.room_seen[ns.name] = RoomSeen(
            sig, ids, free, tenants, ns.free_cpu + more_cpu, ns.free_mem + more_mem, compute, {})
    fits = seen.answers.get(rid)
    if fits is None:
        fits = seen.answers[rid] = fits_after(ns, request, seen.free, seen.tenants,
                                                   seen.cpu, seen.mem, seen.compute)
    return fits


def evict_until_fits(
    session: Session,
    ws: WorkloadState,
    index: NodeIndex | Callable[[], NodeIndex],
    allow: Allow,
    evict: Callable[[WorkloadState], None],
    extra_ok: Callable[[Vector], bool] | None,
    max_rounds: int,
    dead: Callable[[WorkloadState], bool] | None = None,
    blocked: Callable[[str], bool] | None = None,
    dead_above: Callable[[str], float] | None = None,
    budget: Callable[[], float] | None = None,
    takes_up_to: Callable[[str], float] | None = None,
    over_caps: Callable[[list[WorkloadState], ResourceRequest], bool] | None = None,
) -> tuple[PodPlacements, list[WorkloadState]] | None:
    """Evict (through ``evict``) until the workload's gang fits, then place it.

    Runs inside the caller's statement; on None the caller discards it. ``index`` may be a
    function giving it, called only when a node search is needed.
    """
    evicted: list[WorkloadState] = []
    for _ in range(max_rounds):
        placed, fail, _ = session.place_pods(ws, extra_ok)
        if placed:
            return placed, evicted
        if fail is None:
            return None
        if not isinstance(index, NodeIndex):
            index = index()
        chosen = cheapest_node(session, fail, index, allow, dead=dead,
                               constraint=session.constraint_for(ws, fail), blocked=blocked,
                               dead_above=dead_above,
                               budget=float("inf") if budget is None else budget(),
                               takes_up_to=takes_up_to, over_caps=over_caps)
        if not chosen:
            return None
        for v in chosen:
            assert isinstance(v, WorkloadState)
            evict(v)
            evicted.append(v)
    return None


def drop_needless(session: Session, evicted: list[WorkloadState], ok: Callable[[], bool]) -> list[WorkloadState]:
    """Put back victims (last chosen first) whose pods still fit where they were and for which
    ``ok`` still holds afterwards; return the ones that stay evicted."""
    kept: list[WorkloadState] = []
    for v in reversed(evicted):
        stmt = Statement(session)
        if session.restore(v) and ok():
            stmt.commit()
            continue
        stmt.discard()
        kept.append(v)
    kept.reverse()
    return kept
