"""GPU usage read from Prometheus instead of polling the agents: when ``TESSERA_PROMETHEUS_URL``
is set, the Kubernetes API server asks the Prometheus that scrapes every tessera-node
(``:9400/metrics``, docs/node-agent.md) for the same figures ``/usage`` gives — a handful of
instant queries per round, whatever the number of nodes — and builds each node's report from
them (:func:`tessera.api.usage.report_of`, so the console cannot tell the sources apart).

A node whose agent Prometheus has not scraped for ``stale_after`` seconds (its last
``tessera_node_ready`` sample is that old, or its series are stale) is ``unreachable``; a GPU
node Prometheus has no series of in the last 10 minutes is ``no-agent``; Prometheus itself not answering makes every node ``unreachable``,
saying so. Like the poller, a daemon thread reads every ``TESSERA_USAGE_INTERVAL`` seconds
(default 5) and a request only reads the last reports.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import urllib.error
from collections.abc import Callable
from typing import Any

from tessera.api.prometheus_query import prometheus_query
from tessera.api.usage import NodeReport, report_of

log = logging.getLogger(__name__)

_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
GPU = {"memoryUsedBytes": "tessera_gpu_memory_used_bytes",
       "memoryTotalBytes": "tessera_gpu_memory_total_bytes",
       "utilization": "tessera_gpu_utilization_ratio"}
SHARE = {"usedBytes": "tessera_container_gpu_memory_used_bytes",
         "chargedBytes": "tessera_container_gpu_memory_charged_bytes",
         "loanedBytes": "tessera_container_gpu_memory_loaned_bytes",
         "requestBytes": "tessera_container_gpu_memory_request_bytes",
         "limitBytes": "tessera_container_gpu_memory_limit_bytes",
         "smUtilization": "tessera_container_gpu_sm_utilization_ratio"}
SEEN = "max_over_time(timestamp(tessera_node_ready)[10m:5s])"
"""When each node's agent was last scraped (within 10 minutes): a target that stops answering
gets a staleness marker, so the plain series vanishes at once; this keeps its last time."""


class PrometheusUsage:
    def __init__(self, url: str, nodes: Callable[[], list[str]], interval: float | None = None,
                 timeout: float | None = None, stale_after: float | None = None) -> None:
        """``nodes``: the GPU nodes to report on."""
        self.url = url.rstrip("/")
        self.nodes = nodes
        self.interval = interval or float(os.environ.get("TESSERA_USAGE_INTERVAL", "5"))
        self.timeout = timeout or float(os.environ.get("TESSERA_USAGE_TIMEOUT", "2"))
        self.stale_after = stale_after or max(60.0, 3 * self.interval)
        """Prometheus scrapes every 15-60 s: a sample this old means the agent is not scraped."""
        self._reports: dict[str, NodeReport] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reports(self) -> dict[str, NodeReport]:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="tessera-prom-usage",
                                                    daemon=True)
                    self._thread.start()
        with self._lock:
            return dict(self._reports)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fresh = self.read()
                with self._lock:
                    self._reports = fresh
            except Exception as exc:  # the Node cache not loaded yet, ...: try again
                log.warning("reading GPU usage from Prometheus failed: %r", exc)
            self._stop.wait(self.interval)

    def _query(self, expr: str) -> list[dict[str, Any]]:
        return prometheus_query(self.url, "/api/v1/query", {"query": expr}, "vector",
                                self.timeout)

    def read(self) -> dict[str, NodeReport]:
        """Every GPU node's report, now (one round of queries)."""
        nodes = self.nodes()
        now = time.time()
        if not _URL.match(self.url):
            why = (f"TESSERA_PROMETHEUS_URL: must be http(s)://HOST:PORT[/PATH] "
                   f"(got {self.url[:100]!r})")
            return {n: NodeReport(n, "unreachable", why, now) for n in nodes}
        try:
            seen = {s["metric"].get("node", ""): float(s["value"][1]) for s in self._query(SEEN)}
            gpus: dict[str, dict[str, dict[str, Any]]] = {}
            for field, metric in GPU.items():
                for s in self._query(metric):
                    m = s["metric"]
                    g = gpus.setdefault(m.get("node", ""), {}).setdefault(
                        m.get("gpu_uuid", ""), {"uuid": m.get("gpu_uuid", ""), "utilization": None})
                    g[field] = float(s["value"][1])
            shares: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {}
            for field, metric in SHARE.items():
                for s in self._query(metric):
                    m = s["metric"]
                    key = (m.get("namespace", ""), m.get("pod", ""), m.get("gpu_uuid", ""))
                    sh = shares.setdefault(m.get("node", ""), {}).setdefault(key, {
                        "namespace": key[0], "pod": key[1], "gpuUuid": key[2],
                        "workload": m.get("workload", ""), "project": m.get("project", ""),
                        "smUtilization": None})
                    sh[field] = float(s["value"][1])  # each container of a pod: the same share
        except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as exc:
            why = f"Prometheus at {self.url} did not answer: {exc}"
            return {n: NodeReport(n, "unreachable", why, now) for n in nodes}
        out: dict[str, NodeReport] = {}
        for n in nodes:
            if n not in seen:
                out[n] = NodeReport(n, "no-agent", f"Prometheus at {self.url} has no tessera-node "
                                    "metrics for this node", now)
            elif now - seen[n] > self.stale_after or n not in gpus:
                out[n] = NodeReport(n, "unreachable", f"Prometheus has not scraped this node's "
                                    f"agent for {now - seen[n]:.0f} s", now)
            else:
                out[n] = report_of(n, {"node": n, "gpus": list(gpus.get(n, {}).values()),
                                       "shares": list(shares.get(n, {}).values())}, seen[n])
        return out
