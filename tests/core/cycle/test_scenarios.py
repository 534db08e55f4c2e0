"""Declarative scenarios: nodes, projects, running and pending workloads → the plan."""

from __future__ import annotations

import pytest

from tessera.core.units import GiB

from .scenario import bound, cycle, evicted, nodes, project, waiting, workload

# -- the Run:ai walkthroughs (shared/seeds 000, 001) --------------------------------------------


def test_walkthrough_team_a_runs_half_and_three_tenths_on_one_gpu() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("team-a", 1)],
        [workload(ns, "frac05", "team-a", 0.5, cls="build"), workload(ns, "frac03", "team-a", 0.3, cls="build")],
    )
    assert bound(plan) == {"frac05": ["n1:0"], "frac03": ["n1:0"]}
    assert not plan.waiting and not plan.evictions
    by_id = {b.workload_id: b.pods[0].placement for b in plan.bindings}
    assert by_id["frac05"].request_bytes == (8 * GiB,)
    assert plan.projects["team-a"].allocated_after[0] == pytest.approx(0.8)


def test_quickstart_two_halves_share_one_gpu() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("team-a", 1)],
        [workload(ns, "frac05", "team-a", 0.5), workload(ns, "frac05-2", "team-a", 0.5)],
    )
    assert bound(plan) == {"frac05": ["n1:0"], "frac05-2": ["n1:0"]}


def test_a_third_fraction_waits_when_the_gpu_is_full() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("team-a", 1)],
        [workload(ns, "r", "team-a", 0.5, on=["n1:0"]), workload(ns, "p", "team-a", 0.6)],
    )
    assert bound(plan) == {}
    w = plan.waiting_for("p")
    # team-a asks 1.1 GPUs of a 1-GPU cluster, so its fair share (1) is the first reason.
    assert w is not None and w.kind == "fair-share"
    assert w.reason == (
        "would exceed fair share of team-a by 0.1 GPU, and no idle room fits it: "
        "no GPU with 9.6 GiB free: largest free is 8 GiB on n1 GPU 0"
    )


# -- fractions ----------------------------------------------------------------------------------


def test_multi_device_fraction_takes_a_share_on_each_device() -> None:
    ns = nodes(1, gpus=3)
    plan = cycle(
        ns,
        [project("a", 3)],
        [
            workload(ns, "r0", "a", 0.5, on=["n1:0"]),
            workload(ns, "r2", "a", 0.75, on=["n1:2"]),
            workload(ns, "p", "a", 0.5, devices=2),
        ],
    )
    assert bound(plan) == {"p": ["n1:0,1"]}
    assert plan.projects["a"].allocated_after[0] == 0.5 + 0.75 + 1.0


def test_dynamic_fractions_are_placed_by_request_not_limit() -> None:
    ns = nodes(1, gpus=1)
    pending = [workload(ns, f"d{i}", "a", 0.25, limit=1.0) for i in range(4)]
    plan = cycle(ns, [project("a", 1)], pending)
    assert set(bound(plan)) == {"d0", "d1", "d2", "d3"}
    p = plan.bindings[0].pods[0].placement
    assert p.request_bytes == (4 * GiB,) and p.limit_bytes == (16 * GiB,)
    assert plan.projects["a"].allocated_after[0] == 1.0


def test_memory_request_counts_as_its_share_of_the_device() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("a", 0.5)],
        [workload(ns, "m1", "a", memory_gib=8, cls="inference"), workload(ns, "m2", "a", memory_gib=8, cls="inference", created=1)],
    )
    assert bound(plan) == {"m1": ["n1:0"]}
    w = plan.waiting_for("m2")
    assert w is not None and w.kind == "quota"
    assert "non-preemptible" in w.reason and "0.5 of its 0.5 GPU deserved" in w.reason


def test_pending_memory_request_uses_smallest_device_that_can_hold_it() -> None:
    small = nodes(1, gpus=1, memory_gib=8, prefix="s")
    big = nodes(1, gpus=1, memory_gib=32, prefix="b")
    ns = small + big
    # 12 GiB cannot go on an 8 GiB device: it counts as 12/32 of the 32 GiB one, not 1.5 GPUs.
    plan = cycle(ns, [project("a", 0.375)], [workload(ns, "m", "a", memory_gib=12, cls="build")])
    assert bound(plan) == {"m": ["b1:0"]}
    assert plan.projects["a"].requested[0] == 0.375


# -- limits, quota, fair share ------------------------------------------------------------------


