"""Why a request does not fit now, said so that a person can act on it."""

from __future__ import annotations

from tessera.core.model import COMPUTE_FULL, GpuKind, GpuRequest, ResourceRequest
from tessera.core.placement.devices import fitting_devices
from tessera.core.state import ClusterState, NodeState
from tessera.core.units import format_bytes


def explain_no_fit(state: ClusterState, request: ResourceRequest) -> str:
    gpu = request.gpu
    nodes = state.nodes
    if not nodes:
        return "the cluster has no nodes"
    host_ok = [ns for ns in nodes if request.cpu_milli <= ns.free_cpu and request.memory <= ns.free_mem]
    if gpu.kind is GpuKind.NONE:
        return _host_reason(state, request)
    model_ok = [ns for ns in nodes if any(gpu.allows(m) for m in ns.dev_models)]
    if not model_ok:
        return f"no node has a GPU of model {'|'.join(sorted(gpu.models))}"
    gpu_ok = [ns for ns in model_ok if len(fitting_devices(ns, gpu)) >= gpu.devices]
    if not gpu_ok:
        return _gpu_reason(state, request)
    if not any(ns in host_ok for ns in gpu_ok):
        return f"{len(gpu_ok)} node(s) have the GPUs ({gpu.describe()}) but " + _host_reason(
            state, request, among=gpu_ok
        )
    return f"no node fits {gpu.describe()}"


def compute_reason(nodes: list[NodeState], gpu: GpuRequest) -> str | None:
    """Why a share with a compute request waits when GPUs have its memory but not its time:
    the compute requests on one GPU add up to at most 1 (docs/compute-share.md). None when
    the memory (or something else) is what is missing."""
    want = gpu.compute_units
    if not want or gpu.kind not in (GpuKind.PORTION, GpuKind.MEMORY):
        return None
    best: tuple[int, NodeState, int] | None = None  # unpromised time, node, device
    roomy = 0
    for ns in nodes:
        for i, model in enumerate(ns.dev_models):
            if (not gpu.allows(model) or ns.dev_whole[i]
                    or gpu.bytes_on(ns.dev_memory[i]) > ns.dev_free(i)):
                continue
            roomy += 1
            if ns.dev_compute_free(i) >= want:
                return None
            if best is None or ns.dev_compute_free(i) > best[0]:
                best = (ns.dev_compute_free(i), ns, i)
    if best is None:
        return None
    return (f"waiting for GPU time: {roomy} GPU(s) have the memory for {gpu.describe()} but none has "
            f"{gpu.compute} of its time unpromised (the compute requests on a GPU add up to at most "
            f"1); the most is {best[0] / COMPUTE_FULL:g} on {best[1].name} GPU {best[2]}")


def _gpu_reason(state: ClusterState, request: ResourceRequest) -> str:
    gpu = request.gpu
    timed = compute_reason(state.nodes, gpu)
    if timed is not None:
        return timed
    candidates = [
        (ns, i) for ns in state.nodes for i, m in enumerate(ns.dev_models) if gpu.allows(m)
    ]
    if gpu.kind is GpuKind.WHOLE:
        best, where = 0, ""
        for ns in state.nodes:
            idle = len(fitting_devices(ns, gpu))
            if idle > best:
                best, where = idle, f" ({ns.name})"
        return (
            f"no node has {gpu.devices} idle GPU{'s' if gpu.devices != 1 else ''}"
            f"{_models(request)}: the most idle on one node is {best}{where}"
        )
    ns, i = max(candidates, key=lambda c: (c[0].dev_free(c[1]), -c[0].index, -c[1]))
    need = gpu.bytes_on(ns.dev_memory[i])
    largest = f"largest free is {format_bytes(ns.dev_free(i))} on {ns.name} GPU {i}"
    if gpu.devices == 1:
        return f"no GPU{_models(request)} with {format_bytes(need)} free: {largest}"
    best_count, best_node = 0, ""
    for node in state.nodes:
        count = len(fitting_devices(node, gpu))
        if count > best_count:
            best_count, best_node = count, node.name
    at = f" ({best_node})" if best_node else ""
    return (
        f"no node has {gpu.devices} GPUs{_models(request)} with {format_bytes(need)} free each: "
        f"the most on one node is {best_count}{at}; {largest}"
    )


def _host_reason(
    state: ClusterState, request: ResourceRequest, among: list[NodeState] | None = None
) -> str:
    pool = among if among is not None else state.nodes
    ns = max(pool, key=lambda n: (min(n.free_cpu - request.cpu_milli, 0), n.free_mem, -n.index))
    who = "none of them has" if among is not None else "no node has"
    return (
        f"{who} {request.cpu_milli / 1000:g} CPU and {format_bytes(request.memory)} "
        f"of memory free: the most is {ns.free_cpu / 1000:g} CPU and "
        f"{format_bytes(ns.free_mem)} on {ns.name}"
    )


def _models(request: ResourceRequest) -> str:
    models = request.gpu.models
    return f" of model {'|'.join(sorted(models))}" if models else ""
