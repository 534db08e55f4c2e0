"""The scaling rule of an inference that scales, shared by both backends (pure: no I/O).

``tessera inference submit --min-replicas A --max-replicas B --metric concurrency|throughput
--metric-threshold T [--scale-down-delay D]``. The rule works on the service's activity as the
proxies recorded it, with the times the connections really opened and closed (not the times
the scaler happened to look):

* ``c(t)``: connections open through the service's proxies at time ``t``;
* the metric ``m(t)``: ``c(t)`` for ``concurrency``; for ``throughput`` the connections opened
  in the 10 s up to ``t``, per second;
* the need ``need(t) = ceil(m(t) / T)`` kept within ``[A, B]``.

Up: at once, to the highest need of the last 2 s (``CONCURRENCY_WINDOW``: a burst between two
looks still counts). Down: to ``k`` replicas once ``need(t) <= k`` has held for ``D`` seconds,
counted from the moment the need fell — for concurrency, the moment the connection closed that
brought ``c`` to ``k * T`` or below (going back to ``A`` when idle: the moment the last connection
closed). The decision is due at that moment + ``D``; :attr:`Decision.due` says when, so a
scaler can look again exactly then. A lull shorter than ``D`` changes nothing. Embedded mode
(tessera.local.inference) records the activity at its local proxy; Kubernetes
(tessera.kube.autoscaling) at each replica's tessera proxy. Both call :func:`decide`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CONCURRENCY_WINDOW = 2.0
"""Scaling up: the highest need of the last 2 s."""
THROUGHPUT_WINDOW = 10.0
"""throughput: connections opened per second over the last 10 s."""
METRICS = ("concurrency", "throughput")

Steps = Sequence[tuple[float, float]]
"""A step function: ``(time, value from that time on)``, sorted by time; 0 before the first."""


@dataclass(frozen=True)
class ScalingRule:
    min_replicas: int
    max_replicas: int
    metric: str
    threshold: float
    scale_down_delay: float

    @classmethod
    def from_spec(cls, auto: dict[str, object], default_delay: float = 30.0) -> ScalingRule:
        """From REST ``spec.autoscaling`` (already validated by the API's model)."""
        delay = auto.get("scaleDownDelaySeconds")
        return cls(int(str(auto.get("minReplicas", 1))), int(str(auto.get("maxReplicas", 1))),
                   str(auto.get("metric", "concurrency")),
                   float(str(auto.get("metricThreshold", 1))),
                   default_delay if delay is None else float(str(delay)))

    def desired(self, metric: float) -> int:
        want = math.ceil(metric / self.threshold - 1e-9) if metric > 0 else 0
        return max(self.min_replicas, min(self.max_replicas, want))


@dataclass(frozen=True)
class Decision:
    replicas: int
    """How many replicas there should be now."""
    lower_since: float | None
    """When the need fell below the replicas there are (None: it has not): the cool-down runs
    from here."""
    due: float | None
    """When the scale-down is due if nothing new happens (``lower_since`` + the delay); None
    when no scale-down is coming."""


def total(series: Iterable[Steps]) -> list[tuple[float, float]]:
    """The sum of step functions (each replica's open connections -> the service's)."""
    deltas: list[tuple[float, float]] = []
    for steps in series:
        last = 0.0
        for t, v in steps:
            if v != last:
                deltas.append((t, v - last))
                last = v
    out: list[tuple[float, float]] = []
    value = 0.0
    for t, d in sorted(deltas):
        value += d
        if out and out[-1][0] == t:
            out[-1] = (t, value)
        else:
            out.append((t, value))
    return out


def rate(opened: Iterable[float]) -> list[tuple[float, float]]:
    """Connections opened per second over the last ``THROUGHPUT_WINDOW`` seconds, as a step
    function of time (each opening counts from its time until the window has passed it)."""
    w = THROUGHPUT_WINDOW
    return total([[(t, 1 / w), (t + w, 0.0)] for t in opened])


def _at(steps: Steps, t: float) -> float:
    value = 0.0
    for s, v in steps:
        if s > t:
            break
        value = v
    return value


def _highest(rule: ScalingRule, steps: Steps, start: float, end: float) -> int:
    """The highest need over ``[start, end]``."""
    top = _at(steps, start)
    for s, v in steps:
        if start < s <= end:
            top = max(top, v)
    return rule.desired(top)


def decide(rule: ScalingRule, have: int, steps: Steps, now: float,
           known_since: float | None = None) -> Decision:
    """The replicas to run at ``now`` given ``have`` running and the metric ``steps`` (the
    metric as a step function of time: :func:`total` of the replicas' open connections for
    concurrency, :func:`rate` of the openings for throughput). ``known_since``: the activity is
    known only from then on (the scaler started, or lost track): no scale-down until the delay
    has passed since then too."""
    up = _highest(rule, steps, now - CONCURRENCY_WINDOW, now)
    if up > have:
        return Decision(up, None, None)
    # When did the need last reach `have`? It fell at the end of that stretch.
    fell = known_since
    reached = rule.desired(_at(steps, float("-inf"))) >= have
    for s, v in steps:  # a throughput's rate falls later by itself: those times count too
        high = rule.desired(v) >= have
        if reached and not high:
            fell = s if fell is None else max(fell, s)
        reached = high
    if reached:
        return Decision(have, None, None)  # the need is as high as the replicas there are
    if fell is None:
        fell = float("-inf")
    due = fell + rule.scale_down_delay
    if now < due:
        return Decision(have, fell, due)
    down = _highest(rule, steps, now - rule.scale_down_delay, now)
    if down < have:
        return Decision(down, fell, None)
    return Decision(have, fell, due)


def prune(steps: list[tuple[float, float]], before: float) -> list[tuple[float, float]]:
    """``steps`` without what only matters before ``before`` (the value at ``before`` kept)."""
    i = 0
    while i + 1 < len(steps) and steps[i + 1][0] <= before:
        i += 1
    return steps[i:]