def test_project_at_its_limit_waits_with_the_reason() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        [project("team-a", 1, limit=2)],
        [
            workload(ns, "r1", "team-a", 1, on=["n1:0"]),
            workload(ns, "r2", "team-a", 1, on=["n1:1"]),
            workload(ns, "p", "team-a", 1),
        ],
    )
    assert bound(plan) == {}
    w = plan.waiting_for("p")
    assert w is not None and w.kind == "limit"
    assert w.reason.startswith("project team-a is at its limit of 2 GPUs")


def test_over_fair_share_waits_when_nothing_is_idle_and_uses_idle_gpus_otherwise() -> None:
    ns = nodes(2, gpus=1)
    projects = [project("team-a", 2), project("team-b", 0), project("team-c", 1)]
    # team-a's 2-GPU gang cannot fit next to team-c's inference, yet it holds team-b's share at 0.
    wl = [
        workload(ns, "c", "team-c", 1, cls="inference", on=["n2:0"]),
        workload(ns, "a", "team-a", 1, pods=2),
        workload(ns, "b", "team-b", 0.5),
    ]
    plan = cycle(ns, projects, wl, actions=("allocate", "reclaim", "preempt"))
    w = plan.waiting_for("b")
    assert w is not None and w.kind == "fair-share"
    assert w.reason == "would exceed fair share of team-b by 0.5 GPU"
    plan = cycle(ns, projects, wl)
    assert bound(plan) == {"b": ["n1:0"]}
    assert plan.bindings[0].action == "backfill"
    assert "beyond its fair share" in plan.bindings[0].message


def test_what_can_never_run_takes_no_fair_share() -> None:
    ns = nodes(2, gpus=1)
    projects = [project("team-a", 2), project("team-b", 0)]
    plan = cycle(ns, projects, [workload(ns, "a", "team-a", 2), workload(ns, "b", "team-b", 1)])
    assert plan.waiting_for("a").kind == "unschedulable"  # type: ignore[union-attr]
    assert plan.projects["team-b"].fair_share[0] == pytest.approx(1)
    assert plan.binding("b").action == "allocate"  # type: ignore[union-attr]


def test_non_preemptible_runs_only_in_quota_preemptible_may_go_over() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        [project("a", 1)],
        [workload(ns, "inf1", "a", 1, cls="inference"), workload(ns, "inf2", "a", 1, cls="inference", created=1),
         workload(ns, "t1", "a", 1, created=2)],
    )
    assert set(bound(plan)) == {"inf1", "t1"}
    assert plan.waiting_for("inf2").kind == "quota"  # type: ignore[union-attr]
    assert "over its deserved quota" in plan.binding("t1").message  # type: ignore[union-attr]


# -- gangs --------------------------------------------------------------------------------------


def test_gang_is_all_or_nothing_with_the_count_in_the_reason() -> None:
    ns = nodes(4, gpus=1)
    ns_busy = [workload(ns, f"r{i}", "b", 1, on=[f"n{i}:0"]) for i in (2, 3, 4)]
    plan = cycle(ns, [project("a", 4), project("b", 0)], [*ns_busy, workload(ns, "g", "a", 1, pods=4)],
                 actions=("allocate",))
    assert bound(plan) == {}
    w = plan.waiting_for("g")
    assert w is not None and w.reason.startswith("waiting for 3 of 4 gang members to fit")


def test_gang_fits_across_nodes() -> None:
    ns = nodes(4, gpus=1)
    plan = cycle(ns, [project("a", 4)], [workload(ns, "g", "a", 1, pods=4)])
    assert sorted(bound(plan)["g"]) == ["n1:0", "n2:0", "n3:0", "n4:0"]


def test_elastic_gang_starts_with_its_minimum_and_extra_pods_wait() -> None:
    ns = nodes(3, gpus=1)
    plan = cycle(ns, [project("a", 4)], [workload(ns, "g", "a", 1, pods=4, min_members=2)])
    assert len(bound(plan)["g"]) == 3
    w = plan.waiting_for("g")
    assert w is not None and w.reason.startswith("1 elastic pod(s) wait")


# -- reclaim ------------------------------------------------------------------------------------


def two_teams(**extra: object) -> list:  # type: ignore[type-arg]
    return [project("team-a", 1, **extra), project("team-b", 1)]  # type: ignore[arg-type]


