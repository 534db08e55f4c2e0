"""The usage history as a compact record that survives a restart (time-based fair share,
``tessera.core.usage``; kept by ``tessera.core.usage_history.UsageHistory``).

**Compaction.** A project's finished stretches are summed into time buckets of ``B`` seconds:
per bucket its GPU-seconds ``m0`` and their first moment ``m1`` (GPU-seconds × time), so the
bucket stands for ``m0`` GPU-seconds held at their mean time ``m1 / m0``. Against the exact
formula the decay inside a bucket is replaced by its value at the mean: for ``B ≤ half-life / 8``
the relative error of a bucket is at most ``(B · ln 2 / half-life)² / 8`` ≤ 0.1 % (Jensen: the
spread of times around their mean is at most ``B / 2``). At the window's cut-off a bucket counts
whole while its mean is inside the window, so at most one bucket (``B ≤ window / 32``) is cut off
at its mean instead of exactly. ``B`` is a power of two seconds, so coarser buckets merge finer
ones exactly (moments add). Usage older than 64 half-lives (weight below ``2^-64``) is dropped,
so a project never has more than about 1,024 buckets (74 with the default 7 days / 1 day).

**Record** (JSON, :func:`export`): ``{"format": 1, "savedAt": t, "usage": {project: [start,
end, gpus, ...]}, "running": [[workload id, project, since, gpus], ...]}``: the compacted
records and the workloads running when it was written. :func:`restore` refuses anything else
with a reason (the adapters log it and start empty)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tessera.core.usage import UsageRecord

FORMAT = 1
HALF_LIVES_KEPT = 64
Running = dict[str, tuple[str, float, float]]
"""Workload id -> (project, since, GPUs)."""


def bucket_seconds(window: float, half_life: float, coarser: int = 0) -> float:
    """The largest power of two seconds ≤ min(half-life / 8, window / 32) (at least 1), times
    ``2 ** coarser`` (a record too big for its store is written coarser)."""
    target = max(1.0, min(half_life / 8, window / 32))
    return 2.0 ** (math.floor(math.log2(target)) + coarser)


def compact(records: Iterable[UsageRecord], now: float,
            settings: Mapping[str, tuple[float, float]], default: tuple[float, float],
            coarser: int = 0) -> list[UsageRecord]:
    """``records`` summed into buckets (module text), one short record per bucket centred on
    its mean; ``settings`` gives a project's (window, half-life), else ``default``. Idempotent:
    compacting the result again gives it back."""
    moments: dict[tuple[str, int], list[float]] = {}
    sizes: dict[str, float] = {}
    for r in records:
        window, half = settings.get(r.project, default)
        size = sizes.setdefault(r.project, bucket_seconds(window, half, coarser))
        oldest = now - min(window, HALF_LIVES_KEPT * half)
        a, b = max(r.start, oldest), min(r.end, now)
        i = math.floor(a / size)
        while a < b:
            end = min(b, (i + 1) * size)
            gs = r.gpus * (end - a)
            m = moments.setdefault((r.project, i), [0.0, 0.0])
            m[0] += gs
            m[1] += gs * (a + end) / 2
            a, i = end, i + 1
    out = []
    for (project, i), (m0, m1) in sorted(moments.items()):
        if abs(m0) < 1e-9:
            continue
        size = sizes[project]
        eps = size / 64
        lo, hi = i * size + eps, min((i + 1) * size, now) - eps
        mean = min(max(m1 / m0, lo), hi) if hi > lo else (lo + hi) / 2
        out.append(UsageRecord(project, mean - eps, mean + eps, m0 / (2 * eps)))
    return out


def export(records: Iterable[UsageRecord], running: Running, now: float) -> dict[str, Any]:
    usage: dict[str, list[float]] = {}
    for r in records:
        usage.setdefault(r.project, []).extend((r.start, r.end, r.gpus))
    return {"format": FORMAT, "savedAt": now, "usage": usage,
            "running": [[wid, p, since, gpus] for wid, (p, since, gpus) in sorted(running.items())]}


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number: {value!r}")
    return float(value)


def restore(data: object, now: float) -> tuple[list[UsageRecord], Running, float]:
    """The records, running workloads and save time of a record :func:`export` wrote;
    ``ValueError`` saying what is wrong with anything else (a newer or older format, a field of
    the wrong type, a save time in the future)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}, this release reads format {FORMAT}")
    saved = _number(data.get("savedAt"), "savedAt")
    if saved > now + 300:
        raise ValueError(f"savedAt {saved:.0f} is in the future (now {now:.0f})")
    usage, running = data.get("usage"), data.get("running")
    if not isinstance(usage, dict) or not isinstance(running, list):
        raise ValueError("usage must be an object and running a list")
    records = []
    for project, flat in usage.items():
        if not isinstance(flat, list) or len(flat) % 3:
            raise ValueError(f"usage of {project!r} is not a list of start, end, GPUs triples")
        for k in range(0, len(flat), 3):
            start, end, gpus = (_number(v, f"usage of {project!r}") for v in flat[k:k + 3])
            if end < start:
                raise ValueError(f"usage of {project!r} ends before it starts")
            records.append(UsageRecord(project, start, end, gpus))
    held: Running = {}
    for row in running:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and isinstance(row[1], str)):
            raise ValueError(f"running entry {row!r} is not [workload id, project, since, GPUs]")
        held[row[0]] = (row[1], _number(row[2], "running since"), _number(row[3], "running GPUs"))
    return records, held, saved
