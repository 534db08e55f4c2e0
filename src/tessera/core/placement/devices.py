"""Which devices of one node can take a request, and the device sets worth comparing."""

from __future__ import annotations

from tessera.core import nvlink
from tessera.core.model import COMPUTE_FULL, GpuKind, GpuRequest, ResourceRequest
from tessera.core.state import NodeState, Placement


def host_fits(ns: NodeState, request: ResourceRequest) -> bool:
    return request.cpu_milli <= ns.free_cpu and request.memory <= ns.free_mem


def could_ever_fit(ns: NodeState, request: ResourceRequest) -> bool:
    """Whether the request fits this node when the node is empty."""
    node = ns.node
    if request.cpu_milli > node.cpu_milli or request.memory > node.memory:
        return False
    gpu = request.gpu
    if gpu.kind is GpuKind.NONE:
        return True
    usable = sum(
        1 for size, model in zip(ns.dev_memory, ns.dev_models, strict=True)
        if gpu.allows(model) and gpu.bytes_on(size) <= size
    )
    return usable >= gpu.devices


def fitting_devices(ns: NodeState, gpu: GpuRequest) -> list[int]:
    """Devices that could take one share of this request now."""
    if gpu.kind is GpuKind.WHOLE:
        return [
            i
            for i, model in enumerate(ns.dev_models)
            if ns.dev_tenants[i] == 0 and gpu.allows(model)
        ]
    room = COMPUTE_FULL - gpu.compute_units
    size, used, whole, busy = ns.dev_memory, ns.dev_used, ns.dev_whole, ns.dev_compute
    models = gpu.models
    if ns.homogeneous and size:  # one size and model: what one share needs is asked once
        if models and ns.dev_models[0] not in models:
            return []
        need = size[0] - gpu.bytes_on(size[0])
        return [i for i, u in enumerate(used) if u <= need and not whole[i] and busy[i] <= room]
    return [
        i
        for i, model in enumerate(ns.dev_models)
        if (not models or model in models)
        and gpu.bytes_on(size[i]) <= size[i] - used[i]
        and not whole[i]
        and busy[i] <= room
    ]


def device_options(ns: NodeState, request: ResourceRequest) -> list[tuple[int, ...]]:
    """Device sets a policy chooses between on this node; empty if the node cannot host it.

    Whole GPUs: idle devices are interchangeable, so one set. One shared device: one candidate
    per distinct (free, size, model) state. Several shared devices: the tightest and the
    loosest set, which is where packing and spreading differ.

    On a node with more than one NVLink island (:mod:`tessera.core.nvlink`), a multi-device set
    is taken inside one island whenever one can hold it, and one whole GPU is taken from the
    island with the fewest idle GPUs, so intact islands stay free for multi-GPU pods.
    """
    if not host_fits(ns, request):
        return []
    gpu = request.gpu
    if gpu.kind is GpuKind.NONE:
        return [()]
    fit = fitting_devices(ns, gpu)
    if len(fit) < gpu.devices:
        return []
    islands = ns.node.nvlink
    if islands is not None and nvlink.split(islands):
        return _island_options(ns, gpu, fit, islands)
    return _options(ns, gpu, fit)


def _options(ns: NodeState, gpu: GpuRequest, fit: list[int]) -> list[tuple[int, ...]]:
    if gpu.kind is GpuKind.WHOLE:
        return [tuple(fit[: gpu.devices])]
    if gpu.devices == 1:
        seen: dict[tuple[int, int, str, int], int] = {}
        for i in fit:
            seen.setdefault((ns.dev_memory[i] - ns.dev_used[i], ns.dev_memory[i], ns.dev_models[i],
                             ns.dev_compute[i] if gpu.compute else 0), i)
        return [(i,) for i in sorted(seen.values())]
    by_free = sorted(fit, key=lambda i: (ns.dev_memory[i] - ns.dev_used[i], i))
    tight = tuple(sorted(by_free[: gpu.devices]))
    loose = tuple(sorted(by_free[-gpu.devices :]))
    return [tight] if tight == loose else [tight, loose]


def _island_options(ns: NodeState, gpu: GpuRequest, fit: list[int],
                    islands: tuple[int, ...]) -> list[tuple[int, ...]]:
    groups: dict[int, list[int]] = {}
    for i in fit:
        groups.setdefault(islands[i], []).append(i)
    if gpu.kind is GpuKind.WHOLE:
        # Best fit: the island with the fewest fitting devices that still holds the request
        # (for one GPU: a partly used island before an intact one).
        holding = [g for g in groups.values() if len(g) >= gpu.devices]
        if holding:
            best = min(holding, key=lambda g: (len(g), g[0]))
            return [tuple(best[: gpu.devices])]
        # No island holds it: span as few islands as possible, largest groups first.
        spanning = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
        return [tuple(sorted([i for g in spanning for i in g][: gpu.devices]))]
    if gpu.devices == 1:
        return _options(ns, gpu, fit)
    options: list[tuple[int, ...]] = []
    for group in groups.values():
        if len(group) >= gpu.devices:
            options += [o for o in _options(ns, gpu, group) if o not in options]
    return options or _options(ns, gpu, fit)


def make_placement(ns: NodeState, request: ResourceRequest, devices: tuple[int, ...]) -> Placement:
    gpu = request.gpu
    return Placement(
        node=ns.name,
        devices=devices,
        request_bytes=tuple(gpu.bytes_on(ns.dev_memory[i]) for i in devices),
        limit_bytes=tuple(gpu.limit_bytes_on(ns.dev_memory[i]) for i in devices),
        exclusive=gpu.kind is GpuKind.WHOLE,
        cpu_milli=request.cpu_milli,
        memory=request.memory,
        models=gpu.models,
        gpus=request.gpus,
        compute=gpu.compute_units,
    )


def used_after(ns: NodeState, request: ResourceRequest, devices: tuple[int, ...]) -> list[int]:
    used = list(ns.dev_used)
    for i in devices:
        used[i] += request.gpu.bytes_on(ns.dev_memory[i])
    return used