def test_reclaim_takes_back_deserved_quota_from_the_newest_over_quota_workload() -> None:
    ns = nodes(1, gpus=2)
    plan = cycle(
        ns,
        two_teams(),
        [
            workload(ns, "b1", "team-b", 1, on=["n1:0"], started=10),
            workload(ns, "b2", "team-b", 1, on=["n1:1"], started=20),
            workload(ns, "a1", "team-a", 1),
        ],
    )
    assert evicted(plan) == {"b2"}
    assert bound(plan) == {"a1": ["n1:1"]}
    b = plan.binding("a1")
    assert b is not None and b.action == "reclaim" and b.after_evictions == ("b2",)
    e = plan.evictions[0]
    assert e.action == "reclaim" and e.for_workload == "a1" and "team-a is below its fair share" in e.reason


def test_reclaim_never_evicts_non_preemptible() -> None:
    ns = nodes(1, gpus=2)
    plan = cycle(
        ns,
        [project("team-a", 1), project("team-b", 2)],
        [
            workload(ns, "b1", "team-b", 1, cls="inference", on=["n1:0"]),
            workload(ns, "b2", "team-b", 1, cls="train", on=["n1:1"]),
            workload(ns, "a1", "team-a", 1),
        ],
    )
    # Deserved 1 + 2 over-subscribes 2 GPUs: shares are 2/3 and 4/3, so team-b may give up only
    # b2 if that leaves it at or above 4/3 — it would not, so nothing is reclaimed.
    assert evicted(plan) == set()
    plan = cycle(
        ns,
        two_teams(),
        [
            workload(ns, "b1", "team-b", 1, cls="inference", on=["n1:0"], started=30),
            workload(ns, "b2", "team-b", 1, cls="train", on=["n1:1"], started=10),
            workload(ns, "a1", "team-a", 1),
        ],
    )
    assert evicted(plan) == {"b2"}


def test_reclaim_leaves_victim_at_or_above_its_fair_share() -> None:
    ns = nodes(1, gpus=2)
    # team-a deserves nothing: its fair share is 0, so it cannot reclaim at all.
    plan = cycle(
        ns,
        [project("team-a", 0), project("team-b", 2)],
        [
            workload(ns, "b1", "team-b", 1, on=["n1:0"]),
            workload(ns, "b2", "team-b", 1, on=["n1:1"]),
            workload(ns, "a1", "team-a", 1),
        ],
    )
    assert evicted(plan) == set() and bound(plan) == {}
    w = plan.waiting_for("a1")
    assert w is not None and w.reason == "would exceed fair share of team-a by 1 GPU, and no idle room fits it: no node has 1 idle GPU: the most idle on one node is 0"


def test_min_runtime_protects_fresh_workloads_from_reclaim() -> None:
    ns = nodes(1, gpus=2)
    wl = [
        workload(ns, "b1", "team-b", 1, on=["n1:0"], started=100),
        workload(ns, "b2", "team-b", 1, on=["n1:1"], started=990),
        workload(ns, "a1", "team-a", 1),
    ]
    plan = cycle(ns, two_teams(), wl, now=1000, reclaim_min_runtime=60)
    assert evicted(plan) == {"b1"}
    plan = cycle(ns, [project("team-a", 1), project("team-b", 1, reclaim_min_runtime=1000)], wl, now=1000)
    assert evicted(plan) == set() and bound(plan) == {}


def test_no_eviction_when_the_workload_would_still_not_fit() -> None:
    ns = nodes(3, gpus=1)
    plan = cycle(
        ns,
        [project("team-a", 3), project("team-b", 0), project("team-c", 0)],
        [
            workload(ns, "b1", "team-b", 1, on=["n1:0"]),
            workload(ns, "b2", "team-b", 1, on=["n2:0"]),
            workload(ns, "c1", "team-c", 1, on=["n3:0"], cls="inference"),
            workload(ns, "g", "team-a", 1, pods=3),
        ],
    )
    assert evicted(plan) == set() and bound(plan) == {}
    assert "reclaim found no" in waiting(plan)["g"]


def test_reclaim_picks_the_node_that_frees_least() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("team-a", 1), project("team-b", 0, weight=0), project("team-c", 0, weight=0)],
        [
            # n1 is full with b1, b2 (0.25 each) and b3 (0.5); n2 with c1 (0.75) and c2 (0.25).
            workload(ns, "b1", "team-b", 0.25, on=["n1:0"], started=1),
            workload(ns, "b2", "team-b", 0.25, on=["n1:0"], started=2),
            workload(ns, "c1", "team-c", 0.75, on=["n2:0"], started=3),
            workload(ns, "c2", "team-c", 0.25, on=["n2:0"], started=4),
            workload(ns, "b3", "team-b", 0.5, on=["n1:0"], started=5),
            workload(ns, "a1", "team-a", 0.25),
        ],
    )
    # Newest first would pick b3 (0.5 GPU) on n1. One 0.25 workload is the least to free: on n1
    # the node search takes the fewest victims (then GPUs) of those it may take, the newest of
    # equals (b2); it ties with c2 on n2, and the first node in the victims' order wins.
    assert bound(plan) == {"a1": ["n1:0"]}
    assert evicted(plan) == {"b2"} and plan.evictions[0].gpus == pytest.approx(0.25)


