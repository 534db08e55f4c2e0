"""What freeing victims' pods on one node would give: the device vectors after freeing, whether
a request then fits, and the fewest victims of a pool that make room (reclaim's node scan,
``tessera.core.cycle.victims``)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from tessera.core.fairshare import EPS
from tessera.core.model import COMPUTE_FULL, GpuKind, ResourceRequest
from tessera.core.state import NodeState, Placement

from .session import WorkloadState


def fits_after(
    ns: NodeState, request: ResourceRequest, free: Sequence[int], tenants: Sequence[int], cpu: int, mem: int,
    compute: Sequence[int],
) -> bool:
    """``compute``: millionths of each device's time promised once the victims are gone."""
    if request.cpu_milli > cpu or request.memory > mem:
        return False
    gpu = request.gpu
    if gpu.kind is GpuKind.NONE:
        return True
    count = 0
    for i, model in enumerate(ns.dev_models):
        if not gpu.allows(model):
            continue
        if gpu.kind is GpuKind.WHOLE:
            ok = tenants[i] == 0
        else:
            ok = (gpu.bytes_on(ns.dev_memory[i]) <= free[i]
                  and gpu.compute_units <= COMPUTE_FULL - compute[i])
        if ok:
            count += 1
            if count >= gpu.devices:
                return True
    return False


def fewest(ns: NodeState, request: ResourceRequest, pool: list[tuple[WorkloadState, int]],
            budget: float) -> tuple[list[tuple[WorkloadState, int]], float]:
    """Of ``pool`` (victims' pods on ``ns``, together allowed, together making room), the
    fewest workloads that make room freeing at most ``budget`` GPUs, then the fewest GPUs:
    every single one, every pair (up to 16 victims), every triple (up to 10), tried
    exhaustively; otherwise the largest first, or the smallest first, each then pruned (a
    victim left out again if the request still fits without it). With no set within the
    budget, the fewest workloads. Any subset of an allowed set is allowed."""
    victims = list(dict.fromkeys(v for v, _ in pool))
    # Each victim's placements here and GPUs, looked up once (the subsets below are many).
    placed: dict[int, list[Placement]] = {}
    for w, i in pool:
        p = w.placements[i]
        assert p is not None
        placed.setdefault(id(w), []).append(p)
    held = {id(w): w.vector()[0] for w in victims}
    base_free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]

    def pods(chosen: Sequence[WorkloadState]) -> list[tuple[WorkloadState, int]]:
        ids = {id(c) for c in chosen}
        return [(w, i) for w, i in pool if id(w) in ids]

    def fits(chosen: Sequence[WorkloadState]) -> bool:
        free = list(base_free)
        tenants = list(ns.dev_tenants)
        compute = list(ns.dev_compute)
        cpu, mem = ns.free_cpu, ns.free_mem
        for c in chosen:  # freeing adds integers: the order does not matter
            for p in placed[id(c)]:
                free_on(p, free, tenants, compute)
                cpu += p.cpu_milli
                mem += p.memory
        return fits_after(ns, request, free, tenants, cpu, mem, compute)

    def gpus(chosen: Sequence[WorkloadState]) -> float:
        return sum(held[id(w)] for w in chosen)

    fallback: Sequence[WorkloadState] | None = None
    for size, most in ((1, len(victims)), (2, 16), (3, 10)):
        if len(victims) > most or size > len(victims):
            break
        found: tuple[WorkloadState, ...] | None = None
        for combo in combinations(victims, size):
            if (found is None or gpus(combo) < gpus(found) - EPS) and fits(combo):
                found = combo
        if found is not None:
            if gpus(found) <= budget + EPS:
                return pods(found), gpus(found)
            fallback = fallback or found
    for largest in (True, False):
        chosen: list[WorkloadState] = []
        for w in sorted(victims, key=lambda v: -v.vector()[0] if largest else v.vector()[0]):
            chosen.append(w)
            if fits(chosen):
                break
        for w in sorted(chosen, key=lambda v: -v.vector()[0]):
            trial = [x for x in chosen if x is not w]
            if trial and fits(trial):
                chosen = trial
        if gpus(chosen) <= budget + EPS and (fallback is None or gpus(fallback) > budget + EPS
                                             or len(chosen) <= len(fallback)):
            return pods(chosen), gpus(chosen)
        if fallback is None or len(chosen) < len(fallback):
            fallback = chosen
    assert fallback is not None
    return pods(fallback), gpus(fallback)


def free_all_on(node: str, victims: Sequence[WorkloadState], free: list[int],
                 tenants: list[int], compute: list[int]) -> tuple[int, int]:
    """Free every pod of ``victims`` placed on ``node`` in the device vectors; the CPU and
    memory they give back."""
    cpu = mem = 0
    for v in victims:
        for p in v.placements:
            if p is not None and p.node == node:
                free_on(p, free, tenants, compute)
                cpu += p.cpu_milli
                mem += p.memory
    return cpu, mem


def at_least(big: ResourceRequest, small: ResourceRequest) -> bool:
    """``big`` needs at least what ``small`` does on any node, so where ``small`` cannot get
    room, ``big`` cannot either."""
    if big is small or big == small:
        return True
    a, b = big.gpu, small.gpu
    if a.kind is not b.kind or a.models != b.models or a.devices < b.devices:
        return False
    if big.cpu_milli < small.cpu_milli or big.memory < small.memory:
        return False
    if a.kind is GpuKind.PORTION:
        assert a.portion is not None and b.portion is not None
        return a.portion >= b.portion
    if a.kind is GpuKind.MEMORY:
        assert a.memory is not None and b.memory is not None
        return a.memory >= b.memory
    return True


def free_on(p: Placement, free: list[int], tenants: list[int], compute: list[int]) -> None:
    for d, b in zip(p.devices, p.request_bytes, strict=True):
        free[d] += b
        tenants[d] -= 1
        compute[d] -= p.compute
