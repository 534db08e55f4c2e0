"""Fair share over usable capacity: a free fragment no pending request can use is not divided."""

from __future__ import annotations

import pytest

from tessera.core.cycle import session as session_module
from tessera.core.cycle.usable import unusable_gpus
from tessera.core.model import GpuRequest
from tessera.core.state import ClusterState

from .scenario import bound, cycle, evicted, nodes, placement, project, request, workload


def _cluster() -> tuple[list, list, list]:
    """8 GPUs: a runs 5 whole GPUs and half of each of the other 3 (those three started just
    now: the minimum runtimes keep them where they are)."""
    ns = nodes(1, 8)
    projects = [project("a", 0), project("b", 0)]  # no deserved quota: all of it is over-quota
    running = [workload(ns, f"a{i}", "a", 1, on=[f"n1:{i}"]) for i in range(5)]
    running += [workload(ns, f"a-half{i}", "a", "0.5", on=[f"n1:{i}"], started=990.0) for i in (5, 6, 7)]
    return ns, projects, running


def test_fragments_no_pending_request_fits_do_not_inflate_fair_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """b waits for whole GPUs. The three free halves fit none of b's pods, so fair share divides
    6.5 GPUs (3.25 each), not 8 (4 each). Counting them, a's share of 4 includes 1.5 GPUs b can
    never use, and a must keep 4: b gets 2 GPUs though its share says 4. Over usable capacity b
    gets 3 of its 3.25 and a keeps 3.5 of its 3.25."""
    ns, projects, running = _cluster()
    pending = [workload(ns, f"b{i}", "b", 1, created=float(i)) for i in range(6)]
    plan = cycle(ns, projects, running + pending, reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    assert plan.projects["b"].fair_share[0] == pytest.approx(3.25)
    assert plan.projects["a"].fair_share[0] == pytest.approx(3.25)
    assert len(bound(plan)) == 3 and len(evicted(plan)) == 3
    assert plan.projects["a"].allocated_after[0] == pytest.approx(3.5)
    # Counting the fragments as capacity (as before) changes the outcome.
    monkeypatch.setattr(session_module, "unusable_gpus", lambda state, pending, movable: 0.0)
    plain = cycle(ns, projects, running + pending, reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    assert plain.projects["b"].fair_share[0] == pytest.approx(4)
    assert len(bound(plain)) == 2 and len(evicted(plain)) == 2


def test_fragments_some_pending_request_fits_still_count() -> None:
    """The same, but b also waits with half-GPU pods: the halves are usable, all 8 are divided."""
    ns, projects, running = _cluster()
    pending = [workload(ns, f"b{i}", "b", 1, created=float(i)) for i in range(6)]
    pending += [workload(ns, f"b-half{i}", "b", "0.5", created=10.0 + i) for i in range(3)]
    plan = cycle(ns, projects, running + pending, reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    assert plan.projects["b"].fair_share[0] == pytest.approx(4)
    assert {"b-half0", "b-half1", "b-half2"} <= set(bound(plan))


def test_unusable_gpus_by_request_kind() -> None:
    ns = nodes(1, 4, memory_gib=16)
    state = ClusterState(ns)
    r = request("0.75")
    state.assign("x", placement(ns, r, "n1:0"))  # 4 GiB left on GPU 0
    state.assign("y", placement(ns, request(1), "n1:1"))  # held whole: never a fragment
    # GPUs 2 and 3 are empty: a whole-GPU request uses them, not GPU 0's quarter.
    assert unusable_gpus(state, [GpuRequest.whole(1)]) == pytest.approx(0.25)
    assert unusable_gpus(state, [GpuRequest.fraction("0.25")]) == pytest.approx(0.0)
    assert unusable_gpus(state, [GpuRequest.of_memory(5 << 30)]) == pytest.approx(0.25)
    assert unusable_gpus(state, [GpuRequest.whole(1, models=frozenset({"A100"}))]) == pytest.approx(2.25)
    assert unusable_gpus(state, []) == 0.0
