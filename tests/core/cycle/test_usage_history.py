"""The adapters' usage history (core.usage_history): settings as written, refusals naming the flag,
the tracker's records, and the long-run simulation driven only by what the tracker saw."""

from __future__ import annotations

import math

import pytest

from tessera.core.cycle import CycleConfig, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest, ResourceRequest
from tessera.core.state import Placement
from tessera.core.usage import UsagePolicy, UsageRecord, decayed, decayed_usage
from tessera.core.usage_history import (
    UsageHistory,
    duration,
    parse_override,
    parse_policy,
    with_overrides,
)

from .scenario import nodes

HOUR = 3600.0
ONE_GPU = ResourceRequest(GpuRequest.whole(1), 1000, 1 << 30)
FLAG = "--fair-share-history"


def test_settings_as_written() -> None:
    assert parse_policy(FLAG, None) is None and parse_policy(FLAG, "off") is None
    assert parse_policy(FLAG, "window=7d,half-life=6h,k=2") == UsagePolicy(7 * 86400, 6 * 3600, 2.0)
    assert parse_policy(FLAG, "half-life=90m") == UsagePolicy(half_life=5400)
    assert duration("x", "2w") == 14 * 86400 and duration("x", "30") == 30
    assert parse_override("--fair-share-history-for", "research:half-life=1h") == ("research", (None, 3600))


