"""The explanations ``FitExplainer`` gives from its ``DeviceIndex`` (device kinds, node
profiles) equal those of a scan of every device of every node (the explainer as it was before
the index, kept here as the reference) on random clusters: GPU models, sizes, shares, whole
GPUs, compute promises, host CPU and memory, and random node subsets (constrained pods)."""

from __future__ import annotations

import gc
import random
import weakref
from decimal import Decimal

from tessera.core.cycle import fit_index
from tessera.core.cycle.explain import FitExplainer
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement.explain import compute_reason
from tessera.core.state import ClusterState, NodeState, Placement
from tessera.core.units import GiB, format_bytes


class ScanExplainer:
    def __init__(self, state: ClusterState, nodes: list[NodeState] | None = None) -> None:
        """``nodes``: explain among these only (the nodes a constrained pod may use)."""
        self.state = state
        self.nodes = state.nodes if nodes is None else nodes
        self._cache: dict[ResourceRequest, str] = {}

    def explain(self, request: ResourceRequest) -> str:
        text = self._cache.get(request)
        if text is None:
            text = self._explain(request)
            self._cache[request] = text
        return text

    def _explain(self, request: ResourceRequest) -> str:
        nodes = self.nodes
        if not nodes:
            return "the cluster has no nodes"
        gpu = request.gpu
        if gpu.kind is GpuKind.NONE:
            return _host_reason(nodes, request)
        models = f" of model {'|'.join(sorted(gpu.models))}" if gpu.models else ""
        any_model = False
        gpu_ok: list[NodeState] = []
        best_count, best_node = 0, ""
        largest: tuple[int, int, int] | None = None  # free, -node index, -device
        need_on_largest = 0
        whole = gpu.kind is GpuKind.WHOLE
        shapes: dict[tuple[int, str], tuple[bool, int]] = {}
        devices = gpu.devices
        for ns in nodes:
            count = 0
            used, tenants = ns.dev_used, ns.dev_tenants
            for i, memory in enumerate(ns.dev_memory):
                model = ns.dev_models[i]
                shape = shapes.get((memory, model))
                if shape is None:
                    shape = (gpu.allows(model), gpu.bytes_on(memory))
                    shapes[(memory, model)] = shape
                allowed, need = shape
                if not allowed:
                    continue
                any_model = True
                if whole:
                    if tenants[i] == 0:
                        count += 1
                    continue
                free = memory - used[i]
                if largest is None or free > largest[0]:
                    largest, need_on_largest = (free, -ns.index, -i), need
                if need <= free and gpu.compute_units <= ns.dev_compute_free(i):
                    count += 1
            if count > best_count:
                best_count, best_node = count, ns.name
            if count >= devices:
                gpu_ok.append(ns)
        if not any_model:
            return f"no node has a GPU of model {'|'.join(sorted(gpu.models))}"
        if not gpu_ok:
            timed = None if whole else compute_reason(nodes, gpu)
            if timed is not None:
                return timed
            if whole:
                where = f" (node {best_node})" if best_count else ""
                return (
                    f"no node has {gpu.devices} idle GPU{'s' if gpu.devices != 1 else ''}{models}: "
                    f"the most idle on one node is {best_count}{where}"
                )
            assert largest is not None
            holder = self.state.nodes[-largest[1]]
            where = f"largest free is {format_bytes(largest[0])} on {holder.name} GPU {-largest[2]}"
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
        room = sum(_pods_that_fit(ns, request) for ns in host_ok)
        where = host_ok[0].name if len(host_ok) == 1 else f"{len(host_ok)} nodes"
        return (
            f"the GPUs have room for only {room} pod(s) of {gpu.describe()} now "
            f"(on {where}), too few for all of them"
        )


