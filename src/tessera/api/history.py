"""GPU allocation and utilisation over time, kept by the API server for the console's Metrics
page.

A daemon thread takes a sample every ``interval`` seconds (``TESSERA_HISTORY_INTERVAL``, default
10 s) from the shared snapshot: GPUs allocated in all, per project and per active workload; and,
from the node agents' reports (:mod:`tessera.api.usage`), GPU utilisation in all, per project
and per workload (in GPUs' worth: a workload using 40% of one GPU is 0.4) and GPU memory used
per project. Retention is bounded (``TESSERA_HISTORY_HOURS``, default 6 h; at most 100 workloads
per sample and series, the largest first), so memory stays flat however long the server runs.
For longer history, Prometheus scrapes the same figures from the API server and the agents.

With ``path`` (the server's data directory's ``metrics-history.jsonl``), each sample is also
appended there as one JSON line and read back at start, so a restart keeps the history (samples
older than the retention are dropped; the file is rewritten when it holds twice the retention).
A line that does not parse (a crash mid-write) is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.api.periodic import Periodic
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
    busy: float | None = None
    """GPUs' worth of utilisation in all (None: no node reported usage)."""
    projects_busy: dict[str, float] = field(default_factory=dict)
    workloads_busy: dict[str, float] = field(default_factory=dict)
    """``project/name`` -> GPUs' worth of its processes' utilisation (at most 100, the busiest)."""
    projects_used: dict[str, int] = field(default_factory=dict)
    """project -> GPU memory its workloads' processes use (bytes)."""


def _key(project: str, name: str) -> str:
    """``project/name``, one string object however many samples name it (6 h of samples every
    10 s name the same workloads thousands of times)."""
    return sys.intern(f"{project}/{name}")


class History(Periodic):
    thread_name = "tessera-history"
    failure_level = logging.DEBUG  # the next sample simply comes later; nothing is lost

    def __init__(self, snapshots: SnapshotCache, interval: float | None = None,
                 hours: float | None = None, path: Path | None = None) -> None:
        super().__init__(interval or float(os.environ.get("TESSERA_HISTORY_INTERVAL", "10")))
        self.snapshots = snapshots
        hours = hours or float(os.environ.get("TESSERA_HISTORY_HOURS", "6"))
        self.hours = hours
        self.samples: deque[Sample] = deque(maxlen=max(1, int(hours * 3600 / self.interval)))
        self.path = path
        self._lines = 0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        """The samples a previous run of the server kept, within the retention."""
        since = time.time() - self.hours * 3600
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
            for line in f:
                self._lines += 1
                try:
                    s = Sample(**json.loads(line))
                except (ValueError, TypeError):
                    continue
                if s.time >= since:
                    self.samples.append(s)

    def _keep(self, s: Sample) -> None:
        """Append ``s`` to the file; rewrite it from memory when it has grown to twice the
        retention."""
        assert self.path is not None
        with contextlib.suppress(OSError):
            if self._lines >= 2 * (self.samples.maxlen or 1):
                tmp = self.path.with_suffix(".tmp")
                with open(tmp, "w", encoding="utf-8") as f:
                    for old in self.samples:
                        f.write(json.dumps(dataclasses.asdict(old)) + "\n")
                os.replace(tmp, self.path)
                self._lines = len(self.samples)
                return
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(dataclasses.asdict(s)) + "\n")
            self._lines += 1

    def sample(self) -> Sample:
        snap = self.snapshots.get()
        if self.samples and self.samples[-1].time == snap.time:
            return self.samples[-1]  # the same snapshot (shared, cached up to 1 s): no news
        active = sorted((w for w in snap.workloads if w.phase in ACTIVE and w.allocated > 0),
                        key=lambda w: -w.allocated)[:MAX_WORKLOADS]
        busiest = sorted(snap.workloads_busy.items(), key=lambda kv: -kv[1])[:MAX_WORKLOADS]
        s = Sample(snap.time, round(snap.gpus_allocated, 4), snap.gpus_total,
                   {p.name: round(p.allocated, 4) for p in snap.projects},
                   {_key(w.project, w.name): round(w.allocated, 4) for w in active},
                   None if snap.gpus_busy is None else round(snap.gpus_busy, 4),
                   {sys.intern(p): round(v, 4) for p, v in snap.projects_busy().items()},
                   {_key(p, n): round(v, 4) for (p, n), v in busiest},
                   {sys.intern(p): v for p, v in snap.projects_used().items()})
        self.samples.append(s)
        if self.path is not None:
            self._keep(s)
        return s

    def step(self) -> None:
        self.sample()

    def document(self, since: float) -> dict[str, Any]:
        """Samples newer than ``since`` (epoch seconds) as columns: one list per series."""
        picked = [s for s in list(self.samples) if s.time >= since]
        projects = sorted({k for s in picked for k in s.projects})
        workloads = sorted({k for s in picked for k in s.workloads})
        busy_projects = sorted({k for s in picked for k in s.projects_busy})
        busy_workloads = sorted({k for s in picked for k in s.workloads_busy})
        used_projects = sorted({k for s in picked for k in s.projects_used})
        return {
            "retentionHours": self.hours,
            "interval": self.interval,
            "time": [round(s.time, 3) for s in picked],
            "allocated": [s.allocated for s in picked],
            "total": [s.total for s in picked],
            "projects": {p: [s.projects.get(p) for s in picked] for p in projects},
            "workloads": {w: [s.workloads.get(w) for s in picked] for w in workloads},
            "utilization": {
                "all": [s.busy for s in picked],
                "projects": {p: [s.projects_busy.get(p) for s in picked] for p in busy_projects},
                "workloads": {w: [s.workloads_busy.get(w) for s in picked]
                              for w in busy_workloads},
            },
            "memoryUsed": {
                "projects": {p: [s.projects_used.get(p) for s in picked] for p in used_projects},
            },
        }