@pytest.mark.parametrize(("text", "field", "rule"), [
    ("window=0", "--fair-share-history window", "more than 0"),
    ("window=-1d", "--fair-share-history window", "more than 0"),
    ("half-life=400d", "--fair-share-history half-life", "at most one year"),
    ("half-life=soon", "--fair-share-history half-life", "must be a duration"),
    ("k=200", "--fair-share-history.k", "0 to 100"),
    ("speed=3", "--fair-share-history", "window, half-life, k and save-every"),
])
def test_bad_settings_are_refused_naming_the_flag_and_rule(text: str, field: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_policy(FLAG, text)
    assert err.value.field == field and rule in str(err.value)


@pytest.mark.parametrize(("text", "field"), [
    ("research:window=0", "--fair-share-history-for research window"),
    ("research:half-life=2y", "--fair-share-history-for research half-life"),
    ("window=1d", "--fair-share-history-for"),
    ("research:k=2", "--fair-share-history-for research"),
])
def test_bad_department_override_is_refused_naming_the_flag(text: str, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_override("--fair-share-history-for", text)
    assert err.value.field == field


def test_a_projects_own_setting_wins_over_the_override() -> None:
    projects = (Project("d", Quota(4), usage_window=60.0), Project("e", Quota(4)))
    out = with_overrides(projects, {"d": (7200.0, 3600.0), "e": (None, 600.0)})
    assert (out[0].usage_window, out[0].usage_half_life) == (60.0, 3600.0)
    assert (out[1].usage_window, out[1].usage_half_life) == (None, 600.0)


def _running(wid: str, project: str, started: float, gpus: int) -> Workload:
    return Workload(wid, project, (ONE_GPU,) * gpus, started_at=started,
                    placements=tuple(Placement("n0", (i,), exclusive=True) for i in range(gpus)))


def test_tracker_records_stops_and_resizes_so_the_sum_is_what_was_held() -> None:
    node = tuple(nodes(1, 8))
    h = UsageHistory(UsagePolicy(window=10 * HOUR, half_life=HOUR))
    h.observe([_running("w", "a", 0.0, 4)], node, 0.0)
    h.observe([_running("w", "a", 0.0, 2)], node, HOUR)  # shrunk to 2 after an hour
    h.observe([_running("w", "a", 0.0, 2)], node, 1.5 * HOUR)
    h.observe([], node, 2 * HOUR)  # gone after two
    got = decayed_usage(h.records, 3 * HOUR, {"a": (10 * HOUR, HOUR)})["a"]
    want = decayed(4, 0, HOUR, 3 * HOUR, 10 * HOUR, HOUR) + decayed(2, HOUR, 2 * HOUR, 3 * HOUR, 10 * HOUR, HOUR)
    assert got == pytest.approx(want)
    # While it still runs, the cycle's own count (from started_at, GPUs now) plus the records
    # is the truth too.
    h2 = UsageHistory(UsagePolicy(window=10 * HOUR, half_life=HOUR))
    h2.observe([_running("w", "a", 0.0, 2)], node, 0.0)
    h2.observe([_running("w", "a", 0.0, 6)], node, HOUR)  # grew to 6
    now = 2 * HOUR
    # (as core.cycle.history does: the running workload's own record, then the sum)
    counted = decayed_usage([*h2.records, UsageRecord("a", 0.0, now, 6)], now, {"a": (10 * HOUR, HOUR)})["a"]
    truth = decayed(2, 0, HOUR, now, 10 * HOUR, HOUR) + decayed(6, HOUR, now, now, 10 * HOUR, HOUR)
    assert counted == pytest.approx(truth)


def test_records_older_than_every_window_are_dropped() -> None:
    h = UsageHistory(UsagePolicy(window=HOUR, half_life=HOUR))
    snap = Snapshot(tuple(nodes(1, 8)), (Project("a", Quota(1)),), (_running("w", "a", 0.0, 1),), 0.0)
    h.apply(snap)
    h.apply(Snapshot(snap.nodes, snap.projects, (), 10.0))
    assert len(h.records) == 1
    h.apply(Snapshot(snap.nodes, snap.projects, (), 2 * HOUR))
    assert h.records == []


def _simulate(policy: UsagePolicy | None, hours: float = 24, arrive: float = 2, job: float = 1800.0,
              step: float = 120.0, restart_every: float | None = None, keep: bool = True) -> dict[str, float]:
    """As tests/core/cycle/test_time_fairshare.py, but the cycle's history comes only from an
    adapter's UsageHistory watching the snapshots (what both backends do). ``restart_every``:
    a new UsageHistory that often, from the last saved record (``keep``) or empty."""
    node = tuple(nodes(1, 8))
    tree = (Project("d", Quota(8)), Project("a", Quota(1), parent="d"), Project("b", Quota(1), parent="d"))
    history = UsageHistory(policy)
    running: dict[str, tuple[Workload, float]] = {}
    served = {"a": 0.0, "b": 0.0}
    counter = 0
    now = 0.0
    while now < hours * HOUR:
        if restart_every is not None and now and now % restart_every < step:
            record = history.saved(now, force=True)
            history = UsageHistory(policy)
            assert not keep or history.restore(record, now) is None
        pending = []
        for p in ("a", "b"):
            if p == "b" and now < arrive * HOUR:
                continue
            for _ in range(10):
                counter += 1
                pending.append(Workload(f"{p}-{counter}", p, (ONE_GPU,), created_at=now))
        snap = history.apply(Snapshot(node, tree, tuple(w for w, _ in running.values()) + tuple(pending), now))
        plan = run_cycle(snap, CycleConfig(usage=policy))
        for e in plan.evictions:
            running.pop(e.workload_id)
        by_id = {w.id: w for w in pending}
        for b in plan.bindings:
            w = by_id[b.workload_id]
            running[w.id] = (Workload(w.id, w.project, w.pods, created_at=w.created_at, started_at=now,
                                      placements=(b.pods[0].placement,)), now + job)
        now += step
        for wid, (w, end) in list(running.items()):
            served[w.project] += step / HOUR
            if end <= now:
                del running[wid]
    return served


def test_long_run_gpu_hours_converge_to_deserved_ratio_with_the_adapters_history() -> None:
    """One cycle every 4 minutes for 24 hours (plain fair share's 15% shortfall over the same
    arrivals is shown by test_time_fairshare.py, with records kept by hand)."""
    timed = _simulate(UsagePolicy(window=24 * HOUR, half_life=24 * HOUR, k=2.0), step=240.0)
    assert timed["a"] + timed["b"] == pytest.approx(8 * 24, rel=0.02)  # the node never idles
    assert math.isclose(timed["b"] / timed["a"], 1.0, rel_tol=0.05), timed
