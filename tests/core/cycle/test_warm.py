"""A session kept between cycles (``WarmCycle``) gives exactly the plan a new session gives,
over random sequences of changes: the last plan applied, finishes, arrivals, and now and then
a node added or a project's quota changed (those build a new session)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.bench import cycle as bench
from tessera.bench.changes import advance
from tessera.core.cycle import CycleConfig, Plan, Quota, Snapshot, run_cycle
from tessera.core.cycle.warm import WarmCycle
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, Node
from tessera.core.units import GiB
from tests.core.cycle.strategies import PROPERTY, snapshots

NOTHING = Plan((), (), (), (), {})


def _frame_change(snap: Snapshot, kind: str, step: int) -> Snapshot:
    if kind == "node":
        gpus = tuple(GpuDevice(f"x{step}-{i}", i, 32 * GiB, "V100") for i in range(2))
        return replace(snap, nodes=(*snap.nodes, Node(f"x{step}", gpus, cpu_milli=16_000, memory=64 * GiB)))
    first = snap.projects[-1]
    changed = replace(first, gpu=Quota(first.gpu.deserved + 1, None, first.gpu.over_quota_weight))
    return replace(snap, projects=(*snap.projects[:-1], changed))


@settings(PROPERTY, max_examples=60)
@given(snapshots(), st.lists(st.tuples(st.sampled_from([0.0, 0.2, 0.5]), st.integers(0, 3),
                                       st.sampled_from(["", "", "", "node", "project"]), st.booleans()),
                             min_size=1, max_size=4), st.integers(0, 1000))
def test_warm_session_plans_as_a_new_one(case: tuple[Snapshot, CycleConfig],
                                         steps: list[tuple[float, int, str, bool]], seed: int) -> None:
    """A step applies the last plan or not (an adapter that did not get to bind it)."""
    snap, config = case
    rng = random.Random(seed)
    warm = WarmCycle(config)
    plan = warm.run(snap)
    assert plan == run_cycle(snap, config)
    for step, (finish, arrive, frame, applied) in enumerate(steps):
        snap = advance(snap, plan if applied else NOTHING, rng, finish=finish, arrive=arrive, prefix=f"a{step}")
        if frame:
            snap = _frame_change(snap, frame, step)
        plan = warm.run(snap)
        assert warm.warm == (not frame)
        assert plan == run_cycle(snap, config)


@pytest.mark.parametrize("policy", ["fgd", "binpack"])
def test_warm_session_plans_as_a_new_one_on_a_bench_cluster(policy: str) -> None:
    """Four cycles of the cycle benchmark's mix (60 nodes), each plan applied to the next."""
    rng = random.Random(3)
    snap = bench.build(nodes=60, running=500, pending=120, seed=11)
    config = CycleConfig(policy=policy, reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    warm = WarmCycle(config)
    plan = warm.run(snap)
    changed = 0
    for step in range(4):
        snap = advance(snap, plan, rng, finish=0.02, arrive=10, prefix=f"a{step}")
        plan = warm.run(snap)
        assert warm.warm
        cold = run_cycle(snap, config)
        assert plan == cold
        changed += len(plan.bindings) + len(plan.evictions)
    assert changed > 0  # the cycles decided something


def test_a_refused_snapshot_raises_as_run_cycle_does_and_the_next_one_runs() -> None:
    snap = bench.build(nodes=4, running=20, pending=5, seed=2)
    warm = WarmCycle()
    warm.run(snap)
    running = next(w for w in snap.workloads if w.running)
    clash = replace(running, id="zz-clash", started_at=snap.now)  # the same devices again
    bad = replace(snap, workloads=(*snap.workloads, clash))
    with pytest.raises(InvalidRequest) as warm_error:
        warm.run(bad)
    with pytest.raises(InvalidRequest) as cold_error:
        run_cycle(bad)
    assert warm_error.value.field == cold_error.value.field
    assert warm.run(snap) == run_cycle(snap)