def _pods_that_fit(ns: NodeState, request: ResourceRequest) -> int:
    """How many pods of this GPU request the node's free GPU memory holds now (GPUs only)."""
    gpu = request.gpu
    per_device = 0
    for i, memory in enumerate(ns.dev_memory):
        if not gpu.allows(ns.dev_models[i]):
            continue
        if gpu.kind is GpuKind.WHOLE:
            per_device += 1 if ns.dev_tenants[i] == 0 else 0
        else:
            need = gpu.bytes_on(memory)
            fit = (memory - ns.dev_used[i]) // need if need > 0 else 0
            if gpu.compute_units:
                fit = min(fit, ns.dev_compute_free(i) // gpu.compute_units)
            per_device += fit
    return per_device // max(gpu.devices, 1)


def _host_reason(pool: list[NodeState], request: ResourceRequest) -> str:
    ns = max(pool, key=lambda n: (min(n.free_cpu - request.cpu_milli, 0), n.free_mem, -n.index))
    return (
        f"no node with {request.cpu_milli / 1000:g} CPU and {format_bytes(request.memory)} "
        f"of memory free: the most is {ns.free_cpu / 1000:g} CPU and "
        f"{format_bytes(ns.free_mem)} on {ns.name}"
    )


MODELS = ("A100", "H100", "L4")


def _cluster(rng: random.Random) -> ClusterState:
    nodes = []
    for k in range(rng.randint(1, 12)):
        size = rng.choice([16, 40, 80]) * GiB
        mixed = rng.random() < 0.3
        model = rng.choice(MODELS)
        gpus = tuple(GpuDevice(f"g{k}-{i}", i, rng.choice([16, 80]) * GiB if mixed else size,
                               rng.choice(MODELS) if mixed else model)
                     for i in range(rng.randint(0, 8)))
        nodes.append(Node(f"n{k}", gpus, cpu_milli=rng.choice([8_000, 32_000]),
                          memory=rng.choice([32, 256]) * GiB))
    state = ClusterState(nodes)
    _allocate(rng, state, "a")
    return state


def _allocate(rng: random.Random, state: ClusterState, prefix: str) -> None:
    for a in range(rng.randint(0, 40)):
        ns = rng.choice(state.nodes)
        if not ns.dev_memory:
            continue
        i = rng.randrange(len(ns.dev_memory))
        cpu, mem = rng.choice([0, 1000, 4000]), rng.choice([0, 8 * GiB])
        if rng.random() < 0.3:
            p = Placement(ns.name, (i,), (ns.dev_memory[i],), (ns.dev_memory[i],), True, cpu, mem)
        else:
            want = min(rng.choice([1, 4, 8, 20]) * GiB, ns.dev_memory[i])
            p = Placement(ns.name, (i,), (want,), (want,), False, cpu, mem,
                          compute=rng.choice([0, 0, 250_000, 500_000, 1_000_000]))
        if state.fits(p) is None:
            state.assign(f"{prefix}{a}", p)


def _request(rng: random.Random) -> ResourceRequest:
    models = frozenset(rng.sample(MODELS, rng.randint(1, 2))) if rng.random() < 0.3 else frozenset()
    kind = rng.choice(["none", "whole", "whole", "portion", "memory", "compute"])
    devices = rng.choice([1, 1, 2, 4, 8])
    if kind == "none":
        gpu = GpuRequest.none()
    elif kind == "whole":
        gpu = GpuRequest.whole(devices, models)
    elif kind == "portion":
        gpu = GpuRequest.fraction(rng.choice(["0.1", "0.25", "0.5", "0.9"]), devices, models=models)
    elif kind == "memory":
        gpu = GpuRequest.of_memory(rng.choice([2, 10, 30, 70]) * GiB, devices, models=models)
    else:
        gpu = GpuRequest(GpuKind.PORTION, devices=devices, portion=Decimal(rng.choice(["0.1", "0.5"])),
                         models=models, compute=Decimal(rng.choice(["0.3", "0.6", "1"])))
    return ResourceRequest(gpu, cpu_milli=rng.choice([0, 2000, 16_000, 64_000]),
                           memory=rng.choice([0, 16 * GiB, 512 * GiB]))


def test_index_explains_as_the_scan() -> None:
    """150 random clusters × 2 rounds × 12 requests, on all nodes and three random subsets;
    between the rounds allocations are released and added (the node kinds kept between
    indexes of one state must follow). The clusters reach every wording (else the comparison
    would prove less)."""
    seen = set()
    for seed in range(150):
        rng = random.Random(seed)
        state = _cluster(rng)
        for _round in range(2):
            full = FitExplainer(state)
            subsets = [[ns for ns in state.nodes if rng.random() < 0.5] for _ in range(3)]
            explainers = [(full, ScanExplainer(state))] + [
                (FitExplainer(state, s, full), ScanExplainer(state, s)) for s in subsets]
            for _ in range(12):
                request = _request(rng)
                for new, old in explainers:
                    text = new.explain(request)
                    assert text == old.explain(request), (seed, request)
                    seen.add(next((w for w in WORDINGS if w in text), text))
            for alloc_id in rng.sample(sorted(state.allocations), len(state.allocations) // 2):
                state.release(alloc_id)
            _allocate(rng, state, f"r{_round}-")
    assert set(WORDINGS) <= seen, set(WORDINGS) - seen


WORDINGS = ("no node has a GPU of model", "waiting for GPU time", "idle GPU", "no GPU", "free each",
            "but none also has", "have room for only", "no node with", "the cluster has no nodes")


def test_kept_kinds_do_not_keep_the_state() -> None:
    """The kinds kept per state are dropped with it (a cold cycle's state is not leaked)."""
    state = ClusterState([Node("n", (GpuDevice("g", 0, 16 * GiB, "A100"),), cpu_milli=1000, memory=GiB)])
    assert "idle GPUs" in FitExplainer(state).explain(ResourceRequest(GpuRequest.whole(2)))
    assert state in fit_index._KEPT
    ref = weakref.ref(state)
    del state
    gc.collect()
    assert ref() is None
