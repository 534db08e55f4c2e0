"""Fragmentation in the sense of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

A node's fragmentation, seen by a typical workload, is the expected free GPU capacity (in GPUs)
that the workload's pods could not use, weighted by how often each pod shape occurs:

* a pod that cannot run on the node at all (CPU, memory, model, or too few suitable GPUs)
  sees every free GPU share on the node as fragmented;
* a pod that can run sees as fragmented the free share of each GPU it could not use: a shared
  pod cannot use a GPU with less free than it needs, a whole-GPU pod cannot use a partly used GPU.

The FGD policy places a pod where it raises fragmentation least.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.core.model import GpuKind, ResourceRequest
from tessera.core.state import NodeState


@dataclass(frozen=True, slots=True)
class _Shape:
    weight: float
    cpu: int
    mem: int
    kind: GpuKind
    count: int
    request: ResourceRequest


def typical_workload(requests: Iterable[ResourceRequest]) -> list[tuple[ResourceRequest, float]]:
    """The typical workload of a stream of requests: each distinct shape with how often it occurs."""
    counts = Counter(requests)
    return [(request, float(count)) for request, count in counts.most_common()]


def default_workload() -> list[tuple[ResourceRequest, float]]:
    """A plain mix used when the caller knows nothing of its workload."""
    from decimal import Decimal

    from tessera.core.model import GpuRequest

    mix: list[tuple[ResourceRequest, float]] = [
        (ResourceRequest(GpuRequest.fraction(Decimal(p))), w * w)
        for p, w in (("0.25", 0.15), ("0.5", 0.2), ("0.75", 0.05))
    ]
    mix += [(ResourceRequest(GpuRequest.whole(n)), w * w) for n, w in ((1, 0.4), (2, 0.1), (4, 0.05), (8, 0.05))]
    return mix


_NONE, _WHOLE, _SHARED = 0, 1, 2


class _Group:
    """Shapes that need the same of one device (kind, device count, bytes), with their CPU/memory."""

    __slots__ = ("count", "cpus", "kind", "max_cpu", "max_mem", "mems", "need", "weight", "weights")

    def __init__(self, kind: int, count: int, need: int) -> None:
        self.kind, self.count, self.need = kind, count, need
        self.cpus: list[int] = []
        self.mems: list[int] = []
        self.weights: list[float] = []
        self.weight = 0.0
        self.max_cpu = self.max_mem = 0

    def add(self, cpu: int, mem: int, weight: float) -> None:
        self.cpus.append(cpu)
        self.mems.append(mem)
        self.weights.append(weight)
        self.weight += weight
        self.max_cpu = max(self.max_cpu, cpu)
        self.max_mem = max(self.max_mem, mem)


class Fragmentation:
    """Measures nodes against a typical workload; results are memoised per node state."""

    MAX_MEMO = 400_000

    def __init__(self, workload: Sequence[tuple[ResourceRequest, float]], damping: float = 0.5) -> None:
        """``workload``: shapes with their frequencies; each is weighted by frequency^``damping``.

        FGD weights shapes by plain frequency (damping 1). Damping it (0.5, the square root) lets
        rare but large shapes (8-GPU pods, model-constrained pods) keep the nodes they need
        (docs/placement.md has the ablation).
        """
        weighted = [(r, w**damping) for r, w in workload if w > 0]
        total = sum(w for _, w in weighted) or 1.0
        self.shapes = [_Shape(w / total, r.cpu_milli, r.memory, r.gpu.kind, r.gpu.devices, r) for r, w in weighted]
        self._memo: dict[tuple[object, ...], float] = {}
        self._needs: dict[int, list[tuple[int, bool]]] = {}
        self._groups: dict[int, list[_Group]] = {}
        self._fit: dict[tuple[int, int, int], list[float]] = {}

    def of_node(self, ns: NodeState) -> float:
        return self.measure(ns, ns.free_cpu, ns.free_mem, ns.dev_used)

    def measure(self, ns: NodeState, free_cpu: int, free_mem: int, used: Sequence[int]) -> float:
        key = (
            ns.static_id,
            free_cpu,
            free_mem,
            tuple(sorted(used)) if ns.homogeneous else tuple(used),
        )
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > self.MAX_MEMO:
                self._memo.clear()
                self._fit.clear()
            if ns.homogeneous:
                value = self._homogeneous(ns, free_cpu, free_mem, used)
            else:
                value = self._general(ns, free_cpu, free_mem, used)
            self._memo[key] = value
        return value

    def _needs_for(self, ns: NodeState) -> list[tuple[int, bool]]:
        """Per shape: bytes needed on one of this node's devices, and whether the model is allowed."""
        needs = self._needs.get(ns.static_id)
        if needs is None:
            mem, model = (ns.dev_memory[0], ns.dev_models[0]) if ns.dev_memory else (1, "")
            needs = [(s.request.gpu.bytes_on(mem), s.request.gpu.allows(model)) for s in self.shapes]
            self._needs[ns.static_id] = needs
        return needs

    def _groups_for(self, ns: NodeState) -> list[_Group]:
        """The shapes that could use this node's GPUs, grouped by what they need of one device.

        Shapes whose model this node lacks are left out: they can use none of its free GPU, which
        is the fragmentation's starting value (all of it).
        """
        groups = self._groups.get(ns.static_id)
        if groups is None:
            by_need: dict[tuple[int, int, int], _Group] = {}
            for shape, (need, allowed) in zip(self.shapes, self._needs_for(ns), strict=True):
                if shape.kind is GpuKind.NONE:
                    key = (_NONE, 0, 0)
                elif not allowed:
                    continue
                elif shape.kind is GpuKind.WHOLE:
                    key = (_WHOLE, shape.count, 0)
                else:
                    key = (_SHARED, shape.count, need)
                group = by_need.get(key)
                if group is None:
                    group = by_need[key] = _Group(*key)
                group.add(shape.cpu, shape.mem, shape.weight)
            groups = self._groups[ns.static_id] = list(by_need.values())
        return groups

    def _fitting_weights(self, ns: NodeState, free_cpu: int, free_mem: int) -> list[float]:
        """Per group: the weight of its shapes whose CPU and memory fit on the node."""
        key = (ns.static_id, free_cpu, free_mem)
        fit = self._fit.get(key)
        if fit is None:
            fit = []
            for g in self._groups_for(ns):
                if free_cpu >= g.max_cpu and free_mem >= g.max_mem:
                    fit.append(g.weight)
                else:
                    fit.append(
                        sum(w for c, m, w in zip(g.cpus, g.mems, g.weights, strict=True) if c <= free_cpu and m <= free_mem)
                    )
            self._fit[key] = fit
        return fit

    def _homogeneous(self, ns: NodeState, free_cpu: int, free_mem: int, used: Sequence[int]) -> float:
        """Fragmentation = free GPU − Σ over groups of (weight that fits) × (free GPU the group can use)."""
        if not ns.dev_memory:
            return 0.0
        size = ns.dev_memory[0]
        frees = sorted(size - u for u in used)
        prefix = [0]
        for f in frees:
            prefix.append(prefix[-1] + f)
        total = prefix[-1]
        if not total:
            return 0.0
        n = len(frees)
        idle = n - bisect_left(frees, size)
        usable_sum = 0.0
        for g, w in zip(self._groups_for(ns), self._fitting_weights(ns, free_cpu, free_mem), strict=True):
            if not w:
                continue
            if g.kind == _SHARED:
                cut = bisect_left(frees, g.need)
                if n - cut >= g.count:
                    usable_sum += w * (total - prefix[cut])
            elif g.kind == _WHOLE:
                if idle >= g.count:
                    usable_sum += w * idle * size
            else:
                usable_sum += w * total
        return (total - usable_sum) / size

    def _general(self, ns: NodeState, free_cpu: int, free_mem: int, used: Sequence[int]) -> float:
        free = [(m - u) / m for m, u in zip(ns.dev_memory, used, strict=True)]
        total = sum(free)
        frag = 0.0
        for shape in self.shapes:
            gpu = shape.request.gpu
            if shape.cpu > free_cpu or shape.mem > free_mem:
                frag += shape.weight * total
                continue
            if shape.kind is GpuKind.NONE:
                continue
            usable = [
                i
                for i, m in enumerate(ns.dev_memory)
                if gpu.allows(ns.dev_models[i])
                and (used[i] == 0 if shape.kind is GpuKind.WHOLE else gpu.bytes_on(m) <= m - used[i])
            ]
            if len(usable) < shape.count:
                frag += shape.weight * total
            else:
                frag += shape.weight * (total - sum(free[i] for i in usable))
        return frag
