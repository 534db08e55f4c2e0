import math

import pytest

from tessera.core.fairshare import Claim, compute_fair_shares, divide
from tessera.core.projects import Project, ProjectTree, Quota

INF = math.inf


def c(name: str, deserved: float, requested: float, *, limit: float = INF, weight: float = 1.0, priority: int = 100) -> Claim:
    return Claim(name, deserved, limit, weight, priority, requested)


def test_deserved_first_then_weights() -> None:
    share = divide(10, [c("a", 2, 10, weight=3), c("b", 2, 10, weight=1)])
    # 4 go as deserved; the other 6 split 3:1.
    assert share["a"] == pytest.approx(2 + 4.5)
    assert share["b"] == pytest.approx(2 + 1.5)


def test_never_above_request_or_limit_and_leftover_flows_on() -> None:
    share = divide(10, [c("a", 1, 2), c("b", 1, 10, limit=4), c("c", 0, 10)])
    assert share["a"] == pytest.approx(2)
    assert share["b"] == pytest.approx(4)
    assert share["c"] == pytest.approx(4)
    assert sum(share.values()) == pytest.approx(10)


def test_higher_priority_tier_gets_idle_first() -> None:
    share = divide(8, [c("hi", 2, 6, priority=200), c("lo", 2, 6, priority=100, weight=100)])
    assert share["hi"] == pytest.approx(6)
    assert share["lo"] == pytest.approx(2)


def test_zero_weight_gets_nothing_over_quota() -> None:
    share = divide(8, [c("a", 1, 8, weight=0), c("b", 1, 8)])
    assert share == pytest.approx({"a": 1, "b": 7})


def test_oversubscribed_deserved_scales_down() -> None:
    share = divide(3, [c("a", 2, 2), c("b", 4, 4)])
    assert share["a"] == pytest.approx(1)
    assert share["b"] == pytest.approx(2)


def test_unlimited_deserved_takes_what_it_asks() -> None:
    share = divide(8, [c("a", INF, 5), c("b", 3, 8)])
    assert share["a"] == pytest.approx(5)
    assert share["b"] == pytest.approx(3)


def test_fractional_shares() -> None:
    share = divide(1, [c("a", 0, 1), c("b", 0, 1), c("c", 0, 1)])
    assert share["a"] == pytest.approx(1 / 3)


def test_recursive_down_the_tree() -> None:
    tree = ProjectTree(
        [
            Project("dept-1", Quota(4)),
            Project("dept-2", Quota(4)),
            Project("p1", Quota(1), parent="dept-1"),
            Project("p2", Quota(1, over_quota_weight=3), parent="dept-1"),
            Project("p3", Quota(0), parent="dept-2"),
        ]
    )
    shares = compute_fair_shares(tree, (8.0, 0.0, 0.0), {"p1": (8, 0, 0), "p2": (8, 0, 0), "p3": (1, 0, 0)})
    # dept-2 asks only 1, so dept-1 gets the other 7; inside it 1 + 1 deserved, then 5 split 1:3.
    assert shares.gpu("dept-2") == pytest.approx(1)
    assert shares.gpu("dept-1") == pytest.approx(7)
    assert shares.gpu("p1") == pytest.approx(1 + 1.25)
    assert shares.gpu("p2") == pytest.approx(1 + 3.75)
    assert shares.gpu("p3") == pytest.approx(1)
    assert shares.requested["dept-1"][0] == pytest.approx(16)


def test_cpu_governed_only_where_given() -> None:
    tree = ProjectTree([Project("a", Quota(1), cpu=Quota(4000, limit=8000)), Project("b", Quota(1))])
    shares = compute_fair_shares(tree, (2.0, 16000.0, 0.0), {"a": (1, 16000, 0), "b": (1, 16000, 0)})
    # b has no CPU quota: it is guaranteed what it asks, a gets the rest within its limit.
    assert shares.share["b"][1] == pytest.approx(16000 * 16000 / 20000)
    assert shares.share["a"][1] == pytest.approx(4000 * 16000 / 20000)
    assert math.isinf(shares.share["a"][2])
