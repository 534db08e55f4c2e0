"""Elastic and semi-preemptible workloads (actions/shrink.py, docs/scheduling.md): start at the
minimum, grow into idle capacity, shrink back to the minimum before anyone is evicted whole; the
part within the donor project's deserved quota (covered by its fair share) is never taken."""

from __future__ import annotations

from tessera.core.cycle import DEFAULT_ACTIONS, Snapshot, Workload

from .plan_helpers import apply
from .scenario import cycle, nodes, project, workload

N = nodes(1, 4)


def _elastic(placed: int, size: int = 4, min_members: int = 1, wid: str = "e", proj: str = "a") -> Workload:
    return workload(N, wid, proj, 1, pods=size, min_members=min_members,
                    on=[f"n1:{i}" for i in range(placed)])


def test_starts_at_its_minimum_when_only_that_fits_and_grows_into_idle_capacity() -> None:
    other = workload(N, "o", "b", 1, pods=3, on=["n1:0", "n1:1", "n1:2"])
    e = workload(N, "e", "a", 1, pods=4, min_members=1)
    plan = cycle(N, [project("a", 1), project("b", 3)], [other, e])
    (b,) = plan.bindings
    assert b.workload_id == "e" and len(b.pods) == 1  # its minimum, on the one idle GPU
    assert plan.waiting_for("e").reason.startswith("3 elastic pod(s) wait")  # type: ignore[union-attr]
    # The other project finishes: the running elastic workload grows into the idle GPUs.
    running = workload(N, "e", "a", 1, pods=4, min_members=1, on=["n1:3"])
    plan = cycle(N, [project("a", 1), project("b", 3)], [running])
    assert sorted(pb.pod for pb in plan.binding("e").pods) == [1, 2, 3]  # type: ignore[union-attr]


def test_reclaim_shrinks_an_elastic_workload_to_make_room_instead_of_evicting_it() -> None:
    projects = [project("a", 0), project("b", 2)]
    want = workload(N, "w", "b", 2)  # two GPUs on one node
    plan = cycle(N, projects, [_elastic(4), want])
    (ev,) = plan.evictions
    assert ev.workload_id == "e" and ev.action == "shrink" and ev.pods == (2, 3) and ev.gpus == 2
    assert "shrunk by 2 elastic pod(s) (to 2 of 4, minimum 1)" in ev.reason
    assert plan.binding("w") is not None and plan.binding("w").after_evictions == ("e",)  # type: ignore[union-attr]
    assert apply_shrink(plan) == {"e": [0, 1], "w": 2}
    apply(Snapshot(tuple(N), tuple(projects), (_elastic(4), want), 1000.0), plan)  # no overlap
    # Without the shrink action reclaim could only evict it whole (4 GPUs for 2: more than b
    # is owed), so b would wait with its deserved quota held by a's over-quota pods.
    whole = cycle(N, projects, [_elastic(4), want],
                  actions=tuple(a for a in DEFAULT_ACTIONS if a != "shrink"))
    assert not whole.evictions and whole.binding("w") is None


def apply_shrink(plan: object) -> dict[str, object]:
    """Which pods of e are left, and how many GPUs w got."""
    ev = plan.evictions[0]  # type: ignore[attr-defined]
    left = [i for i in range(4) if i not in ev.pods]
    return {"e": left, "w": len(plan.binding("w").pods[0].placement.devices)}  # type: ignore[attr-defined]


def test_the_part_within_deserved_quota_is_never_taken() -> None:
    # a deserves 3: its fair share covers 3 of its 4 pods; b (deserves 1) may take only the
    # fourth, then a second pod of b waits although a still has elastic pods above its minimum.
    projects = [project("a", 3), project("b", 1)]
    b1, b2 = workload(N, "b1", "b", 1, created=1), workload(N, "b2", "b", 1, created=2)
    plan = cycle(N, projects, [_elastic(4), b1, b2])
    (ev,) = plan.evictions
    assert ev.pods == (3,) and plan.binding("b1") is not None and plan.binding("b2") is None
    # Next cycle: b1 runs on the GPU it got, a holds 3, its fair share: nothing more is taken.
    b1_running = workload(N, "b1", "b", 1, on=["n1:3"])
    later = cycle(N, projects, [_elastic(3), b1_running, b2])
    assert not later.evictions and later.binding("b2") is None


def test_the_minimum_is_never_shrunk_and_a_gang_without_elastic_pods_goes_whole() -> None:
    projects = [project("a", 0), project("b", 4)]
    gang = workload(N, "g", "a", 1, pods=2, min_members=2, on=["n1:0", "n1:1"])
    e = workload(N, "e", "a", 1, pods=2, min_members=1, on=["n1:2", "n1:3"])
    # One pod: e gives back its elastic pod, nobody is evicted whole.
    plan = cycle(N, projects, [gang, e, workload(N, "w", "b", 1)])
    assert [(x.workload_id, x.action, x.pods) for x in plan.evictions] == [("e", "shrink", (1,))]
    # Two together: e's one elastic pod is not enough and shrink never goes below a minimum;
    # reclaim then evicts one workload whole under its own rules (here a tie of 2 GPUs each).
    plan = cycle(N, projects, [gang, e, workload(N, "w2", "b", 1, pods=2, min_members=2)])
    (x,) = plan.evictions
    assert x.action == "reclaim" and x.pods == ()
    assert plan.binding("w2") is not None
