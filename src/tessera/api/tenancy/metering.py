"""GPU-hours *used*: the measured GPU time of each workload, integrated into the ledger
(``gpu_used``, :mod:`tessera.api.tenancy.ledger`) next to what it was allocated.

A daemon thread in the API server (both backends) takes a reading every
``TESSERA_METERING_INTERVAL`` seconds (default 10; the snapshot the console's history took, when
it is no older, so metering adds no reads of the backend) and, for each workload holding GPUs in the
ledger (an open allocation interval), adds the GPU-seconds it used since the previous reading:

- **GPU time charged by the compute arbiter** where the workload runs under one (embedded mode
  with ``--gpu-compute-mode``; ``tessera_workload_gpu_time_seconds_total``): the counter's
  increase, exact; per GPU at most the time elapsed;
- else **NVML utilisation** as the node agents report it (the shared snapshot the console and
  ``/metrics`` read: a share's processes' SM utilisation, a whole GPU's utilisation): GPUs' worth
  busy x the time since the previous reading. NVML's utilisation is the share of the past sample
  period during which a kernel ran, so a workload busy half the time on one GPU uses 0.5 GPU-hour
  per hour.

What is not measured is not invented: while no node reports usage (simulated GPUs, an agent not
answering) nothing is added, and a gap longer than ``3 x interval`` (the server was down)
counts only ``3 x interval``. Only time a workload held an allocation is metered, so used and
allocated reconcile interval by interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tessera.api.periodic import Periodic
from tessera.api.tenancy.ledger import Ledger

log = logging.getLogger("tessera.metering")


def interval_from_env() -> float:
    """``TESSERA_METERING_INTERVAL`` (default 10 s), refused at start when it is not a positive
    number rather than metering nonsense."""
    raw = os.environ.get("TESSERA_METERING_INTERVAL") or "10"
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise SystemExit(f"error: TESSERA_METERING_INTERVAL: must be a number of seconds "
                         f"above 0 and below 86400 (got {raw!r})")
    return value


@dataclass(frozen=True)
class Reading:
    time: float
    known: bool
    """Some node reported usage (else ``busy`` says nothing, not zero)."""
    busy: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(project, workload name) -> GPUs' worth of utilisation now."""
    gpu_seconds: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(GPU, workload id) -> GPU seconds the compute arbiter has charged it (a counter)."""


class Meter(Periodic):
    thread_name = "tessera-metering"

    def __init__(self, ledger: Ledger, read: Callable[[], Reading],
                 interval: float | None = None) -> None:
        super().__init__(interval or interval_from_env())
        self.ledger = ledger
        self.read = read
        self.max_gap = 3 * self.interval
        self._last: Reading | None = None

    def tick(self, reading: Reading | None = None) -> int:
        """One reading into the ledger: the rows written."""
        now = reading or self.read()
        last, self._last = self._last, now
        if last is None or now.time <= last.time:
            return 0
        dt = min(now.time - last.time, self.max_gap)
        counted: dict[str, float] = {}
        for (gpu, wid), total in now.gpu_seconds.items():
            before = last.gpu_seconds.get((gpu, wid))
            if before is None:
                continue  # first seen: its increase starts at the next reading
            delta = total - before if total >= before else total  # a reset counter
            counted[wid] = counted.get(wid, 0.0) + min(max(delta, 0.0), dt)
        rows = []
        for wid, (name, project, user, _gpus) in self.ledger.open_allocations().items():
            if wid in counted:
                seconds = counted[wid]
            elif now.known and last.known:
                seconds = float(now.busy.get((project, name), 0.0)) * dt
            else:
                continue
            rows.append((wid, name, project, user, now.time - dt, now.time, seconds))
        if rows:
            self.ledger.add_used(rows)
        return len(rows)

    def step(self) -> None:
        self.tick()


def reader(snapshot: Callable[[], object],
           counters: list[Callable[[], Mapping[tuple[str, str], float]]]) -> Callable[[], Reading]:
    """A :class:`Reading` from the shared snapshot (``tessera.api.telemetry.Snapshot``: its
    ``time``, ``usage_known`` and ``workloads_busy``) and the backend's GPU-time counters."""
    def read() -> Reading:
        snap = snapshot()
        seconds: dict[tuple[str, str], float] = {}
        for counter in counters:
            with contextlib.suppress(OSError):
                seconds.update(counter())
        return Reading(time=float(getattr(snap, "time", time.time())),
                       known=bool(getattr(snap, "usage_known", False)),
                       busy=dict(getattr(snap, "workloads_busy", {})), gpu_seconds=seconds)
    return read
