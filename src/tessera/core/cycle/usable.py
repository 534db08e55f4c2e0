"""Fair share over usable capacity: free GPU memory that no pending request could use does not
count as capacity to divide.

A fragment is the free part of a GPU (memory minus what its tenants hold). It is *usable* if at
least one pending pod's GPU request could take it as it is: a whole-GPU request needs the GPU
empty (and not held whole); a portion or memory request needs its bytes on that GPU to be free;
the GPU's model must be one the request allows. A fragment no pending request can use is idle
for everyone this cycle, so dividing it would give projects fair shares (and reclaim rights)
they cannot turn into running work. Fair share divides ``total GPUs - unusable fragments``
(in GPUs: free bytes ÷ the GPU's memory), but never less than the deserved quota the top-level
projects ask for (deserved quota stays a guarantee; fragments come out of the over-quota part).
With nothing pending, nothing is subtracted.

A fragment on a GPU with a tenant that consolidation may move (a movable, preemptible,
fractional workload past its minimum runtime, when the cycle runs ``consolidate``) is counted
as usable: moving that tenant can join fragments into room a pending pod fits.

Devices are grouped by (memory, model, bytes used, shared, held whole), so the cost is the
number of such groups × the distinct pending requests, not the number of GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from tessera.core.model import GpuKind, GpuRequest
from tessera.core.state import ClusterState

from .workload_state import WorkloadState


def unusable_gpus(
    state: ClusterState,
    pending: Iterable[GpuRequest],
    movable: Callable[[], set[tuple[int, int]]] | None = None,
) -> float:
    """GPUs' worth of free memory that none of ``pending`` could take (0 if none pending).
    ``movable()``: (node index, GPU index) of the GPUs with a tenant consolidation may move,
    asked only if some fragment is unusable otherwise."""
    requests = {r for r in pending if r.kind is not GpuKind.NONE}
    if not requests:
        return 0.0
    lost = _lost(state, requests, set())
    if lost > 0 and movable is not None:
        lost = _lost(state, requests, movable())
    return lost


def _lost(state: ClusterState, requests: set[GpuRequest], skip: set[tuple[int, int]]) -> float:
    groups: Counter[tuple[int, str, int, bool]] = Counter()
    for ns in state.nodes:
        for i, (memory, model, used, tenants, whole) in enumerate(zip(
            ns.dev_memory, ns.dev_models, ns.dev_used, ns.dev_tenants, ns.dev_whole, strict=True
        )):
            if not whole and used < memory and (not skip or (ns.index, i) not in skip):
                groups[(memory, model, used, tenants > 0)] += 1
    lost = 0.0
    for (memory, model, used, shared), count in groups.items():
        free = memory - used
        if not any(_can_use(r, memory, model, free, shared) for r in requests):
            lost += count * free / memory
    return lost


def _can_use(r: GpuRequest, memory: int, model: str, free: int, shared: bool) -> bool:
    if not r.allows(model):
        return False
    if r.kind is GpuKind.WHOLE:
        return not shared
    return r.bytes_on(memory) <= free


def movable_gpus(workloads: Iterable[WorkloadState], state: ClusterState,
                 evictable: Callable[[WorkloadState, str], bool]) -> set[tuple[int, int]]:
    """(node index, GPU index) of GPUs with a tenant consolidation may move."""
    found: set[tuple[int, int]] = set()
    for ws in workloads:
        if ws.spec.movable and all(r.gpu.shared for r in ws.spec.pods) and evictable(ws, "preempt"):
            for p in ws.placements:
                if p is not None:
                    index = state.by_name[p.node].index
                    found.update((index, d) for d in p.devices)
    return found