# -- preempt ------------------------------------------------------------------------------------


def test_higher_priority_preempts_lower_in_the_same_project() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 0)],
        [workload(ns, "t", "a", 1, on=["n1:0"]), workload(ns, "inf", "a", 1, cls="inference")],
    )
    assert evicted(plan) == {"t"} and bound(plan) == {"inf": ["n1:0"]}
    assert plan.evictions[0].action == "preempt" and "priority 125 > 50" in plan.evictions[0].reason


def test_preempt_frees_quota_under_the_limit() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        [project("a", 1, limit=1)],
        [workload(ns, "t", "a", 1, on=["n1:0"]), workload(ns, "b", "a", 1, cls="build")],
    )
    assert evicted(plan) == {"t"}
    assert len(bound(plan)["b"]) == 1


def test_equal_priority_does_not_preempt_and_other_projects_are_untouched() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 0)],
        [workload(ns, "t", "a", 1, on=["n1:0"]), workload(ns, "t2", "a", 1)],
    )
    assert evicted(plan) == set()
    plan = cycle(
        ns,
        [project("a", 0), project("b", 1)],
        [workload(ns, "t", "a", 1, on=["n1:0"]), workload(ns, "inf", "b", 1, cls="inference")],
        actions=("allocate", "preempt"),
    )
    assert evicted(plan) == set()


def test_min_runtime_protects_from_preemption() -> None:
    ns = nodes(1, gpus=1)
    wl = [workload(ns, "t", "a", 1, on=["n1:0"], started=995), workload(ns, "inf", "a", 1, cls="inference")]
    plan = cycle(ns, [project("a", 1)], wl, now=1000, preempt_min_runtime=30)
    assert evicted(plan) == set()
    plan = cycle(ns, [project("a", 1)], wl, now=1030, preempt_min_runtime=30)
    assert evicted(plan) == {"t"}


# -- consolidate --------------------------------------------------------------------------------


def test_consolidation_moves_fractions_to_make_room() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 1)],
        [
            workload(ns, "x1", "b", 0.5, on=["n1:0"]),
            workload(ns, "x2", "b", 0.5, on=["n2:0"]),
            workload(ns, "w", "a", 1),
        ],
    )
    assert evicted(plan) == set()
    assert len(plan.moves) == 1
    move = plan.moves[0]
    assert move.target.node != move.source.node
    assert bound(plan) == {"w": [f"{move.source.node}:0"]}
    assert plan.binding("w").action == "consolidate"  # type: ignore[union-attr]


def test_consolidation_only_if_every_moved_workload_is_re_placed() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 1)],
        [
            workload(ns, "x1", "b", 0.6, on=["n1:0"]),
            workload(ns, "x2", "b", 0.6, on=["n2:0"]),
            workload(ns, "w", "a", 1),
        ],
    )
    assert plan.moves == () and evicted(plan) == set() and bound(plan) == {}


def test_consolidation_never_moves_whole_gpu_or_non_preemptible_workloads() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 1)],
        [
            workload(ns, "x1", "b", 0.5, on=["n1:0"], cls="inference"),
            workload(ns, "x2", "b", 0.5, on=["n2:0"], cls="inference"),
            workload(ns, "w", "a", 1),
        ],
    )
    assert plan.moves == ()


def test_consolidation_never_moves_a_workload_its_adapter_cannot_move() -> None:
    from dataclasses import replace

    ns = nodes(2, gpus=1)
    pinned = [replace(workload(ns, f"x{i}", "b", 0.5, on=[f"n{i}:0"]), movable=False) for i in (1, 2)]
    plan = cycle(ns, [project("a", 1), project("b", 1)], [*pinned, workload(ns, "w", "a", 1)])
    assert plan.moves == () and bound(plan) == {}


# -- nested projects ----------------------------------------------------------------------------


