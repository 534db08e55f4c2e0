"""Elastic workloads' bad input (docs/scheduling.md#elastic-workloads): a workload may run
between ``min`` and ``max`` workers (``--min-workers`` / ``--workers``; on Kubernetes a
PodGroup's ``minMember`` below its pods); a maximum the cluster could never hold, even empty, is
refused naming ``--workers`` (``spec.workers``): the workload could never grow that far."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest, Node


def pods_that_fit(request: GpuRequest, node: Node) -> int:
    """How many pods of ``request`` an empty ``node`` holds (each pod's devices distinct)."""
    gpus = [g for g in node.gpus if request.allows(g.model)]
    if request.kind is GpuKind.WHOLE:
        per_device = [1 for _ in gpus]
    elif request.kind is GpuKind.MEMORY:
        assert request.memory is not None
        per_device = [g.schedulable // request.memory for g in gpus]
    else:
        assert request.portion is not None
        per_device = [int(Decimal(1) / request.portion) for _ in gpus]
    return sum(per_device) // max(request.devices, 1)


def check_elastic_max(request: GpuRequest, nodes: Iterable[Node], min_workers: int, workers: int) -> None:
    """Refuse an elastic workload (``min_workers`` < ``workers``) whose maximum could never run
    at once on this cluster, even empty. A fixed gang that can never fit is not refused here:
    it waits, told why (the cycle's never-fits reason)."""
    if min_workers >= workers or request.kind is GpuKind.NONE:
        return
    room = sum(pods_that_fit(request, n) for n in nodes)
    if workers > room:
        raise InvalidRequest("spec.workers", f"elastic maximum of {workers} workers (minimum "
                             f"{min_workers}) is more than this cluster could ever hold at once "
                             f"({room} such workers, even empty)", workers)
