"""What the API server sees of the cluster at one moment, for the console, ``/metrics`` and the
history it keeps: GPUs, projects (with their fair share), workloads by phase, and — where the
node agents report it (:mod:`tessera.api.usage`) — GPU memory used, loans and utilisation.

One snapshot is read from the backend through the same calls the REST API serves (so both
backends, embedded and Kubernetes, give the same picture) and is cached for ``max_age`` seconds,
so a console refresh, a Prometheus scrape and the sampler share one read.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tessera.api.backend import Backend, WorkloadQuery
from tessera.api.usage import busy
from tessera.api.usage_metrics import GpuUse, gpu_uses
from tessera.core.fairshare import Claim, divide

FIELDS = ("name", "projectName", "type", "phase", "gpus", "createdAt", "startedAt", "pendingSince")
ACTIVE = ("Pending", "Running", "Initializing", "Stopping", "Deleting")
FINISHED = ("Completed", "Failed", "Stopped")
TYPES = ("Training", "Workspace", "Inference")
RECENT = 500
"""Finished workloads read per snapshot (the most recently created): enough to see every one that
started since the last scrape, without reading 10,000 records each time."""


@dataclass(frozen=True)
class ProjectView:
    name: str
    deserved: float
    limit: float | None
    weight: float
    priority: int
    allocated: float
    requested: float
    fair_share: float


@dataclass(frozen=True)
class WorkloadView:
    name: str
    project: str
    type: str
    phase: str
    allocated: float
    requested: float
    created: float | None
    started: float | None
    pending_since: float | None = None
    """When it last became Pending: submitted, requeued or resumed."""


@dataclass(frozen=True)
class Snapshot:
    time: float
    simulated: bool
    gpus_total: float
    gpus_allocated: float
    gpu_memory_total: int
    gpu_memory_allocated: int
    gpu_memory_loaned: int
    projects: tuple[ProjectView, ...]
    workloads: tuple[WorkloadView, ...]
    phases: dict[tuple[str, str], int] = field(default_factory=dict)
    """(type, phase) -> number of workloads."""
    usage_known: bool = False
    """Some node's agent reported usage (else the figures below are absent, not zero)."""
    gpus_busy: float | None = None
    """GPUs' worth of utilisation: the sum of the reporting GPUs' utilisation (0 to 1 each)."""
    gpu_memory_used: int | None = None
    workloads_busy: dict[tuple[str, str], float] = field(default_factory=dict)
    """(project, workload) -> GPUs' worth of its processes' utilisation."""
    workloads_used: dict[tuple[str, str], int] = field(default_factory=dict)
    """(project, workload) -> GPU memory its processes use (bytes)."""
    gpu_uses: tuple[GpuUse, ...] = ()
    """Embedded mode: each GPU with what NVML reported (tessera.api.usage_metrics)."""

    def projects_busy(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (project, _), v in self.workloads_busy.items():
            out[project] = out.get(project, 0.0) + v
        return out

    def projects_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (project, _), v in self.workloads_used.items():
            out[project] = out.get(project, 0) + v
        return out

    def overview(self) -> dict[str, Any]:
        """The console's Overview in one document."""
        return {
            "time": self.time,
            "simulated": self.simulated,
            "gpus": {"total": self.gpus_total, "allocated": round(self.gpus_allocated, 4),
                     "free": round(max(self.gpus_total - self.gpus_allocated, 0.0), 4),
                     "memoryTotalBytes": self.gpu_memory_total,
                     "memoryAllocatedBytes": self.gpu_memory_allocated,
                     "memoryLoanedBytes": self.gpu_memory_loaned,
                     "memoryUsedBytes": self.gpu_memory_used,
                     "busy": None if self.gpus_busy is None else round(self.gpus_busy, 4)},
            "workloadsByPhase": _by_phase(self.phases),
            "projects": [{"name": p.name, "deserved": p.deserved, "limit": p.limit,
                          "overQuotaWeight": p.weight, "priority": p.priority,
                          "allocated": round(p.allocated, 4), "requested": round(p.requested, 4),
                          "fairShare": round(p.fair_share, 4),
                          "state": _state(p)} for p in self.projects],
        }


def _state(p: ProjectView) -> str:
    if p.allocated > p.fair_share + 1e-6:
        return "over"
    if p.allocated + 1e-6 < min(p.fair_share, p.requested):
        return "under"
    return "at"


def _by_phase(phases: dict[tuple[str, str], int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (_, phase), n in phases.items():
        out[phase] += n
    return dict(sorted(out.items()))


def _time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _rows(backend: Backend, query: WorkloadQuery) -> tuple[list[WorkloadView], int]:
    rows_json, total = backend.workloads_json(query)
    out = []
    for name, project, kind, phase, g, created, started, since in json.loads(rows_json):
        g = g or {}
        out.append(WorkloadView(name, project or "", kind, phase, float(g.get("allocated") or 0.0),
                                float(g.get("requested") or 0.0), _time(created), _time(started),
                                _time(since)))
    return out, total


def _workloads(backend: Backend) -> tuple[list[WorkloadView], dict[tuple[str, str], int]]:
    """Every unfinished workload, the most recently created finished ones, and the count of
    workloads by (type, phase) — the finished ones counted without reading them."""
    unfinished = tuple(("phase", "!=", p) for p in FINISHED)
    active, _ = _rows(backend, WorkloadQuery(filters=unfinished, limit=10**9, fields=FIELDS,
                                             rows=True))
    recent, _ = _rows(backend, WorkloadQuery(sort_by="createdAt", descending=True, limit=RECENT,
                                             fields=FIELDS, rows=True))
    phases: Counter[tuple[str, str]] = Counter((w.type, w.phase) for w in active)
    for kind in TYPES:
        for phase in FINISHED:
            _, n = _rows(backend, WorkloadQuery(filters=(("type", "==", kind), ("phase", "==", phase)),
                                                limit=1, fields=FIELDS, rows=True))
            if n:
                phases[(kind, phase)] = n
    seen = {(w.project, w.name, w.created) for w in active}
    workloads = active + [w for w in recent if (w.project, w.name, w.created) not in seen]
    return workloads, dict(phases)


def gpu_count(cluster: dict[str, Any]) -> int:
    """Every GPU of the cluster document: the shared ones (``nodes[].gpus``) and those in MIG
    mode (``nodes[].migGpus``), each counted once by UUID. Allocations include MIG partitions
    (their profile's fraction), so the total must include their GPUs too."""
    seen: set[str] = set()
    count = 0
    for n in cluster.get("nodes", []):
        for g in [*n.get("gpus", []), *(n.get("migGpus") or [])]:
            key = str(g.get("uuid") or f"{n.get('name')}/{g.get('index')}/{len(seen)}")
            if key not in seen:
                seen.add(key)
                count += 1
    return count


def read(backend: Backend) -> Snapshot:
    """One snapshot, read now."""
    cluster = backend.cluster()
    gpus = [g for n in cluster.get("nodes", []) for g in n.get("gpus", [])]
    memory_total = sum(int(g.get("memoryBytes", 0)) for g in gpus)
    memory_allocated = sum(int(g.get("allocatedBytes", 0)) for g in gpus)
    loaned = sum(int(g.get("loanedBytes", 0)) for g in gpus)
    use = busy(cluster)
    workloads, phases = _workloads(backend)
    project_of: dict[str, str] = {}
    for w in workloads:  # a share's project where its document did not say (a name used twice:
        if w.phase in ACTIVE:  # the first active one)
            project_of.setdefault(w.name, w.project)

    def keyed(values: dict[tuple[str, str], Any]) -> dict[tuple[str, str], Any]:
        out: dict[tuple[str, str], Any] = {}
        for (project, name), v in values.items():
            key = (project or project_of.get(name, ""), name)
            out[key] = out.get(key, 0) + v
        return out
    requested: dict[str, float] = {}
    allocated: dict[str, float] = {}
    for w in workloads:
        if w.phase in ACTIVE:
            requested[w.project] = requested.get(w.project, 0.0) + w.requested
            allocated[w.project] = allocated.get(w.project, 0.0) + w.allocated
    docs = backend.projects()
    claims = []
    for p in docs:
        gpu = p["resources"]["gpu"]
        deserved = float(gpu.get("deserved") or 0.0)
        limit = gpu.get("limit")
        claims.append(Claim(p["name"], deserved if deserved >= 0 else math.inf,
                            math.inf if limit is None or limit < 0 else float(limit),
                            float(gpu.get("overQuotaWeight") or 0.0), int(p.get("priority") or 0),
                            requested.get(p["name"], 0.0)))
    total = float(gpu_count(cluster))
    fair = divide(total, claims)
    projects = tuple(
        ProjectView(c.name, c.deserved, None if math.isinf(c.limit) else c.limit, c.weight,
                    c.priority, float(p.get("status", {}).get("allocated", {}).get("gpu")
                                      or allocated.get(c.name, 0.0)),
                    requested.get(c.name, 0.0), fair.get(c.name, 0.0))
        for c, p in zip(claims, docs, strict=True))
    return Snapshot(time=time.time(), simulated=bool(cluster.get("simulated")),
                    gpus_total=total, gpus_allocated=sum(p.allocated for p in projects),
                    gpu_memory_total=memory_total, gpu_memory_allocated=memory_allocated,
                    gpu_memory_loaned=loaned, projects=projects, workloads=tuple(workloads),
                    phases=phases, usage_known=use.known,
                    gpus_busy=use.gpus_busy if use.known else None,
                    gpu_memory_used=use.memory_used if use.known else None,
                    workloads_busy=keyed(use.workloads_busy),
                    workloads_used=keyed(use.workloads_used),
                    gpu_uses=gpu_uses(cluster))


class SnapshotCache:
    """The last snapshot, read again when older than ``max_age`` seconds (thread-safe)."""

    def __init__(self, backend: Backend, max_age: float = 1.0,
                 reader: Callable[[Backend], Snapshot] = read) -> None:
        self.backend = backend
        self.max_age = max_age
        self.reader = reader
        self._lock = threading.Lock()
        self._last: Snapshot | None = None

    def get(self, max_age: float | None = None) -> Snapshot:
        """``max_age``: how old a snapshot this caller takes (a reader that can wait, such as
        the GPU-hours meter, shares the history's instead of reading one of its own)."""
        with self._lock:
            age = self.max_age if max_age is None else max_age
            if self._last is None or time.time() - self._last.time > age:
                self._last = self.reader(self.backend)
            return self._last