def tree(dept_limit: float | None = None) -> list:  # type: ignore[type-arg]
    return [
        project("dept", 2, limit=dept_limit),
        project("other", 2),
        project("p1", 1, parent="dept"),
        project("p2", 1, parent="dept"),
        project("p3", 2, parent="other"),
    ]


def test_department_limit_applies_to_its_projects() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        tree(dept_limit=2),
        [workload(ns, "r", "p2", 1, on=["n1:0"]), workload(ns, "r2", "p2", 1, on=["n1:1"]), workload(ns, "p", "p1", 1)],
    )
    w = plan.waiting_for("p")
    assert w is not None and w.reason.startswith("department dept is at its limit of 2 GPUs")


def test_reclaim_between_siblings_of_a_department() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        tree(),
        [
            workload(ns, "x1", "p2", 1, on=["n1:0"], started=1),
            workload(ns, "x2", "p2", 1, on=["n1:1"], started=2),
            workload(ns, "y1", "p3", 1, on=["n1:2"]),
            workload(ns, "y2", "p3", 1, on=["n1:3"]),
            workload(ns, "p", "p1", 1),
        ],
    )
    # p3 is at its fair share (2); p2 is over its own (1) inside dept, which is at its share.
    assert evicted(plan) == {"x2"}
    assert bound(plan) == {"p": ["n1:1"]}


def test_workloads_may_not_sit_in_a_department() -> None:
    import pytest

    from tessera.core.errors import InvalidRequest

    ns = nodes(1, gpus=1)
    with pytest.raises(InvalidRequest) as err:
        cycle(ns, tree(), [workload(ns, "w", "dept", 1)])
    assert err.value.field == "workloads.w.project"


# -- order and priorities -----------------------------------------------------------------------


def test_fair_order_serves_the_project_furthest_below_its_share_first() -> None:
    ns = nodes(1, gpus=2)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 1)],
        [
            workload(ns, "a-run", "a", 1, on=["n1:0"]),
            workload(ns, "a2", "a", 1, created=0),
            workload(ns, "b1", "b", 1, created=5),
        ],
        actions=("allocate",),
    )
    assert bound(plan) == {"b1": ["n1:1"]}


def test_within_a_project_higher_priority_then_older_first() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1)],
        [
            workload(ns, "old-train", "a", 1, created=0),
            workload(ns, "new-build", "a", 1, cls="build", created=9),
            workload(ns, "new-train", "a", 1, created=5),
        ],
    )
    assert set(bound(plan)) == {"new-build"}
    plan = cycle(
        ns, [project("a", 1)], [workload(ns, "t2", "a", 1, created=5), workload(ns, "t1", "a", 1, created=1)]
    )
    assert set(bound(plan)) == {"t1"}


def test_two_cycles_on_the_same_snapshot_give_the_same_plan() -> None:
    ns = nodes(2, gpus=2)
    wl = [
        workload(ns, "b1", "team-b", 1, on=["n1:0"], started=10),
        workload(ns, "b2", "team-b", 0.5, on=["n1:1"], started=20),
        workload(ns, "b3", "team-b", 1, on=["n2:0"], started=30),
        workload(ns, "a1", "team-a", 1),
        workload(ns, "a2", "team-a", 0.5, pods=2),
    ]
    assert cycle(ns, [project("team-a", 2), project("team-b", 1)], wl) == cycle(
        ns, [project("team-a", 2), project("team-b", 1)], wl
    )


def test_running_elastic_gang_grows_when_room_appears() -> None:
    ns = nodes(3, gpus=1)
    plan = cycle(ns, [project("a", 3)], [workload(ns, "g", "a", 1, pods=3, min_members=2, on=["n1:0", "n2:0"])])
    assert bound(plan) == {"g": ["n3:0"]}
    assert plan.projects["a"].allocated_after[0] == pytest.approx(3)


def test_cpu_quota_is_governed_where_given() -> None:
    from tessera.core.cycle import Project, Quota, Workload
    from tessera.core.model import GpuRequest, ResourceRequest

    ns = nodes(1, gpus=4)
    cpu_heavy = ResourceRequest(GpuRequest.whole(1), cpu_milli=6000)
    projects = [Project("a", Quota(4), cpu=Quota(8000, limit=8000)), Project("b", Quota(0))]
    plan = cycle(ns, projects, [Workload("w1", "a", (cpu_heavy,)), Workload("w2", "a", (cpu_heavy,), created_at=1)])
    assert set(bound(plan)) == {"w1"}
    w = plan.waiting_for("w2")
    assert w is not None and w.reason.startswith("project a is at its limit of 8 CPU")


