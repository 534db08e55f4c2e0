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
from functools import cache, partial

from tessera.core.constraints import NodeConstraint
from tessera.core.fairshare import EPS, Vector
from tessera.core.model import GpuKind, ResourceRequest
from tessera.core.state import NodeState

from .room_fit import at_least, fewest, fits_after, free_on
from .scan_prefix import COUNTED, LOOKED, SKIPPED, ScanPrefix
from .session import PodPlacements, Session, Statement, WorkloadState
from .victim_index import NO_ROOM, NO_ROOM_TAKING, NOTHING_TAKEABLE, SCAN, Entry, NodeIndex

__all__ = [
    "NOTHING_TAKEABLE",
    "NO_ROOM",
    "NO_ROOM_TAKING",
    "SCAN",
    "Allow",
    "Entry",
    "NodeIndex",
    "Tentative",
    "cheapest_node",
    "drop_needless",
    "evict_until_fits",
    "take",
]

Tentative = dict[str, list[float]]
"""GPU/CPU/memory a search has tentatively taken from each project (and its ancestors)."""

Allow = Callable[[WorkloadState, Tentative], bool]


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
    constraint: NodeConstraint | None = None,
    blocked: Callable[[str], bool] | None = None,
    budget: float = float("inf"),
    takes_up_to: Callable[[str], float] | None = None,
    over_caps: Callable[[list[WorkloadState], ResourceRequest], bool] | None = None,
    takeable_only: bool = False,
) -> list[WorkloadState] | list[tuple[WorkloadState, int]] | None:
    """Victims on the one node where freeing the fewest GPUs lets ``request`` fit.

    With ``pod_level`` the result is (workload, pod) pairs on that node (for moves); otherwise
    whole workloads, all of whose pods would go. Nodes ``constraint`` (the pending pod's) does
    not allow are not considered.

    ``takeable_only`` (reclaim): the scan counts towards ``max_victim_nodes`` only the nodes
    with a victim this search may take (``allow`` with nothing taken yet) where the request
    would fit with every victim gone (``NodeIndex.no_room_even_empty``), and nothing else
    limits it. Otherwise (preempt, consolidate) it counts the nodes with a victim it may take,
    and stops after ``4 × max_victim_nodes`` nodes scanned, whatever they hold.

    ``blocked(project)`` says ``allow`` refuses every GPU-holding victim of that project,
    whatever was taken before: asked once per project and call, it stands in for ``allow``
    on those victims (the same answer, without asking per victim).

    ``takes_up_to(project)`` (with ``takeable_only`` and GPU-only rules): the most GPUs a
    victim of that project may hold for ``allow`` to take it when nothing was taken yet
    (negative: only victims holding no GPU; minus infinity: none). The scan then visits only
    the nodes holding such a victim (``TakeableNodes``), in the same order, skipping the rest
    unvisited: the same nodes count, the same outcome.

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
    models_ok: dict[int, bool] = {}
    nodes = session.state.by_name
    # ``blocked`` and ``takes_up_to``: asked once per project and call
    is_refused = cache(blocked) if blocked is not None else None
    bound_of = cache(takes_up_to) if takes_up_to is not None else None
    gpus_on = index.gpus
    minus_inf = float("-inf")

    def takeable_on(node: str, group: list[WorkloadState]) -> int:
        """GPU-only: the victims on the node this search may take, each alone (``allow`` with
        nothing taken yet: the scan's own test, its first victim allowed), as a bit mask over
        ``group``; 0 when none."""
        assert bound_of is not None
        mask = 0
        bit = 1
        for v, g in zip(group, gpus_on(node), strict=True):
            if not v.evicted:
                b = bound_of(v.project)
                if g <= b or (g <= 0 and b > minus_inf):
                    mask |= bit
            bit <<= 1
        return mask

    skip_set: set[str] = set()
    candidates: Iterable[str] = index.by_node
    room_verdict = index.room_verdict
    scope: int | None = None
    note: Callable[[tuple[int, str, NodeState, object, int]], None] | None = None
    """Records what the scan does with each node it reaches (``ScanPrefix``)."""
    walk: Iterable[tuple[int, str, int | None]] | None = None
    all_of_them = (lambda: -1) if bound_of is None else None
    request_key = index.request_key(request) if takeable_only else -1
    if takeable_only:
        # Marks made during this call are behind the scan: one set for the call is the same.
        skip = [nodes for shape, nodes in index.no_room.items() if nodes and at_least(request, shape)]
        skip_set = skip[0] if len(skip) == 1 else set().union(*skip)
        lists = index.takeable() if bound_of is not None and not pod_level else None
        if lists is not None and bound_of is not None:
            scope, picked = lists.choose(bound_of)
            union = lists.union(scope, picked)
            if constraint is None and not pruned:  # what scans found here before
                prefix = index.prefixes.get((request_key, scope))
                if prefix is None:
                    prefix = index.prefixes[(request_key, scope)] = ScanPrefix()
                note = prefix.note
                walk = prefix.walk(skip_set, union, lists.names)
            else:
                candidates = lists.nodes_in(union)
    walk = walk if walk is not None else ((-1, node, None) for node in candidates)
    by_node = index.by_node
    for order, (position, node, did) in enumerate(walk):
        if did is not None:  # as a scan before found it (``ScanPrefix``)
            if did == SKIPPED:
                continue
            if did == COUNTED:
                examined += 1
                if examined >= nodes_budget or feasible >= 4 or (
                        best is not None and best[3] <= (False, False, 1) and best[0] <= floor):
                    break
                continue
            ns = nodes[node]
            group = by_node[node]
        else:
            if node in pruned or node in skip_set:
                if note is not None:
                    ns = nodes[node]
                    note((position, node, ns, ns.signature(), SKIPPED))
                continue
            if not takeable_only:
                scanned += 1
                if scanned > 4 * nodes_budget:
                    break
            group = by_node[node]
            ns = nodes[node]
            if constraint is not None and not session.node_allowed(constraint, ns):
                continue
            if gpu.kind is not GpuKind.NONE:
                ok = models_ok.get(ns.static_id)
                if ok is None:
                    ok = models_ok[ns.static_id] = any(gpu.allows(m) for m in ns.dev_models)
                if not ok:
                    if note is not None:
                        note((position, node, ns, ns.signature(), SKIPPED))
                    continue
            if takeable_only:
                verdict = room_verdict(session, request, request_key, node, scope,
                                       all_of_them or partial(takeable_on, node, group))
                if verdict in (NO_ROOM, NOTHING_TAKEABLE):
                    if note is not None:
                        note((position, node, ns, ns.signature(), SKIPPED))
                    continue
                if verdict == NO_ROOM_TAKING:
                    # The scan below would count the node (its first victim this search may
                    # take) and take a subset of these: no room, so only the count is left.
                    if note is not None:
                        note((position, node, ns, ns.signature(), COUNTED))
                    examined += 1
                    if examined >= nodes_budget or feasible >= 4 or (
                            best is not None and best[3] <= (False, False, 1) and best[0] <= floor):
                        break
                    continue
                if note is not None:
                    note((position, node, ns, ns.signature(), LOOKED))
        free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
        tenants = list(ns.dev_tenants)
        compute = list(ns.dev_compute)
        cpu, mem = ns.free_cpu, ns.free_mem
        tentative: Tentative = {}
        chosen: list[tuple[WorkloadState, int]] = []
        cost = 0.0
        live = False
        others = False
        for v in group:
            if v.evicted:
                continue
            if (is_refused is not None and v.vector()[0] > 0 and is_refused(v.project)) \
                    or not allow(v, tentative):
                others = True
                continue
            if not live:
                examined += 1  # the budget counts nodes with a victim this search may take
                live = True
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
            if not live and not others and not takeable_only:
                gone.append(node)
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


def evict_until_fits(
    session: Session,
    ws: WorkloadState,
    index: NodeIndex | Callable[[], NodeIndex],
    allow: Allow,
    evict: Callable[[WorkloadState], None],
    extra_ok: Callable[[Vector], bool] | None,
    max_rounds: int,
    blocked: Callable[[str], bool] | None = None,
    budget: Callable[[], float] | None = None,
    takes_up_to: Callable[[str], float] | None = None,
    over_caps: Callable[[list[WorkloadState], ResourceRequest], bool] | None = None,
    takeable_only: bool = False,
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
        chosen = cheapest_node(session, fail, index, allow,
                               constraint=session.constraint_for(ws, fail), blocked=blocked,
                               budget=float("inf") if budget is None else budget(),
                               takes_up_to=takes_up_to, over_caps=over_caps,
                               takeable_only=takeable_only)
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
