"""Consolidation in the trace replay (``python -m tessera.bench.trace --moves N``): what moving
already placed fractional pods is worth, and at what number of moves.

When an arriving pod finds no room, the replay looks for the node where the fewest GPU shares
of fractional pods stand in its way, takes those pods
off (the largest first that covers each device's shortfall, then, where CPU or memory is what
is short, the most CPU-hungry of its other fractional pods; at most ``max_moves``), places the
arriving pod on the room made, and places every moved pod again wherever the policy puts it.
If any moved pod finds no place, everything is undone (a state checkpoint) and the next
candidate node is tried. Whole-GPU pods never move; only pods that share a GPU do, as
tessera's own ``consolidate`` action (docs/scheduling.md) moves only fractional workloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.core.model import GpuKind, ResourceRequest
from tessera.core.placement import NoFit, Placer
from tessera.core.placement.devices import make_placement
from tessera.core.state import ClusterState, NodeState, Placement

CANDIDATES = 8
"""Nodes tried per pod that found no room, cheapest first."""


@dataclass
class Mover:
    state: ClusterState
    placer: Placer
    max_moves: int
    requests: dict[str, ResourceRequest] = field(default_factory=dict)
    """Placed fractional pods (the movable ones) by allocation id."""
    on_node: dict[str, set[str]] = field(default_factory=dict)
    moves: int = 0
    rescued: int = 0
    """Pods placed only because others moved."""

    def placed(self, alloc_id: str, request: ResourceRequest, where: Placement) -> None:
        """Record a placement (movable if it shares its GPUs)."""
        if request.gpu.shared:
            self.requests[alloc_id] = request
            self.on_node.setdefault(where.node, set()).add(alloc_id)

    def make_room(self, alloc_id: str, request: ResourceRequest) -> Placement | None:
        """Place ``request`` by moving at most ``max_moves`` fractional pods; None if no node
        can be freed that way (the state is then as before)."""
        if request.gpu.kind is GpuKind.NONE:
            return None
        plans = []
        for ns in self.state.nodes:
            plan = self._plan(ns, request)
            if plan is not None:
                plans.append(plan)
        plans.sort(key=lambda p: (p[0], len(p[2])))
        for _cost, ns, victims in plans[:CANDIDATES]:
            where = self._try(ns, alloc_id, request, victims)
            if where is not None:
                return where
        return None

    def _plan(self, ns: NodeState, request: ResourceRequest) -> tuple[float, NodeState, list[str]] | None:
        """Which pods to move off ``ns`` so that ``request`` fits: (GPU share moved, node, ids)."""
        gpu = request.gpu
        if not any(gpu.allows(m) for m in ns.dev_models):
            return None
        ids = self.on_node.get(ns.name)
        if not ids:
            return None
        by_device: dict[int, list[tuple[int, str]]] = {}
        for a in ids:
            p = self.state.allocations[a]
            for i, nbytes in zip(p.devices, p.request_bytes, strict=True):
                by_device.setdefault(i, []).append((nbytes, a))
        options = []
        for i in range(len(ns.dev_memory)):
            if ns.dev_whole[i] or not gpu.allows(ns.dev_models[i]):
                continue
            tenants = by_device.get(i, [])
            if gpu.kind is GpuKind.WHOLE:
                if ns.dev_tenants[i] != len(tenants):
                    continue  # a tenant that cannot move
                need = ns.dev_used[i]
            else:
                need = gpu.bytes_on(ns.dev_memory[i]) - ns.dev_free(i)
            picked = _cover(tenants, need) if need > 0 else []
            if picked is None:
                continue
            options.append((sum(n for n, _ in picked) / ns.dev_memory[i], i, [a for _, a in picked]))
        if len(options) < gpu.devices:
            return None
        options.sort()
        chosen = options[: gpu.devices]
        victims = list(dict.fromkeys(a for _, _, ids_ in chosen for a in ids_))
        short_cpu = request.cpu_milli - ns.free_cpu
        short_mem = request.memory - ns.free_mem
        for a in victims:
            p = self.state.allocations[a]
            short_cpu, short_mem = short_cpu - p.cpu_milli, short_mem - p.memory
        if short_cpu > 0 or short_mem > 0:  # CPU or memory is what is short: more pods go
            others = sorted((a for a in ids if a not in victims),
                            key=lambda a: -self.state.allocations[a].cpu_milli)
            for a in others:
                if short_cpu <= 0 and short_mem <= 0:
                    break
                p = self.state.allocations[a]
                victims.append(a)
                short_cpu, short_mem = short_cpu - p.cpu_milli, short_mem - p.memory
            if short_cpu > 0 or short_mem > 0:
                return None
        if not victims or len(victims) > self.max_moves:
            return None
        return sum(c for c, _, _ in chosen), ns, victims

    def _try(self, ns: NodeState, alloc_id: str, request: ResourceRequest,
             victims: list[str]) -> Placement | None:
        state = self.state
        mark = state.checkpoint()
        for a in victims:
            state.release(a)
        found = self.placer.policy.evaluate(ns, request)  # None: still no room on the node
        if found is None:
            state.rollback(mark)
            return None
        where = make_placement(ns, request, found[1])
        state.assign(alloc_id, where)
        moved: list[tuple[str, Placement]] = []
        for a in victims:
            again = self.placer.place(self.requests[a], explain=False)
            if isinstance(again, NoFit):
                state.rollback(mark)
                return None
            state.assign(a, again)
            moved.append((a, again))
        state.commit(mark)
        for a, again in moved:
            self.on_node[ns.name].discard(a)
            self.on_node.setdefault(again.node, set()).add(a)
        self.moves += len(victims)
        self.rescued += 1
        return where


def _cover(tenants: list[tuple[int, str]], need: int) -> list[tuple[int, str]] | None:
    """Fewest pods whose bytes cover ``need``: the smallest single pod that does, else the
    largest first; None if all of them do not."""
    enough = [t for t in tenants if t[0] >= need]
    if enough:
        return [min(enough)]
    picked, got = [], 0
    for t in sorted(tenants, reverse=True):
        picked.append(t)
        got += t[0]
        if got >= need:
            return picked
    return None
