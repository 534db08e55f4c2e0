"""The console's Metrics history read from Prometheus: when ``TESSERA_PROMETHEUS_URL`` is set,
``/api/v1/metrics/history`` asks that Prometheus (range queries over the series the API server and
the node agents export, docs/metrics.md) instead of the samples this server kept, so the charts
reach back as far as Prometheus keeps data and survive a restart of the API server.

The answer has the shape of :meth:`tessera.api.history.History.document` (one list per series on
one time grid, ``null`` where Prometheus has no value), plus ``source``. Where Prometheus does not
answer, or holds no ``tessera_cluster_gpus`` series in the window (it does not scrape the API
server), the server's own samples are served with ``source: server`` and a ``note`` saying why —
a misconfigured Prometheus costs the history its reach, never the page.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tessera.api.history import MAX_WORKLOADS, History
from tessera.api.prometheus_query import prometheus_query

MAX_POINTS = 720
"""Points per series at most: a day at two-minute steps, an hour at the server's 10 s."""

_SHARE = "node, namespace, pod, gpu_uuid, project, workload"
"""One share: the container metrics repeat its figures once per container of the pod."""

QUERIES: dict[str, str] = {
    "allocated": "tessera_cluster_gpus_allocated",
    "total": "tessera_cluster_gpus",
    "projects": "sum by (project) (tessera_project_gpu_allocated)",
    "workloads": f"topk({MAX_WORKLOADS}, sum by (project, workload) "
                 "(tessera_workload_gpu_allocated))",
    "busy": "sum(tessera_gpu_utilization_ratio)",
    "projects_busy": f"sum by (project) (max by ({_SHARE}) "
                     "(tessera_container_gpu_sm_utilization_ratio))",
    "workloads_busy": f"topk({MAX_WORKLOADS}, sum by (project, workload) (max by ({_SHARE}) "
                      "(tessera_container_gpu_sm_utilization_ratio)))",
    "projects_used": f"sum by (project) (max by ({_SHARE}) "
                     "(tessera_container_gpu_memory_used_bytes))",
}
"""Each series of the history as PromQL over the names docs/metrics.md lists."""


class PrometheusHistory:
    def __init__(self, url: str, fallback: History, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = url.rstrip("/")
        self.fallback = fallback
        self.timeout = timeout
        self.clock = clock

    def document(self, since: float) -> dict[str, Any]:
        now = self.clock()
        step = max(self.fallback.interval, math.ceil((now - since) / MAX_POINTS))
        points = int((now - since) // step) + 1
        start = now - (points - 1) * step  # the grid ends now: the last point is the newest
        grid = [round(start + k * step, 3) for k in range(points)]
        try:
            got = {name: self._range(expr, start, grid[-1], step) for name, expr in QUERIES.items()}
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            return self._server(since, f"Prometheus at {self.url} did not answer: {exc}")
        if not got["total"]:
            return self._server(since, f"Prometheus at {self.url} holds no tessera_cluster_gpus "
                                "series in this window: does it scrape the API server's /metrics?")

        def line(series: dict[float, float]) -> list[float | None]:
            return [series.get(t) for t in grid]

        def by(name: str, label: str | tuple[str, str]) -> dict[str, list[float | None]]:
            out: dict[str, list[float | None]] = {}
            for labels, series in got[name]:
                key = (labels.get(label, "") if isinstance(label, str)
                       else "/".join(labels.get(x, "") for x in label))
                out[key] = line(series)
            return dict(sorted(out.items()))

        def single(name: str) -> list[float | None]:
            return line(got[name][0][1]) if got[name] else [None] * len(grid)

        used = by("projects_used", "project")
        return {
            "source": "prometheus",
            "interval": step,
            "time": grid,
            "allocated": single("allocated"),
            "total": single("total"),
            "projects": by("projects", "project"),
            "workloads": by("workloads", ("project", "workload")),
            "utilization": {
                "all": single("busy"),
                "projects": by("projects_busy", "project"),
                "workloads": by("workloads_busy", ("project", "workload")),
            },
            "memoryUsed": {"projects": {p: [None if v is None else int(v) for v in vs]
                                        for p, vs in used.items()}},
        }

    def _server(self, since: float, note: str) -> dict[str, Any]:
        return {"source": "server", "note": note, **self.fallback.document(since)}

    def _range(self, expr: str, start: float, end: float, step: float
               ) -> list[tuple[dict[str, str], dict[float, float]]]:
        """``expr`` over the grid: per series its labels and its values by time."""
        result = prometheus_query(self.url, "/api/v1/query_range",
                                  {"query": expr, "start": start, "end": end, "step": step},
                                  "matrix", self.timeout)
        out = []
        for s in result:
            values = {round(float(t), 3): float(v) for t, v in s["values"] if math.isfinite(float(v))}
            out.append((dict(s["metric"]), values))
        return out
