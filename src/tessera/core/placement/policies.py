"""Placement policies: each scores one node for one request and picks its devices there.

A policy returns ``(score, devices)`` for a node that can host the request (higher is better)
or None. Scores depend only on the node's state, so the placer can memoise them per state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from tessera.core.model import GpuKind, ResourceRequest
from tessera.core.placement.devices import device_options, used_after
from tessera.core.placement.fragmentation import Fragmentation, default_workload
from tessera.core.state import NodeState

Choice = tuple[float, tuple[int, ...]]


class Policy(Protocol):
    name: str
    randomised: bool

    def evaluate(self, ns: NodeState, request: ResourceRequest) -> Choice | None: ...


def _gpu_util(ns: NodeState, used: Sequence[int]) -> float:
    total = sum(ns.dev_memory)
    return sum(used) / total if total else 0.0


def _host_util_after(ns: NodeState, request: ResourceRequest) -> float:
    cpu = 1 - (ns.free_cpu - request.cpu_milli) / ns.node.cpu_milli if ns.node.cpu_milli else 0.0
    mem = 1 - (ns.free_mem - request.memory) / ns.node.memory if ns.node.memory else 0.0
    return (cpu + mem) / 2


def _free_after(ns: NodeState, devices: tuple[int, ...]) -> int:
    return sum(ns.dev_free(i) for i in devices)


class _ByDevices:
    """Policies that pick the tightest (or loosest) device set, then score the node."""

    tightest = True

    def evaluate(self, ns: NodeState, request: ResourceRequest) -> Choice | None:
        options = device_options(ns, request)
        if not options:
            return None
        if self.tightest:
            devices = min(options, key=lambda d: (_free_after(ns, d), d))
        else:
            devices = max(options, key=lambda d: (_free_after(ns, d), [-i for i in d]))
        return self.node_score(ns, request, used_after(ns, request, devices)), devices

    def node_score(self, ns: NodeState, request: ResourceRequest, used: list[int]) -> float:
        raise NotImplementedError


class BinPack(_ByDevices):
    """Fill the most used node first; on it, the most used GPU that fits (KAI's default)."""

    name = "binpack"
    randomised = False

    def node_score(self, ns: NodeState, request: ResourceRequest, used: list[int]) -> float:
        return _gpu_util(ns, used) + 0.001 * _host_util_after(ns, request)


class Spread(_ByDevices):
    """Fill the least used node first; on it, the least used GPU."""

    name = "spread"
    randomised = False
    tightest = False

    def node_score(self, ns: NodeState, request: ResourceRequest, used: list[int]) -> float:
        return -_gpu_util(ns, used) - 0.001 * _host_util_after(ns, request)


class BestFit(_ByDevices):
    """Leave the least free behind: fewest free GPUs after placement, then least CPU and memory.

    Unlike binpack, which compares utilisation ratios, best-fit compares what is left in
    absolute GPUs, so a half-full 2-GPU node beats a half-full 8-GPU node.
    """

    name = "best-fit"
    randomised = False

    def node_score(self, ns: NodeState, request: ResourceRequest, used: list[int]) -> float:
        free_gpus = sum((m - u) / m for m, u in zip(ns.dev_memory, used, strict=True))
        return -free_gpus - 0.5 * (1 - _host_util_after(ns, request))


class Random:
    """Any node that fits, uniformly; any fitting device set on it. A baseline."""

    name = "random"
    randomised = True

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def evaluate(self, ns: NodeState, request: ResourceRequest) -> Choice | None:
        options = device_options(ns, request)
        if not options:
            return None
        return 0.0, self.rng.choice(options)


def model_pressure(
    workload: Sequence[tuple[ResourceRequest, float]], capacity: dict[str, int]
) -> dict[str, float]:
    """Per GPU model: the share of its GPUs that model-constrained pods are expected to need.

    Each constrained shape's GPU demand (its share of the workload's GPU demand, scaled to the
    cluster's capacity: demand equal to capacity) is spread over the models it allows in
    proportion to their GPU counts; a model's pressure is what lands on it over its count,
    capped at 1. Unconstrained demand lands nowhere in particular, so it adds nothing.
    """
    total_gpus = sum(capacity.values())
    demand = 0.0
    constrained: list[tuple[frozenset[str], float]] = []
    for request, weight in workload:
        gpu = request.gpu
        share = weight * _gpus_of(request)
        demand += share
        if gpu.models and share:
            constrained.append((gpu.models, share))
    pressure: dict[str, float] = dict.fromkeys(capacity, 0.0)
    if not demand or not total_gpus:
        return pressure
    for models, share in constrained:
        allowed = sum(capacity.get(m, 0) for m in models)
        if not allowed:
            continue
        for m in models:
            if m in pressure:
                pressure[m] += share / demand * total_gpus / allowed
    return {m: min(1.0, p) for m, p in pressure.items()}


def _gpus_of(request: ResourceRequest) -> float:
    gpu = request.gpu
    if gpu.kind is GpuKind.WHOLE:
        return float(gpu.devices)
    if gpu.kind is GpuKind.PORTION:
        return float(gpu.portion or 0) * gpu.devices
    if gpu.kind is GpuKind.MEMORY:
        return 0.5 * gpu.devices  # size unknown until placed: counted as half a device
    return 0.0


class FragmentationGradient:
    """FGD: place where the node's fragmentation (seen by the typical workload) grows least.

    Two terms are added to the paper's score (docs/placement.md has the ablation):

    * ``pack`` × the node's GPU utilisation after placement breaks the many ties and near-ties
      between nodes in favour of fuller ones;
    * ``scarcity`` × Σ over the devices taken of (GPUs taken × the model's pressure): GPUs of a
      model that constrained pods are expected to need (``model_pressure``) cost more, so pods
      that could run elsewhere leave them to the pods that cannot;
    * ``strand`` × the growth of the node's *stranded* GPUs: free GPUs its free CPU and memory
      could not feed at the workload's CPU-per-GPU and memory-per-GPU ratios. FGD looks one pod
      ahead (does a typical pod still fit?); stranding looks at what the node can still take in
      total, so CPU-heavy pods stop exhausting the CPU of nodes whose GPUs are still free.
      Its weight follows the workload's mix (``strand_weight``): ``strand_max`` where shared
      GPUs carry 40% or more of the GPU demand, nothing at 30% or less, a straight line
      between. Where most demand is fractional, CPU and memory run out before GPUs and
      stranding decides how much is placed (gpushare40/100: +0.4–0.6 points at 130%, no longer
      behind the paper's FGD); where whole and multi-GPU pods carry the demand, the free whole
      GPUs that stranding would spend are what they need (cpu050/multigpu20/30 dropped pods
      below saturation with it), so it stays off (docs/placement.md has the ablation).
    """

    name = "fgd"
    randomised = False
    pack = 0.1
    scarcity = 1.0
    strand_max = 0.3
    strand_from, strand_full = 0.3, 0.4
    """The shared share of GPU demand where the stranding term starts and where it is whole."""
    damping = 0.5

    def __init__(self, workload: Sequence[tuple[ResourceRequest, float]] | None = None) -> None:
        self.workload = list(workload or default_workload())
        self.fragmentation = Fragmentation(self.workload, self.damping)
        self.pressure: dict[str, float] = {}
        gpus = sum(w * _gpus_of(r) for r, w in self.workload)
        self.cpu_per_gpu = sum(w * r.cpu_milli for r, w in self.workload) / gpus if gpus else 0.0
        self.mem_per_gpu = sum(w * r.memory for r, w in self.workload) / gpus if gpus else 0.0
        self.strand = self.strand_weight(self.workload)

    @classmethod
    def strand_weight(cls, workload: Sequence[tuple[ResourceRequest, float]]) -> float:
        """The stranding term's weight for this mix (see the class docstring)."""
        gpus = sum(w * _gpus_of(r) for r, w in workload)
        shared = sum(w * _gpus_of(r) for r, w in workload if r.gpu.shared)
        if not gpus:
            return 0.0
        ramp = (shared / gpus - cls.strand_from) / (cls.strand_full - cls.strand_from)
        return cls.strand_max * min(1.0, max(0.0, ramp))

    def observe_cluster(self, capacity: dict[str, int]) -> None:
        """The GPU count of every model in the cluster (for the scarcity term)."""
        self.pressure = model_pressure(self.workload, capacity)

    def _stranded(self, ns: NodeState, free_cpu: int, free_mem: int, used: Sequence[int]) -> float:
        """Free GPUs the node's free CPU and memory could not feed at the workload's ratios."""
        free = sum((m - u) / m for m, u in zip(ns.dev_memory, used, strict=True))
        usable = free
        if self.cpu_per_gpu:
            usable = min(usable, free_cpu / self.cpu_per_gpu)
        if self.mem_per_gpu:
            usable = min(usable, free_mem / self.mem_per_gpu)
        return free - usable

    def evaluate(self, ns: NodeState, request: ResourceRequest) -> Choice | None:
        options = device_options(ns, request)
        if not options:
            return None
        frag = self.fragmentation
        before = frag.of_node(ns)
        cpu, mem = ns.free_cpu - request.cpu_milli, ns.free_mem - request.memory
        best: Choice | None = None
        pressure = self.pressure
        stranded_before = self._stranded(ns, ns.free_cpu, ns.free_mem, ns.dev_used) if self.strand else 0.0
        for devices in options:
            used = used_after(ns, request, devices)
            score = before - frag.measure(ns, cpu, mem, used) + self.pack * _gpu_util(ns, used)
            if self.strand:
                score -= self.strand * (self._stranded(ns, cpu, mem, used) - stranded_before)
            if self.scarcity and pressure:
                score -= self.scarcity * sum(
                    (used[i] - ns.dev_used[i]) / ns.dev_memory[i] * pressure.get(ns.dev_models[i], 0.0)
                    for i in devices
                )
            if best is None or score > best[0]:
                best = (score, devices)
        return best


POLICIES = ("fgd", "binpack", "spread", "best-fit", "random")
DEFAULT_POLICY = "fgd"


def make_policy(
    name: str,
    rng: random.Random,
    workload: Sequence[tuple[ResourceRequest, float]] | None = None,
) -> Policy:
    from tessera.core.errors import InvalidRequest

    if name == "fgd":
        return FragmentationGradient(workload)
    if name == "binpack":
        return BinPack()
    if name == "spread":
        return Spread()
    if name == "best-fit":
        return BestFit()
    if name == "random":
        return Random(rng)
    raise InvalidRequest("policy", f"must be one of {', '.join(POLICIES)}", name)
