"""The scaling rule both backends apply to an inference that scales (tessera.core.autoscale)."""

from __future__ import annotations

from tessera.core.autoscale import ScalingRule, decide, metric_value

RULE = ScalingRule(min_replicas=1, max_replicas=4, metric="concurrency", threshold=2,
                   scale_down_delay=5)


def test_desired_is_the_metric_over_the_threshold_within_min_and_max() -> None:
    assert [RULE.desired(m) for m in (0, 1, 2, 2.5, 4, 7, 100)] == [1, 1, 1, 2, 2, 4, 4]


def test_up_at_once_down_only_after_the_delay() -> None:
    d = decide(RULE, 1, 7, None, 100.0)
    assert (d.replicas, d.below_since) == (4, None)
    d = decide(RULE, 4, 0, None, 110.0)  # the need fell: wait
    assert (d.replicas, d.below_since) == (4, 110.0)
    d = decide(RULE, 4, 0, d.below_since, 114.9)
    assert (d.replicas, d.below_since) == (4, 110.0)
    d = decide(RULE, 4, 0, d.below_since, 115.0)
    assert (d.replicas, d.below_since) == (1, None)


def test_a_need_back_up_resets_the_wait() -> None:
    d = decide(RULE, 4, 1, None, 10.0)
    assert d.below_since == 10.0
    d = decide(RULE, 4, 8, d.below_since, 12.0)
    assert (d.replicas, d.below_since) == (4, None)
    d = decide(RULE, 4, 1, d.below_since, 16.0)
    assert (d.replicas, d.below_since) == (4, 16.0)  # the delay counts again from here


def test_metric_windows() -> None:
    peaks = [(0.0, 5.0), (9.0, 3.0)]
    assert metric_value("concurrency", 10.0, peaks, [], 1) == 3.0  # 5 was more than 2 s ago
    assert metric_value("throughput", 11.0, [], [0.5, 1.0, 5.0, 9.5], 0) == 0.3  # 3 in 10 s
