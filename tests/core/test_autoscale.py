"""The scaling rule both backends apply to an inference that scales (tessera.core.autoscale)."""

from __future__ import annotations

from tessera.core.autoscale import ScalingRule, decide, prune, rate, total

RULE = ScalingRule(min_replicas=1, max_replicas=4, metric="concurrency", threshold=2,
                   scale_down_delay=5)


def test_desired_is_the_metric_over_the_threshold_within_min_and_max() -> None:
    assert [RULE.desired(m) for m in (0, 1, 2, 2.5, 4, 7, 100)] == [1, 1, 1, 2, 2, 4, 4]


def test_total_sums_the_replicas_open_connections() -> None:
    a = [(1.0, 1), (3.0, 2), (5.0, 0)]
    b = [(2.0, 3), (3.0, 0)]
    assert total([a, b]) == [(1.0, 1), (2.0, 4), (3.0, 2), (5.0, 0)]


def test_up_at_once_and_down_exactly_the_delay_after_the_last_connection_closed() -> None:
    steps = [(100.0, 7), (103.25, 0)]  # 7 open from 100; the last closed at 103.25
    d = decide(RULE, 1, steps, 100.5)
    assert (d.replicas, d.due) == (4, None)
    d = decide(RULE, 4, steps[:1], 103.0)  # still open
    assert (d.replicas, d.lower_since, d.due) == (4, None, None)
    # Seen late (the scaler looked at 104.9): the cool-down still runs from 103.25.
    d = decide(RULE, 4, steps, 104.9)
    assert (d.replicas, d.lower_since, d.due) == (4, 103.25, 108.25)
    assert decide(RULE, 4, steps, 108.2).replicas == 4
    assert decide(RULE, 4, steps, 108.25).replicas == 1


def test_down_step_by_step_to_the_highest_need_of_the_delay() -> None:
    steps = [(0.0, 8), (10.0, 5), (20.0, 0)]  # need 4, then 3, then 1
    assert decide(RULE, 4, steps, 14.9).replicas == 4
    d = decide(RULE, 4, steps, 15.0)
    assert (d.replicas, d.lower_since) == (3, 10.0)
    d = decide(RULE, 3, steps, 24.0)
    assert (d.replicas, d.due) == (3, 25.0)
    assert decide(RULE, 3, steps, 25.0).replicas == 1


def test_a_lull_shorter_than_the_delay_changes_nothing() -> None:
    steps = [(0.0, 8), (10.0, 0), (14.0, 8)]  # 4 s of nothing, then the load is back
    for now in (11.0, 13.9, 14.5, 16.0, 30.0):
        assert decide(RULE, 4, steps, now).replicas == 4, now
    d = decide(RULE, 4, [*steps, (30.0, 1)], 34.9)
    assert (d.replicas, d.lower_since) == (4, 30.0)  # counted from the second end only


def test_a_burst_between_two_looks_scales_up_within_the_window() -> None:
    steps = [(10.0, 6), (10.3, 0)]  # 0.3 s of 6 connections, never seen by a look at once
    assert decide(RULE, 1, steps, 11.0).replicas == 3
    assert decide(RULE, 1, steps, 12.5).replicas == 1  # seen too late to matter: no scale up


def test_known_since_holds_the_replicas_until_the_delay_has_passed_since_then() -> None:
    assert decide(RULE, 3, [], 104.0, known_since=100.0).replicas == 3
    d = decide(RULE, 3, [], 105.0, known_since=100.0)
    assert (d.replicas, d.lower_since) == (1, 100.0)


def test_throughput_cools_down_from_when_the_rate_fell() -> None:
    rule = ScalingRule(1, 4, "throughput", 0.5, 3)
    opened = [float(t) for t in range(10)] + [9.5]  # 11 connections over 10 s: 1.1/s -> 3
    steps = rate(opened)
    assert decide(rule, 1, steps, 9.6).replicas == 3
    d = decide(rule, 3, steps, 11.0)  # the opening at 0 left the window at 10: 1.0/s -> 2
    assert (d.replicas, d.lower_since, d.due) == (3, 10.0, 13.0)
    assert decide(rule, 3, steps, 13.0).replicas == 2
    # One replica is enough from 0.5/s: once the opening at 5 left the window, at 15.
    d = decide(rule, 2, steps, 13.0)
    assert (d.lower_since, d.due) == (15.0, 18.0)


def test_prune_keeps_the_value_at_the_cut() -> None:
    steps = [(1.0, 3), (2.0, 1), (5.0, 0)]
    assert prune(steps, 3.0) == [(2.0, 1), (5.0, 0)]
    assert prune(steps, 0.5) == steps
