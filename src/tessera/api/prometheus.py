"""The API server's Prometheus metrics (``GET /metrics``), for both backends.

Read from the shared snapshot (:mod:`tessera.api.telemetry`) at scrape time, so a scrape costs
one cached read. Names follow Prometheus conventions (base units, ``_seconds``, ``_total`` for
counters); docs/metrics.md lists each one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.api.telemetry import ACTIVE, SnapshotCache
from tessera.api.usage_metrics import families as usage_families

PENDING_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)


class ApiCollector(Collector):
    def __init__(self, snapshots: SnapshotCache, pending: Histogram) -> None:
        self.snapshots = snapshots
        self.pending = pending
        self._watermark = float(int(time.time()))
        """Workloads that started before this server did are not counted (start times are whole
        seconds)."""
        self._at_mark: set[tuple[str, str, float]] = set()

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshots.get()
        self._observe_started(snap.workloads)
        gpus = GaugeMetricFamily("tessera_cluster_gpus", "GPUs in the cluster")
        gpus.add_metric([], snap.gpus_total)
        alloc = GaugeMetricFamily("tessera_cluster_gpus_allocated",
                                  "GPUs allocated to workloads (fractions count their share)")
        alloc.add_metric([], snap.gpus_allocated)
        mem = GaugeMetricFamily("tessera_cluster_gpu_memory_bytes", "GPU memory by state",
                                labels=["state"])
        mem.add_metric(["total"], snap.gpu_memory_total)
        mem.add_metric(["allocated"], snap.gpu_memory_allocated)
        mem.add_metric(["loaned"], snap.gpu_memory_loaned)
        if snap.gpu_memory_used is not None:  # only where the node agents report it
            mem.add_metric(["used"], snap.gpu_memory_used)
        yield from (gpus, alloc, mem)
        fams = {
            "deserved": GaugeMetricFamily("tessera_project_gpu_deserved",
                                          "GPUs the project's quota guarantees", labels=["project"]),
            "limit": GaugeMetricFamily("tessera_project_gpu_limit",
                                       "the most GPUs the project may hold (absent: no limit)",
                                       labels=["project"]),
            "allocated": GaugeMetricFamily("tessera_project_gpu_allocated",
                                           "GPUs the project's workloads hold", labels=["project"]),
            "requested": GaugeMetricFamily("tessera_project_gpu_requested",
                                           "GPUs the project's active workloads ask for",
                                           labels=["project"]),
            "fair": GaugeMetricFamily("tessera_project_gpu_fair_share",
                                      "the project's fair share of the cluster's GPUs now",
                                      labels=["project"]),
            "weight": GaugeMetricFamily("tessera_project_over_quota_weight",
                                        "weight of the project's share of idle GPUs",
                                        labels=["project"]),
        }
        for p in snap.projects:
            fams["deserved"].add_metric([p.name], p.deserved)
            if p.limit is not None:
                fams["limit"].add_metric([p.name], p.limit)
            fams["allocated"].add_metric([p.name], p.allocated)
            fams["requested"].add_metric([p.name], p.requested)
            fams["fair"].add_metric([p.name], p.fair_share)
            fams["weight"].add_metric([p.name], p.weight)
        yield from fams.values()
        held = GaugeMetricFamily("tessera_workload_gpu_allocated",
                                 "GPUs an active workload holds (fractions count their share)",
                                 labels=["project", "workload"])
        for w in snap.workloads:
            if w.phase in ACTIVE and w.allocated > 0:
                held.add_metric([w.project, w.name], w.allocated)
        yield held
        if snap.gpu_uses:  # embedded mode: no node agent exports these (usage_metrics)
            yield from usage_families(snap.gpu_uses, snap.workloads_used, snap.workloads_busy)
        phases = GaugeMetricFamily("tessera_workloads", "workloads by type and phase",
                                   labels=["type", "phase"])
        for (kind, phase), n in sorted(snap.phases.items()):
            phases.add_metric([kind, phase], n)
        yield phases

    def _observe_started(self, workloads: tuple) -> None:  # type: ignore[type-arg]
        """Time pending of each workload that started since the last scrape: a watermark on the
        start time (documents give whole seconds, so the workloads seen at the watermark's own
        second are remembered, and nothing else is kept per workload)."""
        mark, at_mark = self._watermark, self._at_mark
        new_mark, new_at = mark, set(at_mark)
        for w in workloads:
            if w.started is None or w.created is None or w.started < mark:
                continue
            key = (w.project, w.name, w.created)
            if w.started == mark and key in at_mark:
                continue
            since = w.created if w.pending_since is None else max(w.created, w.pending_since)
            self.pending.labels(w.type).observe(max(0.0, w.started - since))
            if w.started > new_mark:
                new_mark, new_at = w.started, {key}
            elif w.started == new_mark:
                new_at.add(key)
        self._watermark, self._at_mark = new_mark, new_at


def api_registry(snapshots: SnapshotCache) -> CollectorRegistry:
    registry = CollectorRegistry()
    pending = Histogram("tessera_workload_pending_seconds",
                        "time from becoming Pending (submitted, requeued or resumed) until a "
                        "workload started", ["type"],
                        buckets=PENDING_BUCKETS, registry=None)
    # The collector first: it observes the workloads it sees started, then the histogram is read.
    registry.register(ApiCollector(snapshots, pending))
    registry.register(pending)
    return registry
