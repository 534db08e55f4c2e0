"""Why a request does not fit, for many requests against one cluster state.

Same wording as ``tessera.core.placement.explain``, but judged from a ``DeviceIndex``
(``fit_index``): devices grouped by kind and nodes by profile, built in one pass over the devices
and shared by every explainer of the plan, so a request costs the number of kinds and profiles,
not of devices (that module scans every node several times, which is fine for one request and
too slow for the waiting workloads of a 5,000-node cycle). Results are cached per request; make
a new explainer (and index) when the state changes.
"""

from __future__ import annotations

from tessera.core.model import COMPUTE_FULL, GpuKind, GpuRequest, ResourceRequest
from tessera.core.state import ClusterState, NodeState
from tessera.core.units import format_bytes

from .fit_index import DeviceIndex, Judged, View


class FitExplainer:
    def __init__(self, state: ClusterState, nodes: list[NodeState] | None = None,
                 parent: FitExplainer | None = None) -> None:
        """``nodes``: explain among these only (the nodes a constrained pod may use), in node
        order. ``parent``: an explainer of the same state whose ``DeviceIndex`` this one shares
        (the index is built on first need, once)."""
        self.state = state
        self.nodes = state.nodes if nodes is None else nodes
        self._parent = parent
        self._index: DeviceIndex | None = None
        self._view: View | None = None
        self._cache: dict[ResourceRequest, str] = {}

    def explain(self, request: ResourceRequest) -> str:
        text = self._cache.get(request)
        if text is None:
            text = self._explain(request)
            self._cache[request] = text
        return text

    def _judge(self, gpu: GpuRequest) -> Judged:
        if self._view is None:
            self._view = self.index().view(self.nodes)
        return self._view.judge(gpu)

    def index(self) -> DeviceIndex:
        if self._parent is not None:
            return self._parent.index()
        if self._index is None:
            self._index = DeviceIndex(self.state)
        return self._index

    def _explain(self, request: ResourceRequest) -> str:
        nodes = self.nodes
        if not nodes:
            return "the cluster has no nodes"
        gpu = request.gpu
        if gpu.kind is GpuKind.NONE:
            return _host_reason(nodes, request)
        models = f" of model {'|'.join(sorted(gpu.models))}" if gpu.models else ""
        judged = self._judge(gpu)
        if not judged.any_allowed():
            return f"no node has a GPU of model {'|'.join(sorted(gpu.models))}"
        whole = gpu.kind is GpuKind.WHOLE
        gpu_ok = judged.nodes_with(gpu.devices)
        if not gpu_ok:
            timed = None if whole else _compute_reason(judged, self.state)
            if timed is not None:
                return timed
            best_count, best = judged.best()
            best_node = best.name if best is not None else ""
            if whole:
                where = f" (node {best_node})" if best_count else ""
                return (
                    f"no node has {gpu.devices} idle GPU{'s' if gpu.devices != 1 else ''}{models}: "
                    f"the most idle on one node is {best_count}{where}"
                )
            free, node, device, need_on_largest = judged.largest()
            holder = self.state.nodes[node]
            where = f"largest free is {format_bytes(free)} on {holder.name} GPU {device}"
            if gpu.devices == 1:
                return f"no GPU{models} with {format_bytes(need_on_largest)} free: {where}"
            at = f" ({best_node})" if best_node else ""
            return (
                f"no node has {gpu.devices} GPUs{models} with {format_bytes(need_on_largest)} free each: "
                f"the most on one node is {best_count}{at}; {where}"
            )
        host_ok = [ns for ns in gpu_ok if request.cpu_milli <= ns.free_cpu and request.memory <= ns.free_mem]
        if not host_ok:
            return (
                f"{len(gpu_ok)} node(s) have the GPUs ({gpu.describe()}) but none also has "
                f"{request.cpu_milli / 1000:g} CPU and {format_bytes(request.memory)} of memory free; "
                + _host_reason(gpu_ok, request)
            )
        room = sum(judged.pods_on(ns) for ns in host_ok)
        where = host_ok[0].name if len(host_ok) == 1 else f"{len(host_ok)} nodes"
        return (
            f"the GPUs have room for only {room} pod(s) of {gpu.describe()} now "
            f"(on {where}), too few for all of them"
        )


def _compute_reason(judged: Judged, state: ClusterState) -> str | None:
    """``placement.explain.compute_reason`` from the index: why a share with a compute request
    waits when GPUs have its memory but not its time (None when memory is what is missing)."""
    gpu = judged.gpu
    if not gpu.compute_units or gpu.kind not in (GpuKind.PORTION, GpuKind.MEMORY):
        return None
    found = judged.timed()
    if found is None:
        return None
    roomy, (free, node, device) = found
    return (f"waiting for GPU time: {roomy} GPU(s) have the memory for {gpu.describe()} but none has "
            f"{gpu.compute} of its time unpromised (the compute requests on a GPU add up to at most "
            f"1); the most is {free / COMPUTE_FULL:g} on {state.nodes[node].name} GPU {device}")


def _host_reason(pool: list[NodeState], request: ResourceRequest) -> str:
    ns = max(pool, key=lambda n: (min(n.free_cpu - request.cpu_milli, 0), n.free_mem, -n.index))
    return (
        f"no node with {request.cpu_milli / 1000:g} CPU and {format_bytes(request.memory)} "
        f"of memory free: the most is {ns.free_cpu / 1000:g} CPU and "
        f"{format_bytes(ns.free_mem)} on {ns.name}"
    )
