"""Per-GPU and per-workload usage on the API server's ``/metrics`` in embedded mode.

On Kubernetes each tessera-node exports these per node (docs/node-agent.md), so the API server
does not repeat them. In embedded mode there is no node agent process: the server reads NVML
itself (tessera.local.usage), and exports the same per-GPU series under the node agent's names
and labels (``node, gpu_uuid, model, gpu``), so the ``tessera-nodes`` dashboard and queries
written for a cluster work on one machine; and per workload, the GPU memory its processes use and
its GPUs' worth of utilisation."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

GPU_LABELS = ["node", "gpu_uuid", "model", "gpu"]


@dataclass(frozen=True)
class GpuUse:
    node: str
    uuid: str
    model: str
    index: int
    memory: int
    used: int | None
    utilization: float | None
    """0 to 1."""


def gpu_uses(cluster: Mapping[str, Any]) -> tuple[GpuUse, ...]:
    """The GPUs of an embedded server's cluster document with what NVML reported for them;
    none for another backend (its node agents export them) or where nothing was read."""
    if cluster.get("backend") != "embedded":
        return ()
    out = []
    for n in cluster.get("nodes", []):
        for g in n.get("gpus", []):
            if g.get("usedBytes") is None:
                continue
            out.append(GpuUse(str(n.get("name", "")), str(g.get("uuid", "")), str(g.get("model", "")),
                              int(g.get("index", 0)), int(g.get("memoryBytes", 0)),
                              int(g["usedBytes"]), g.get("utilization")))
    return tuple(out)


def families(gpus: tuple[GpuUse, ...], used: Mapping[tuple[str, str], int],
             busy: Mapping[tuple[str, str], float]) -> Iterator[Metric]:
    if gpus:
        total = GaugeMetricFamily("tessera_gpu_memory_total_bytes", "GPU memory (NVML)", labels=GPU_LABELS)
        mem = GaugeMetricFamily("tessera_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=GPU_LABELS)
        util = GaugeMetricFamily("tessera_gpu_utilization_ratio", "GPU utilisation, 0 to 1 (NVML)",
                                 labels=GPU_LABELS)
        for g in gpus:
            labels = [g.node, g.uuid, g.model, str(g.index)]
            total.add_metric(labels, g.memory)
            mem.add_metric(labels, g.used or 0)
            if g.utilization is not None:
                util.add_metric(labels, g.utilization)
        yield from (total, mem, util)
    if used or busy:
        wmem = GaugeMetricFamily("tessera_workload_gpu_memory_used_bytes",
                                 "GPU memory a workload's processes use (NVML; embedded mode)",
                                 labels=["project", "workload"])
        wbusy = GaugeMetricFamily("tessera_workload_gpu_busy",
                                  "GPUs' worth of a workload's processes' utilisation (embedded "
                                  "mode; 0.4 = 40% of one GPU)", labels=["project", "workload"])
        for (project, name), v in sorted(used.items()):
            wmem.add_metric([project, name], v)
        for (project, name), b in sorted(busy.items()):
            wbusy.add_metric([project, name], b)
        yield from (wmem, wbusy)
