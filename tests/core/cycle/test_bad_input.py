"""Bad snapshots are refused whole, with the field and the rule named."""

from __future__ import annotations

import pytest

from tessera.core.cycle import CycleConfig, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.errors import InvalidRequest
from tessera.core.projects import ProjectTree

from .scenario import cycle, nodes, project, request, workload


def refused(projects: list[Project]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        ProjectTree(projects)
    return err.value


def test_limit_below_deserved() -> None:
    e = refused([Project("team-a", Quota(deserved=2, limit=1))])
    assert e.field == "projects.team-a.gpu.limit"
    assert "at least the deserved quota 2" in str(e)
    e = refused([Project("team-a", cpu=Quota(deserved=4000, limit=1000))])
    assert e.field == "projects.team-a.cpu.limit"


def test_cycle_in_the_tree() -> None:
    e = refused([Project("a", parent="c"), Project("b", parent="a"), Project("c", parent="b")])
    assert e.field == "projects.a.parent"
    assert "cycle" in e.rule and "a -> c -> b -> a" in e.rule
    e = refused([Project("self", parent="self")])
    assert e.field == "projects.self.parent"


def test_unknown_parent_and_duplicates() -> None:
    assert refused([Project("a", parent="nope")]).field == "projects.a.parent"
    assert refused([Project("a"), Project("a")]).field == "projects.a"


@pytest.mark.parametrize(
    ("quota", "field"),
    [
        (Quota(deserved=-2), "projects.p.gpu.deserved"),
        (Quota(deserved=float("nan")), "projects.p.gpu.deserved"),
        (Quota(deserved=1, over_quota_weight=-1), "projects.p.gpu.over_quota_weight"),
        (Quota(deserved=-1, limit=4), "projects.p.gpu.limit"),
        (Quota(deserved=0, limit=-1), "projects.p.gpu.limit"),
    ],
)
def test_bad_quota_values(quota: Quota, field: str) -> None:
    assert refused([Project("p", quota)]).field == field


def test_workload_naming_an_unknown_project_refuses_the_whole_cycle() -> None:
    ns = nodes(1, gpus=2)
    good = workload(ns, "ok", "team-a", 1)
    bad = workload(ns, "lost", "team-z", 1)
    with pytest.raises(InvalidRequest) as err:
        cycle(ns, [project("team-a", 1)], [good, bad])
    assert err.value.field == "workloads.lost.project" and "does not exist" in err.value.rule
    # Nothing was decided for the good one either; without the bad one it is placed.
    assert cycle(ns, [project("team-a", 1)], [good]).binding("ok") is not None


def test_gang_minimum_above_its_size() -> None:
    ns = nodes(1, gpus=2)
    with pytest.raises(InvalidRequest) as err:
        cycle(ns, [project("a", 1)], [workload(ns, "g", "a", 1, pods=2, min_members=3)])
    assert err.value.field == "workloads.g.min_members"
    assert "gang's size of 2" in err.value.rule
    with pytest.raises(InvalidRequest) as err:
        cycle(ns, [project("a", 1)], [workload(ns, "g", "a", 1, pods=2, min_members=0)])
    assert err.value.field == "workloads.g.min_members"


def test_other_workload_errors() -> None:
    ns = nodes(1, gpus=1)
    r = request(0.5)
    cases = [
        (Workload("w", "a", ()), "workloads.w.pods"),
        (Workload("w", "a", (r,), priority_class="urgent"), "workloads.w.priority_class"),
        (Workload("w", "a", (r, r), placements=(None,)), "workloads.w.placements"),
    ]
    for w, field in cases:
        with pytest.raises(InvalidRequest) as err:
            cycle(ns, [project("a", 1)], [w])
        assert err.value.field == field
    with pytest.raises(InvalidRequest) as err:
        cycle(ns, [project("a", 1)], [workload(ns, "w", "a", 1), workload(ns, "w", "a", 1)])
    assert err.value.field == "workloads.w"


def test_running_placements_that_overcommit_a_device() -> None:
    ns = nodes(1, gpus=1)
    with pytest.raises(InvalidRequest) as err:
        cycle(
            ns,
            [project("a", 1)],
            [workload(ns, "x", "a", 0.75, on=["n1:0"]), workload(ns, "y", "a", 0.5, on=["n1:0"])],
        )
    assert err.value.field == "workloads.y.placements[0]"
    assert "too little memory" in err.value.rule


def test_unknown_action() -> None:
    snap = Snapshot(tuple(nodes(1)), (Project("a"),), ())
    with pytest.raises(InvalidRequest) as err:
        run_cycle(snap, CycleConfig(actions=("allocate", "shuffle")))
    assert err.value.field == "config.actions"


def test_a_request_no_node_can_hold_waits_as_unschedulable_instead_of_failing_the_cycle() -> None:
    ns = nodes(1, gpus=2)
    plan = cycle(ns, [project("a", 4)], [workload(ns, "big", "a", 4), workload(ns, "ok", "a", 1)])
    w = plan.waiting_for("big")
    assert w is not None and w.kind == "unschedulable" and "the largest node has 2" in w.reason
    assert plan.binding("ok") is not None


def test_more_cpu_than_any_node_has_waits_as_unschedulable() -> None:
    ns = nodes(1, gpus=1)
    plan = cycle(ns, [project("a", 1)], [workload(ns, "w", "a", req=request(0.5, cpu=100_000))])
    w = plan.waiting_for("w")
    assert w is not None and w.kind == "unschedulable"
    assert w.reason == "no node can ever hold it: it asks 100 CPU, the largest node has 64"
