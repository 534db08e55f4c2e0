"""The usage history kept across restarts (core.usage_saved, UsageHistory.saved/restore): the
compacted record against the exact formula, a restore that decides as before, a run that ended
while no scheduler watched, refusals of a bad record, and the long-run simulation with restarts."""

from __future__ import annotations

import json
import math
import random

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.usage import UsagePolicy, UsageRecord, decayed, decayed_usage
from tessera.core.usage_history import UsageHistory, parse_override, parse_save_every
from tessera.core.usage_saved import bucket_seconds, compact

from .scenario import nodes
from .test_usage_history import HOUR, _running, _simulate

DAY = 24 * HOUR


@pytest.mark.parametrize(("window", "half"), [(7 * DAY, DAY), (DAY, DAY), (HOUR, 30.0), (DAY, 60.0)])
def test_compacted_usage_is_within_a_tenth_of_a_percent_of_the_formula(window: float, half: float) -> None:
    rng = random.Random(7)
    now = 10 * DAY
    records = []
    for _ in range(400):
        project = rng.choice("abc")
        start = now - rng.uniform(0, 1.2 * window)
        records.append(UsageRecord(project, start, min(now, start + rng.expovariate(1 / (half / 3))),
                                   rng.choice((0.25, 1, 2, 8))))
    settings = {p: (window, half) for p in "abc"}
    exact = decayed_usage(records, now, settings)
    packed = compact(records, now, settings, (window, half))
    assert len(packed) <= 3 * (min(window, 64 * half) / bucket_seconds(window, half) + 2)
    got = decayed_usage(packed, now, settings)
    for p in "abc":
        # Bucket error ≤ 0.1 %; the cut-off bucket adds at most one bucket at the window's edge.
        edge = 8 * bucket_seconds(window, half) * 2 ** (-window / half)
        assert got[p] == pytest.approx(exact[p], rel=1e-3, abs=edge), p
    again = compact(packed, now, settings, (window, half))  # idempotent (up to rounding)
    assert [(r.project, r.start, r.end, r.gpus) for r in again] == [
        (r.project, pytest.approx(r.start), pytest.approx(r.end), pytest.approx(r.gpus)) for r in packed]


def test_a_restored_history_decides_as_the_one_that_wrote_it() -> None:
    node = tuple(nodes(1, 8))
    policy = UsagePolicy(window=DAY, half_life=HOUR)
    h = UsageHistory(policy, save_every=60)
    h.observe([_running("w1", "a", 0.0, 4), _running("w2", "b", 0.0, 2)], node, 0.0)
    h.observe([_running("w2", "b", 0.0, 2), _running("w3", "a", 2 * HOUR, 1)], node, 2 * HOUR)
    record = h.saved(3 * HOUR)
    assert record is not None and h.saved(3 * HOUR + 30) is None  # not due yet
    text = json.dumps(record)  # what a store holds
    settings = {p: (DAY, HOUR) for p in "ab"}
    before = decayed_usage(h.records, 4 * HOUR, settings)
    again = UsageHistory(policy)
    assert again.restore(json.loads(text), 3 * HOUR + 5) is None
    assert decayed_usage(again.records, 4 * HOUR, settings) == before
    # w3 still runs after the restart: it goes on being counted from its start. w2 stopped
    # while nothing watched: its run ends when the record was written (all that is known).
    again.observe([_running("w3", "a", 2 * HOUR, 1)], node, 4 * HOUR)
    b = decayed_usage(again.records, 4 * HOUR, settings)["b"]
    assert b == pytest.approx(decayed(2, 0, 3 * HOUR, 4 * HOUR, DAY, HOUR), rel=1e-3)
    assert [r.project for r in again.records].count("a") == len([r for r in h.records if r.project == "a"])


@pytest.mark.parametrize(("record", "says"), [
    ("not json at all", "not a JSON object"),
    ({"format": 2, "savedAt": 1.0, "usage": {}, "running": []}, "format 2, this release reads format 1"),
    ({"format": 1, "savedAt": "yesterday", "usage": {}, "running": []}, "savedAt is not a finite number"),
    ({"format": 1, "savedAt": 1.0, "usage": {"a": [1, 2]}, "running": []}, "start, end, GPUs triples"),
    ({"format": 1, "savedAt": 1.0, "usage": {"a": [5, 2, 1]}, "running": []}, "ends before it starts"),
    ({"format": 1, "savedAt": 1.0, "usage": {}, "running": [["w", "a"]]}, "[workload id, project, since, GPUs]"),
    ({"format": 1, "savedAt": 1e12, "usage": {}, "running": []}, "in the future"),
])
def test_a_bad_record_is_refused_with_its_reason_and_the_history_starts_empty(record: object, says: str) -> None:
    h = UsageHistory(UsagePolicy())
    h.records = [UsageRecord("a", 0, 1, 1)]
    why = h.restore(record, 1000.0)
    assert why is not None and says in why, why
    assert h.records == [] and not h.running


def test_save_every_as_written_and_refused() -> None:
    flag = "--fair-share-history"
    assert parse_save_every(flag, "window=7d") == 30.0 and parse_save_every(flag, "save-every=5s") == 5.0
    for text, rule in (("save-every=0", "more than 0"), ("save-every=2d", "at most one day")):
        with pytest.raises(InvalidRequest) as err:
            parse_save_every(flag, text)
        assert err.value.field == f"{flag} save-every" and rule in str(err.value)
    with pytest.raises(InvalidRequest, match="save-every is cluster-wide"):
        parse_override("--fair-share-history-for", "ml:save-every=5s")


def test_long_run_with_restarts_every_two_hours_still_converges() -> None:
    """The 24-hour simulation with the scheduler restarted every 2 hours from its saved record:
    within 5 % of the deserved 1:1, as without restarts; forgetting at each restart is not."""
    policy = UsagePolicy(window=24 * HOUR, half_life=24 * HOUR, k=2.0)
    kept = _simulate(policy, step=480.0, restart_every=2 * HOUR, keep=True)
    assert math.isclose(kept["b"] / kept["a"], 1.0, rel_tol=0.05), kept
    forgot = _simulate(policy, step=480.0, restart_every=2 * HOUR, keep=False)
    assert not math.isclose(forgot["b"] / forgot["a"], 1.0, rel_tol=0.05), forgot


def test_records_added_while_a_save_compacts_are_kept_and_coarser_keeps_gpu_seconds() -> None:
    """The Kubernetes scheduler compacts on a thread (take, compacted, keep) while cycles go on
    adding records; a record too big for its ConfigMap is written coarser, GPU-seconds exact."""
    h = UsageHistory(UsagePolicy(window=DAY, half_life=HOUR))
    h.records = [UsageRecord("a", 100.0 * i, 100.0 * i + 50, 1.0) for i in range(200)]
    taken = h.take(30_000.0)
    assert taken is not None and h.take(30_001.0) is None
    late = UsageRecord("b", 29_000.0, 30_000.0, 2.0)
    h.records.append(late)  # a cycle meanwhile
    packed, record = h.compacted(*taken, 30_000.0)
    coarse, _ = h.compacted(*taken, 30_000.0, coarser=3)
    assert len(coarse) < len(packed) < len(taken[0])
    for out in (packed, coarse):
        assert sum(r.gpus * (r.end - r.start) for r in out) == pytest.approx(200 * 50.0)
    h.keep(taken[0], packed)
    assert h.records == [*packed, late] and record["usage"]["a"]
