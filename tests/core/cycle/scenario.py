"""Declarative scenarios for the scheduling cycle: nodes, projects, workloads, then the plan.

Running workloads name where each pod is (``on=["n1:0", "n2:1,2"]``); pending ones do not.
``bound(plan)`` and ``evicted(plan)`` turn a plan back into the same short notation.
"""

from __future__ import annotations

from decimal import Decimal

from tessera.core.cycle import CycleConfig, Plan, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.state import Placement
from tessera.core.units import GiB


def nodes(count: int = 1, gpus: int = 1, memory_gib: int = 16, model: str = "V100M16", prefix: str = "n") -> list[Node]:
    return [
        Node(
            f"{prefix}{k + 1}",
            tuple(GpuDevice(f"GPU-{prefix}{k + 1}-{i}", i, memory_gib * GiB, model) for i in range(gpus)),
            cpu_milli=64_000,
            memory=512 * GiB,
        )
        for k in range(count)
    ]


def project(
    name: str,
    deserved: float = 0.0,
    limit: float | None = None,
    weight: float = 1.0,
    priority: int = 100,
    parent: str | None = None,
    **kw: object,
) -> Project:
    return Project(name, Quota(deserved, limit, weight), priority=priority, parent=parent, **kw)  # type: ignore[arg-type]


def request(gpu: float | str | None = None, *, memory_gib: float | None = None, devices: int = 1,
            limit: float | str | None = None, cpu: int = 0) -> ResourceRequest:
    if memory_gib is not None:
        g = GpuRequest.of_memory(int(memory_gib * GiB), devices=devices)
    elif gpu is None:
        g = GpuRequest.none()
    elif Decimal(str(gpu)) >= 1:
        g = GpuRequest.whole(int(Decimal(str(gpu))))
    else:
        g = GpuRequest.fraction(Decimal(str(gpu)), devices=devices, limit=limit)
    return ResourceRequest(g, cpu_milli=cpu)


def placement(node_list: list[Node], req: ResourceRequest, where: str) -> Placement:
    name, _, devs = where.partition(":")
    node = next(n for n in node_list if n.name == name)
    devices = tuple(int(d) for d in devs.split(",")) if devs else ()
    mem = {g.index: g.memory for g in node.gpus}
    gpu = req.gpu
    return Placement(
        name,
        devices,
        tuple(gpu.bytes_on(mem[d]) for d in devices),
        tuple(gpu.limit_bytes_on(mem[d]) for d in devices),
        gpu.kind is GpuKind.WHOLE,
        req.cpu_milli,
        req.memory,
    )


def workload(
    node_list: list[Node],
    id: str,
    project: str,
    gpu: float | str | None = None,
    *,
    pods: int = 1,
    min_members: int | None = None,
    cls: str = "train",
    on: list[str] | None = None,
    created: float = 0.0,
    started: float | None = None,
    memory_gib: float | None = None,
    devices: int = 1,
    limit: float | str | None = None,
    req: ResourceRequest | None = None,
    **kw: object,
) -> Workload:
    r = req or request(gpu, memory_gib=memory_gib, devices=devices, limit=limit)
    placements: tuple[Placement | None, ...] = ()
    if on is not None:
        placements = tuple(placement(node_list, r, w) if w else None for w in on) + (None,) * (pods - len(on))
        if started is None:
            started = 0.0
    return Workload(
        id, project, (r,) * pods, priority_class=cls, min_members=min_members, created_at=created,
        started_at=started, placements=placements, **kw,  # type: ignore[arg-type]
    )


def cycle(node_list: list[Node], projects: list[Project], workloads: list[Workload], now: float = 1000.0,
          **config: object) -> Plan:
    snap = Snapshot(tuple(node_list), tuple(projects), tuple(workloads), now)
    return run_cycle(snap, CycleConfig(**config))  # type: ignore[arg-type]


def where(p: Placement) -> str:
    return f"{p.node}:{','.join(str(d) for d in p.devices)}"


def bound(plan: Plan) -> dict[str, list[str]]:
    return {b.workload_id: [where(pb.placement) for pb in b.pods] for b in plan.bindings}


def evicted(plan: Plan) -> set[str]:
    return set(plan.evicted)


def waiting(plan: Plan) -> dict[str, str]:
    return {w.workload_id: w.reason for w in plan.waiting}
