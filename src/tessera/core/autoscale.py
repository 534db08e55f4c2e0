"""The scaling rule of an inference that scales, shared by both backends (pure: no I/O).

``tessera inference submit --min-replicas A --max-replicas B --metric concurrency|throughput
--metric-threshold T [--scale-down-delay D]``: the replicas wanted are ``ceil(metric / T)``
kept within ``[A, B]``. More are started at once; fewer only once the lower need has held for
``D`` seconds (as Knative's and Run:ai's autoscalers do), so an idle service goes back to ``A``.
Embedded mode (tessera.local.inference) measures the metric at its local proxy; Kubernetes
(tessera.kube.autoscaling) at each replica's tessera proxy. Both call :func:`decide`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

CONCURRENCY_WINDOW = 2.0
"""concurrency: the most connections open at once over the last 2 s."""
THROUGHPUT_WINDOW = 10.0
"""throughput: connections opened per second over the last 10 s."""
METRICS = ("concurrency", "throughput")


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
        want = math.ceil(metric / self.threshold) if metric > 0 else 0
        return max(self.min_replicas, min(self.max_replicas, want))


@dataclass(frozen=True)
class Decision:
    replicas: int
    """How many replicas there should be now."""
    below_since: float | None
    """Since when a lower need has held (None: it does not), to pass to the next call."""


def decide(rule: ScalingRule, have: int, metric: float, below_since: float | None,
           now: float) -> Decision:
    """The replicas to run now, given ``have`` running and the metric's current value."""
    want = rule.desired(metric)
    if want > have:
        return Decision(want, None)
    if want < have:
        if below_since is None:
            return Decision(have, now)
        if now - below_since >= rule.scale_down_delay:
            return Decision(want, None)
        return Decision(have, below_since)
    return Decision(have, None)


def metric_value(metric: str, now: float, peaks: Iterable[tuple[float, float]],
                 opened: Iterable[float], current: float) -> float:
    """The metric from samples: ``peaks`` (time, connections open) and ``opened`` (times
    connections were opened); ``current``: connections open now."""
    if metric == "throughput":
        return sum(1 for t in opened if t >= now - THROUGHPUT_WINDOW) / THROUGHPUT_WINDOW
    return max([current, *(n for t, n in peaks if t >= now - CONCURRENCY_WINDOW)])
