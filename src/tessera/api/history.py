"""GPU allocation over time, kept by the API server for the console's Metrics page.

A daemon thread takes a sample every ``interval`` seconds (``TESSERA_HISTORY_INTERVAL``, default
10 s) from the shared snapshot: GPUs allocated in all, per project, and per active workload.
Retention is bounded (``TESSERA_HISTORY_HOURS``, default 6 h; at most 100 workloads per sample,
the largest first), so memory stays flat however long the server runs. Where a Prometheus server
is configured, the console's charts can come from it instead; without one, these samples are
what there is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from tessera.api.telemetry import ACTIVE, SnapshotCache

MAX_WORKLOADS = 100


@dataclass(frozen=True)
class Sample:
    time: float
    allocated: float
    total: float
    projects: dict[str, float]
    workloads: dict[str, float]
    """``project/name`` -> GPUs allocated."""


class History:
    def __init__(self, snapshots: SnapshotCache, interval: float | None = None,
                 hours: float | None = None) -> None:
        self.snapshots = snapshots
        self.interval = interval or float(os.environ.get("TESSERA_HISTORY_INTERVAL", "10"))
        hours = hours or float(os.environ.get("TESSERA_HISTORY_HOURS", "6"))
        self.samples: deque[Sample] = deque(maxlen=max(1, int(hours * 3600 / self.interval)))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        snap = self.snapshots.get()
        active = sorted((w for w in snap.workloads if w.phase in ACTIVE and w.allocated > 0),
                        key=lambda w: -w.allocated)[:MAX_WORKLOADS]
        s = Sample(snap.time, round(snap.gpus_allocated, 4), snap.gpus_total,
                   {p.name: round(p.allocated, 4) for p in snap.projects},
                   {f"{w.project}/{w.name}": round(w.allocated, 4) for w in active})
        self.samples.append(s)
        return s

    def start(self) -> History:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tessera-history", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a backend hiccup must not end the history
                self.sample()
            self._stop.wait(self.interval)

    def document(self, since: float) -> dict[str, Any]:
        """Samples newer than ``since`` (epoch seconds) as columns: one list per series."""
        picked = [s for s in list(self.samples) if s.time >= since]
        projects = sorted({k for s in picked for k in s.projects})
        workloads = sorted({k for s in picked for k in s.workloads})
        return {
            "interval": self.interval,
            "time": [round(s.time, 3) for s in picked],
            "allocated": [s.allocated for s in picked],
            "total": [s.total for s in picked],
            "projects": {p: [s.projects.get(p) for s in picked] for p in projects},
            "workloads": {w: [s.workloads.get(w) for s in picked] for w in workloads},
        }