def test_the_plan_reports_fair_shares_and_allocations() -> None:
    ns = nodes(1, gpus=4)
    plan = cycle(
        ns,
        [project("a", 1, weight=1), project("b", 1, weight=3)],
        [workload(ns, "a1", "a", 1, pods=4), workload(ns, "b1", "b", 1, pods=4)],
        actions=("allocate",),
    )
    # 1 + 1 deserved, the other 2 split 1:3.
    assert plan.projects["a"].fair_share[0] == pytest.approx(1.5)
    assert plan.projects["b"].fair_share[0] == pytest.approx(2.5)
    assert plan.projects["a"].requested[0] == pytest.approx(4)


def test_cgpu_memory_over_four_devices_counts_its_share_of_each() -> None:
    # shared/seeds 002: 8 GiB as 2 GiB on each of 4 GPUs of one node.
    ns = nodes(1, gpus=4)
    plan = cycle(ns, [project("a", 0.5)], [workload(ns, "c", "a", memory_gib=2, devices=4, cls="inference")])
    assert bound(plan) == {"c": ["n1:0,1,2,3"]}
    assert plan.bindings[0].pods[0].placement.request_bytes == (2 * GiB,) * 4
    assert plan.projects["a"].allocated_after[0] == pytest.approx(0.5)


def test_reclaim_takes_from_the_lower_priority_project_first() -> None:
    ns = nodes(1, gpus=3)
    plan = cycle(
        ns,
        [project("a", 1), project("low", 0, priority=50, weight=0), project("high", 0, priority=150, weight=0)],
        [
            workload(ns, "h", "high", 1, on=["n1:0"], started=5),
            workload(ns, "l", "low", 1, on=["n1:1"], started=1),
            workload(ns, "h2", "high", 1, on=["n1:2"], started=9),
            workload(ns, "p", "a", 1),
        ],
    )
    assert evicted(plan) == {"l"}


def test_over_quota_idle_gpus_go_by_weight_then_back_by_reclaim_next_cycle() -> None:
    # Cycle 1: team-b (weight 1) takes the idle GPUs. Cycle 2: team-a submits within its
    # deserved quota and reclaims exactly what it needs; team-b stays at its fair share.
    ns = nodes(1, gpus=4)
    projects = [project("team-a", 2), project("team-b", 2)]
    first = cycle(ns, projects, [workload(ns, f"b{i}", "team-b", 1, created=i) for i in range(4)])
    assert len(first.bindings) == 4
    running = [
        workload(ns, b.workload_id, "team-b", 1, on=[f"{b.pods[0].placement.node}:{b.pods[0].placement.devices[0]}"],
                 started=float(i))
        for i, b in enumerate(first.bindings)
    ]
    second = cycle(ns, projects, [*running, workload(ns, "a1", "team-a", 1, pods=2)])
    assert len(second.evictions) == 2 and second.binding("a1") is not None
    assert second.projects["team-b"].allocated_after[0] == pytest.approx(2)
    # Third cycle on the result: nothing more to do, nobody evicted back.
    survivors = [w for w in running if w.id not in second.evicted]
    a1 = second.binding("a1")
    assert a1 is not None
    placed = workload(ns, "a1", "team-a", 1, pods=2, on=[f"{p.placement.node}:{p.placement.devices[0]}" for p in a1.pods])
    third = cycle(ns, projects, [*survivors, placed, *(workload(ns, e, "team-b", 1) for e in second.evicted)])
    assert third.evictions == () and third.bindings == ()
    assert {w.kind for w in third.waiting} == {"fair-share"}


def test_deserved_quota_is_reclaimed_even_when_fair_shares_are_fractional() -> None:
    # Shares: a 1, b 0.5, c 0.5. Taking a whole GPU from b or c leaves it below its fair share
    # (0 < 0.5), but a only takes back its deserved quota, and b and c deserve 0.
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 0), project("c", 0)],
        [
            workload(ns, "b1", "b", 1, on=["n1:0"], started=1),
            workload(ns, "c1", "c", 1, on=["n2:0"], started=2),
            workload(ns, "b2", "b", 1),
            workload(ns, "c2", "c", 1),
            workload(ns, "a1", "a", 1),
        ],
    )
    assert plan.projects["b"].fair_share[0] == pytest.approx(0.5)
    assert bound(plan) == {"a1": ["n2:0"]} and evicted(plan) == {"c1"}
    assert "stays at or above its deserved quota (0 GPUs)" in plan.evictions[0].reason
