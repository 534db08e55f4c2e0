"""Usage history for time-based fair share: exponentially decayed GPU-seconds per project.

A project's usage at time ``now`` is the GPU-seconds it held over the last ``window`` seconds,
each second weighted by ``2 ** (-(now - t) / half_life)`` (a GPU-second an hour ago counts half
when the half-life is an hour). For a stretch of ``g`` GPUs held from ``a`` to ``b`` (clipped to
``[now - window, now]``) that is, in closed form::

    U = g * h / ln 2 * (2 ** (-(now - b) / h) - 2 ** (-(now - a) / h))

Fair share (``tessera.core.fairshare``) then shifts the over-quota division between siblings
towards those that used less than their weight's share (KAI's time-based fair share)::

    w'_q = max(0, n_q + k * (n_q - u_q))

where ``n_q`` is the sibling's over-quota weight ÷ the sum of the competing siblings' weights,
``u_q`` its decayed usage ÷ the sum of theirs, and ``k`` (``UsagePolicy.k``) how strongly history
counts (0: not at all). With no history ``u_q = n_q`` and this is plain fair share. Deserved
quota is never changed by history: only what is divided above it.

Settings are per cluster (``CycleConfig.usage``) with a per-department (or project) override
(``Project.usage_window`` / ``Project.usage_half_life``, inherited down the tree).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.core.errors import InvalidRequest

YEAR = 365 * 24 * 3600.0
"""The longest window or half-life accepted: a longer one is a typo, not a policy."""


def check_seconds(field: str, value: object) -> float:
    """A window or half-life: more than 0 and at most a year of seconds, else refused naming
    ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidRequest(field, "must be a number of seconds", value)
    if value <= 0:
        raise InvalidRequest(field, "must be more than 0 seconds", value)
    if value > YEAR:
        raise InvalidRequest(field, f"must be at most one year ({YEAR:.0f} seconds)", value)
    return float(value)


@dataclass(frozen=True, slots=True)
class UsagePolicy:
    """Cluster-wide settings: ``window`` and ``half_life`` in seconds, ``k`` the weight of history."""

    window: float = 7 * 24 * 3600.0
    half_life: float = 24 * 3600.0
    k: float = 1.0

    def validate(self, field: str = "usage") -> None:
        check_seconds(f"{field}.window", self.window)
        check_seconds(f"{field}.half_life", self.half_life)
        k = self.k
        if isinstance(k, bool) or not isinstance(k, int | float) or math.isnan(k) or k < 0 or k > 100:
            raise InvalidRequest(f"{field}.k", "must be a number from 0 to 100", k)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """``gpus`` GPUs held by a workload of ``project`` from ``start`` to ``end`` (seconds on the
    snapshot's clock). Running workloads need no record: the cycle counts them from
    ``started_at`` to now."""

    project: str
    start: float
    end: float
    gpus: float


def decayed(gpus: float, start: float, end: float, now: float, window: float, half_life: float) -> float:
    """Decayed GPU-seconds of ``gpus`` held over ``[start, end]`` as seen at ``now``."""
    a, b = max(start, now - window), min(end, now)
    if b <= a or gpus == 0:  # negative: a correction (tessera.core.usage_history)
        return 0.0
    rate = math.log(2) / half_life
    return gpus / rate * (math.exp(-rate * (now - b)) - math.exp(-rate * (now - a)))


def decayed_usage(
    records: Iterable[UsageRecord],
    now: float,
    settings: Mapping[str, tuple[float, float]],
) -> dict[str, float]:
    """Per leaf project, its decayed GPU-seconds; ``settings`` gives each project's
    (window, half-life). Records of projects not in ``settings`` are ignored."""
    usage: dict[str, float] = {}
    for r in records:
        found = settings.get(r.project)
        if found is None:
            continue
        usage[r.project] = usage.get(r.project, 0.0) + decayed(r.gpus, r.start, r.end, now, *found)
    return {name: max(0.0, u) for name, u in usage.items()}


def adjusted_weights(weights: Mapping[str, float], usage: Mapping[str, float], k: float) -> dict[str, float]:
    """``w'_q = max(0, n_q + k (n_q - u_q))`` over the given siblings (see the module text)."""
    total_w = sum(weights.values())
    total_u = sum(usage.get(name, 0.0) for name in weights)
    if total_w <= 0 or total_u <= 0 or k == 0:
        return dict(weights)
    out = {}
    for name, w in weights.items():
        n = w / total_w
        u = usage.get(name, 0.0) / total_u
        out[name] = max(0.0, n + k * (n - u))
    return out
