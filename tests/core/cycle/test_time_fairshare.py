"""Time-based fair share: decayed usage history shifts the over-quota division (core.usage)."""

from __future__ import annotations

import math

import pytest

from tessera.core.cycle import (
    CycleConfig,
    Project,
    ProjectTree,
    Quota,
    Snapshot,
    Workload,
    run_cycle,
)
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest, ResourceRequest
from tessera.core.usage import YEAR, UsagePolicy, UsageRecord, decayed

from .scenario import nodes

HOUR = 3600.0
ONE_GPU = ResourceRequest(GpuRequest.whole(1), 1000, 1 << 30)


def test_decay_closed_form_matches_the_integral() -> None:
    h, now = 2 * HOUR, 10 * HOUR
    exact = decayed(3.0, 4 * HOUR, 9 * HOUR, now, window=24 * HOUR, half_life=h)
    steps = 20_000
    dt = 5 * HOUR / steps
    numeric = sum(3.0 * 2 ** (-(now - (4 * HOUR + (i + 0.5) * dt)) / h) * dt for i in range(steps))
    assert exact == pytest.approx(numeric, rel=1e-6)
    # A GPU-second one half-life ago counts half of one now.
    recent = decayed(1.0, now - 1, now, now, 24 * HOUR, h)
    older = decayed(1.0, now - h - 1, now - h, now, 24 * HOUR, h)
    assert older == pytest.approx(recent / 2, rel=1e-4)
    # Nothing before the window counts.
    assert decayed(1.0, 0.0, 5 * HOUR, now, window=5 * HOUR, half_life=h) == 0.0


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (UsagePolicy(window=0), "config.usage.window"),
        (UsagePolicy(window=-5), "config.usage.window"),
        (UsagePolicy(half_life=YEAR + 1), "config.usage.half_life"),
        (UsagePolicy(window=float("nan")), "config.usage.window"),
        (UsagePolicy(k=-1), "config.usage.k"),
    ],
)
def test_bad_cluster_settings_are_refused_naming_the_field(policy: UsagePolicy, field: str) -> None:
    snap = Snapshot(tuple(nodes(1, 2)), (Project("a", Quota(1)),), (), 0.0)
    with pytest.raises(InvalidRequest) as err:
        run_cycle(snap, CycleConfig(usage=policy))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"usage_half_life": 0}, "projects.d.usage_half_life"),
        ({"usage_window": 2 * YEAR}, "projects.d.usage_window"),
        ({"usage_window": "1d"}, "projects.d.usage_window"),
    ],
)
def test_bad_department_override_is_refused_naming_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        ProjectTree([Project("d", Quota(4), **kw)])  # type: ignore[arg-type]
    assert err.value.field == field


def _tree() -> tuple[Project, ...]:
    return (
        Project("d", Quota(8)),
        Project("a", Quota(1), parent="d"),
        Project("b", Quota(1), parent="d"),
    )


def test_status_says_how_much_of_the_share_comes_from_history() -> None:
    pending = tuple(
        Workload(f"{p}-{i}", p, (ONE_GPU,), created_at=0.0) for p in ("a", "b") for i in range(8)
    )
    history = (UsageRecord("a", 0.0, 2 * HOUR, 8.0),)
    snap = Snapshot(tuple(nodes(1, 8)), _tree(), pending, 2 * HOUR, usage=history)
    plain = run_cycle(snap, CycleConfig()).projects
    timed = run_cycle(snap, CycleConfig(usage=UsagePolicy(window=HOUR * 24, half_life=HOUR * 24))).projects
    assert plain["a"].fair_share[0] == pytest.approx(4) and plain["b"].from_usage == 0.0
    # b used nothing, a used the whole cluster: b gets more than half, a less.
    assert timed["b"].fair_share[0] > 5 and timed["a"].fair_share[0] < 3
    assert timed["b"].from_usage == pytest.approx(timed["b"].fair_share[0] - 4)
    assert timed["a"].from_usage == pytest.approx(timed["a"].fair_share[0] - 4)
    assert timed["a"].usage == pytest.approx(decayed(8.0, 0.0, 2 * HOUR, 2 * HOUR, 24 * HOUR, 24 * HOUR))
    assert timed["d"].fair_share[0] == pytest.approx(8)


