"""preempt and consolidate with their fast paths (victims checked only where a waiting workload
outranks them, workloads with no victim left out of the fair order, movable workloads and their
index found only when needed) give the same plans as before them (``old_actions``), on random
small clusters where some running fractional workloads may be moved."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.bench.cycle import build
from tessera.core.cycle import CycleConfig, Plan, Snapshot, run_cycle
from tessera.core.cycle.actions import ACTIONS

from .old_actions import OldConsolidate, OldPreempt
from .strategies import snapshots


@settings(max_examples=100, deadline=None)
@given(case=snapshots(), data=st.data())
def test_preempt_and_consolidate_plan_as_before(case, data) -> None:  # type: ignore[no-untyped-def]
    snap, config = case
    workloads = tuple(
        dataclasses.replace(w, movable=data.draw(st.booleans())) if w.running else w
        for w in snap.workloads)
    snap = dataclasses.replace(snap, workloads=workloads)
    assert run_cycle(snap, config) == _old_plan(snap, config)


def test_preempt_and_consolidate_plan_as_before_on_the_bench_mix() -> None:
    """The cycle benchmark's mix (portions, memory, whole GPUs, gangs, MIG, priorities) at 40
    nodes, 4 seeds: both actions bind and move here (asserted), so the comparison is not empty."""
    config = CycleConfig(policy="fgd", reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    actions: Counter[str] = Counter()
    for seed in range(4):
        snap = build(40, 8, 8, 400, 80, seed, 0.5)
        plan = run_cycle(snap, config)
        assert plan == _old_plan(snap, config), seed
        actions.update(b.action for b in plan.bindings)
    assert actions["preempt"] > 0 and actions["consolidate"] > 0, actions


def _old_plan(snap: Snapshot, config: CycleConfig) -> Plan:
    saved = dict(ACTIONS)
    ACTIONS["preempt"], ACTIONS["consolidate"] = OldPreempt, OldConsolidate
    try:
        return run_cycle(snap, config)
    finally:
        ACTIONS.update(saved)
