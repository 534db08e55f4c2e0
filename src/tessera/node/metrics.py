"""The agent's Prometheus metrics (prometheus-client), rendered from the latest NodeUsage.

Every metric is documented in docs/node-agent.md. Per GPU: labels ``node, gpu_uuid, model, gpu``; per
container: ``node, namespace, pod, container, workload, project, gpu_uuid``. The picture is
rebuilt by the agent's sync loop (every second by default) and a scrape only renders it, so a
scrape costs the same whatever NVML or the regions cost to read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.node.usage import NodeUsage

GPU_LABELS = ("node", "gpu_uuid", "model", "gpu")
"""``gpu``: NVML's index of the GPU, the label DCGM-exporter uses, for joins with its metrics."""
CONTAINER_LABELS = ("node", "namespace", "pod", "container", "workload", "project", "gpu_uuid")


@dataclass
class Counters:
    """Monotonic counts the agent (and a reclaimer) add to."""

    loans_reclaimed: dict[tuple[str, str, str, str, str, str], int] = field(default_factory=dict)
    """(namespace, pod, container, workload, project, gpu_uuid) -> loans taken back."""
    escapes: dict[tuple[str, str], int] = field(default_factory=dict)
    """(gpu_uuid, kind) -> escapes detected."""
    escapes_killed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_escape(self, gpu_uuid: str, kind: str) -> None:
        with self.lock:
            self.escapes[(gpu_uuid, kind)] = self.escapes.get((gpu_uuid, kind), 0) + 1

    def add_loan_reclaimed(self, labels: tuple[str, str, str, str, str, str]) -> None:
        with self.lock:
            self.loans_reclaimed[labels] = self.loans_reclaimed.get(labels, 0) + 1


class NodeCollector(Collector):
    def __init__(self, node: str, counters: Counters) -> None:
        self.node = node
        self.counters = counters
        self.usage: NodeUsage | None = None
        self.ready = False
        self.escaped_processes = 0
        self.sync_seconds = 0.0
        self.extra: list[Callable[[], Iterable[Metric]]] = []
        """More metric families, rendered last (a sync step's: the compute share's GPU time)."""
        self.share_fields: list[Callable[[], dict[tuple[str, str, str], dict[str, Any]]]] = []
        """More fields for ``/usage``'s shares (tessera.node.report.ShareFields), a sync step's."""

    def more_share_fields(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for fields in self.share_fields:
            for k, v in fields().items():
                out.setdefault(k, {}).update(v)
        return out

    def collect(self) -> Iterator[Metric]:
        for more in self.extra:
            yield from more()
        node = self.node
        ready = GaugeMetricFamily("tessera_node_ready",
                                  "1 when the agent can enforce GPU shares on this node", labels=["node"])
        ready.add_metric([node], 1.0 if self.ready else 0.0)
        yield ready
        usage = self.usage
        escapes = CounterMetricFamily("tessera_node_gpu_escapes",
                                      "GPU processes found escaping isolation, by kind",
                                      labels=["node", "gpu_uuid", "kind"])
        with self.counters.lock:
            esc = dict(self.counters.escapes)
            loans = dict(self.counters.loans_reclaimed)
            killed = self.counters.escapes_killed
        for (uuid, kind), n in sorted(esc.items()):
            escapes.add_metric([node, uuid, kind], n)
        yield escapes
        k = CounterMetricFamily("tessera_node_gpu_escapes_killed",
                                "escaping processes killed (--on-escape kill)", labels=["node"])
        k.add_metric([node], killed)
        yield k
        g = GaugeMetricFamily("tessera_node_gpu_escaped_processes",
                              "processes escaping isolation now", labels=["node"])
        g.add_metric([node], self.escaped_processes)
        yield g
        read = GaugeMetricFamily("tessera_node_usage_read_seconds",
                                 "time the last read of NVML and the regions took", labels=["node"])
        read.add_metric([node], self.sync_seconds)
        yield read
        if usage is None:
            return
        total = GaugeMetricFamily("tessera_gpu_memory_total_bytes", "GPU memory (NVML)",
                                  labels=list(GPU_LABELS))
        requested = GaugeMetricFamily("tessera_gpu_memory_requested_bytes",
                                      "GPU memory the shares on this GPU requested",
                                      labels=list(GPU_LABELS))
        used = GaugeMetricFamily("tessera_gpu_memory_used_bytes", "GPU memory in use (NVML)",
                                 labels=list(GPU_LABELS))
        util = GaugeMetricFamily("tessera_gpu_utilization_ratio",
                                 "GPU utilisation, 0 to 1 (NVML)", labels=list(GPU_LABELS))
        for gpu in usage.gpus:
            labels = [node, gpu.uuid, usage.models.get(gpu.uuid, ""), str(gpu.index)]
            total.add_metric(labels, gpu.memory_total)
            requested.add_metric(labels, usage.requested(gpu.uuid))
            used.add_metric(labels, gpu.memory_used)
            if gpu.utilization is not None:
                util.add_metric(labels, gpu.utilization / 100)
        yield from (total, requested, used, util)
        names = {
            "charged": ("tessera_container_gpu_memory_charged_bytes",
                        "GPU memory the isolation library charged the container"),
            "nvml": ("tessera_container_gpu_memory_used_bytes",
                     "GPU memory NVML reports for the container's processes"),
            "request": ("tessera_container_gpu_memory_request_bytes", "guaranteed GPU memory"),
            "limit": ("tessera_container_gpu_memory_limit_bytes", "GPU memory cap"),
            "loaned": ("tessera_container_gpu_memory_loaned_bytes",
                       "GPU memory held above the request (on loan)"),
            "sm": ("tessera_container_gpu_sm_utilization_ratio",
                   "SM utilisation of the container's processes, 0 to 1 (NVML)"),
        }
        fams = {k: GaugeMetricFamily(n, h, labels=list(CONTAINER_LABELS))
                for k, (n, h) in names.items()}
        reclaimed = CounterMetricFamily("tessera_container_gpu_loans_reclaimed",
                                        "GPU memory loans taken back from the container",
                                        labels=list(CONTAINER_LABELS))
        for v in usage.shares:
            s = v.share
            for container in s.containers or ("",):
                labels = [node, s.namespace, s.pod, container, s.workload, s.project, v.gpu_uuid]
                fams["charged"].add_metric(labels, v.charged_bytes)
                fams["nvml"].add_metric(labels, v.nvml_bytes)
                fams["request"].add_metric(labels, v.request_bytes)
                fams["limit"].add_metric(labels, v.limit_bytes)
                fams["loaned"].add_metric(labels, v.loaned_bytes)
                if v.sm_util is not None:
                    fams["sm"].add_metric(labels, v.sm_util / 100)
                key = (s.namespace, s.pod, container, s.workload, s.project, v.gpu_uuid)
                reclaimed.add_metric(labels, loans.get(key, 0))
        yield from fams.values()
        yield reclaimed


def registry_for(collector: NodeCollector, *, process_metrics: bool = True) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    if process_metrics:
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry
