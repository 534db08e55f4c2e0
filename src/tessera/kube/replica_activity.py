"""What the autoscaler knows of one scaling inference's traffic on Kubernetes: each replica's
connections as its tessera proxy recorded them (``http://POD_IP:9464/activity``,
tessera.kube.replica_proxy), on the autoscaler's clock.

The proxy reports buckets of changes with their ages; :meth:`Activity.update` turns them into
times (the answer's arrival minus the age: never earlier than the change really was, so a
scale-down is never early) and keeps them for the scale-down delay and the throughput window.
The sum over the replicas is the service's open connections as a step function of time
(tessera.core.autoscale.total), so the delay runs from when the connections really closed.
What the autoscaler could not see (it started, or missed more than the proxy keeps) moves
``known_since`` on: no scale-down until the delay has passed since then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from tessera.kube import replica_proxy
from tessera.kube.replica_proxy import KEEP


@dataclass
class _Bucket:
    first: float
    last: float
    top: int
    end: int
    opened: int


@dataclass
class _Pod:
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    seen: int = 0
    """The highest bucket id read."""
    boot: str | None = None
    """The proxy's start it was read from (a restarted proxy numbers its buckets afresh)."""
    base: tuple[float, int] | None = None
    """The open connections from a time on, before the buckets kept (pruned, or not seen)."""
    open: int = 0
    read: float = 0.0
    """When its proxy last answered."""
    ended: float | None = None
    """When the pod went (its connections count no more)."""

    def steps(self) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []

        def add(t: float, v: float) -> None:
            t = max(t, out[-1][0]) if out else t  # in order despite the answers' jitter
            if out and out[-1][0] == t:
                out[-1] = (t, v)
            else:
                out.append((t, v))

        if self.base is not None:
            add(*self.base)
        for _, b in sorted(self.buckets.items()):
            add(b.first, b.top)
            add(b.last, b.end)
        if self.ended is not None:
            add(self.ended, 0)
        return out


@dataclass
class Activity:
    known_since: float
    pods: dict[str, _Pod] = field(default_factory=dict)
    due: float | None = None
    """When the next scale-down falls due (tessera.core.autoscale.Decision.due)."""
    history: list[tuple[float, int]] = field(default_factory=list)
    """(time of the decision, replicas) at each change."""

    def update(self, name: str, doc: dict[str, Any], received: float) -> None:
        """One proxy's ``/activity`` answer, received at ``received``."""
        pod = self.pods.setdefault(name, _Pod())
        if pod.boot is not None and doc.get("boot") != pod.boot:  # restarted: what it had, gone
            pod.buckets.clear()
            pod.seen, pod.base = 0, None
            self.known_since = max(self.known_since, received)
        pod.boot = doc.get("boot")
        rows = doc.get("buckets") or []
        first_id = int(rows[0][0]) if rows else int(doc["next"])
        if first_id > pod.seen + 1:  # changes the proxy no longer keeps: unknown
            self.known_since = max(self.known_since, received)
            pod.buckets.clear()
            pod.base = (received, int(doc["open"])) if not rows else None
        for i, first_age, last_age, top, end, opened in rows:
            pod.buckets[int(i)] = _Bucket(received - float(first_age),
                                          received - float(last_age), int(top), int(end),
                                          int(opened))
            pod.seen = max(pod.seen, int(i))
        pod.seen = max(pod.seen, int(doc["next"]) - 1)
        pod.open = int(doc["open"])
        pod.read = received
        pod.ended = None

    def unread_recently(self, names: list[str], now: float) -> list[str]:
        """Of the replicas whose proxy did not answer now, those read less than ``KEEP``
        seconds ago (what they did since then may still come; one never read, or silent longer
        than its proxy remembers, holds nothing back)."""
        return [n for n in names if n in self.pods and now - self.pods[n].read < KEEP]

    def went(self, live: set[str], now: float) -> None:
        """Pods not in ``live`` are gone: their connections count no more from ``now``."""
        for name, pod in self.pods.items():
            if name not in live and pod.ended is None:
                pod.ended = now

    def prune(self, before: float) -> None:
        """Forget what only matters before ``before``."""
        for name, pod in list(self.pods.items()):
            if pod.ended is not None and pod.ended < before:
                del self.pods[name]
                continue
            for i in sorted(pod.buckets):
                b = pod.buckets[i]
                if b.last >= before:
                    break
                pod.base = (b.last, b.end)
                del pod.buckets[i]

    def series(self) -> list[list[tuple[float, float]]]:
        """Each pod's open connections as a step function."""
        return [p.steps() for p in self.pods.values()]

    def opened(self) -> list[float]:
        """When connections were opened (a bucket's openings at its last change)."""
        return [b.last for p in self.pods.values() for b in p.buckets.values()
                for _ in range(b.opened)]

    def open_by_pod(self) -> dict[str, int]:
        return {n: p.open for n, p in self.pods.items() if p.ended is None}


def fetch(ip: str, http: httpx.Client | None = None, timeout: float = 0.5
          ) -> dict[str, Any] | None:
    """A replica proxy's ``/activity``, or None when it does not answer (not started yet, or
    gone). ``http``: a client kept between calls (a new one costs milliseconds of CPU)."""
    url = f"http://{ip}:{replica_proxy.METRICS_PORT}/activity"
    try:
        r = http.get(url, timeout=timeout) if http is not None else httpx.get(url,
                                                                              timeout=timeout)
        doc = json.loads(r.text) if r.status_code == 200 else None
        return doc if isinstance(doc, dict) and "next" in doc and "open" in doc else None
    except (httpx.HTTPError, ValueError):
        return None