def test_department_override_changes_the_history_that_counts() -> None:
    pending = tuple(
        Workload(f"{p}-{i}", p, (ONE_GPU,), created_at=0.0) for p in ("a", "b") for i in range(8)
    )
    history = (UsageRecord("a", 0.0, 2 * HOUR, 8.0),)
    tree = (Project("d", Quota(8), usage_window=HOUR), *_tree()[1:])
    snap = Snapshot(tuple(nodes(1, 8)), tree, pending, 4 * HOUR, usage=history)
    status = run_cycle(snap, CycleConfig(usage=UsagePolicy())).projects
    # The department only looks back an hour: a's use ended two hours ago and no longer counts.
    assert status["a"].usage == 0.0
    assert status["a"].fair_share[0] == pytest.approx(4)


def _simulate(policy: UsagePolicy | None, hours: float = 24, arrive: float = 2, job: float = 1800.0,
              step: float = 120.0) -> dict[str, float]:
    """An 8-GPU node; project a always has 1-GPU jobs waiting, project b's start arriving after
    ``arrive`` hours (and then it always has some waiting). Jobs run ``job`` seconds; an evicted
    job is queued again. Every ``step`` seconds one cycle runs and its plan is applied. Returns
    GPU-hours per project."""
    node = tuple(nodes(1, 8))
    running: dict[str, tuple[Workload, float]] = {}
    records: list[UsageRecord] = []
    served = {"a": 0.0, "b": 0.0}
    counter = 0
    now = 0.0
    while now < hours * HOUR:
        pending = []
        for p in ("a", "b"):
            if p == "b" and now < arrive * HOUR:
                continue
            for _ in range(10):  # always more waiting than the node could hold
                counter += 1
                pending.append(Workload(f"{p}-{counter}", p, (ONE_GPU,), created_at=now))
        snap = Snapshot(node, _tree(), tuple(w for w, _ in running.values()) + tuple(pending), now,
                        usage=tuple(records))
        plan = run_cycle(snap, CycleConfig(usage=policy))
        for e in plan.evictions:
            w, _ = running.pop(e.workload_id)
            assert w.started_at is not None
            records.append(UsageRecord(w.project, w.started_at, now, 1.0))
        by_id = {w.id: w for w in pending}
        for b in plan.bindings:
            w = by_id[b.workload_id]
            placed = Workload(w.id, w.project, w.pods, created_at=w.created_at, started_at=now,
                              placements=(b.pods[0].placement,))
            running[w.id] = (placed, now + job)
        now += step
        for wid, (w, end) in list(running.items()):
            served[w.project] += step / HOUR
            if end <= now:
                del running[wid]
                assert w.started_at is not None
                records.append(UsageRecord(w.project, w.started_at, end, 1.0))
        records = [r for r in records if r.end > now - 24 * HOUR]
    return served


def test_starved_project_catches_up_to_its_deserved_ratio() -> None:
    """b was absent (a borrowed everything) for the first 2 of 24 hours. Plain fair share splits the node
    evenly from then on, so b ends 15% behind a; with usage history b gets more until the
    GPU-hours are even: within 5% of the deserved 1:1 ratio."""
    plain = _simulate(None)
    timed = _simulate(UsagePolicy(window=24 * HOUR, half_life=24 * HOUR, k=2.0))
    assert plain["a"] + plain["b"] == pytest.approx(8 * 24, rel=0.02)  # the node never idles
    assert timed["a"] + timed["b"] == pytest.approx(8 * 24, rel=0.02)
    assert plain["b"] / plain["a"] < 0.9, plain  # 88 : 104 GPU-hours
    assert math.isclose(timed["b"] / timed["a"], 1.0, rel_tol=0.05), timed
