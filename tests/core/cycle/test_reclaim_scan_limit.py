"""Reclaim's scan limit counts only the nodes a search can use (docs/scheduling.md, "reclaim").

A reclaim search looks at ``max_victim_nodes`` nodes, in victim preference order, that hold a
victim this reclaimer may take and where the pod would fit with every victim gone. Nodes whose
victims it may not take (their project is at its floor) are not visited at all, so however
many come first in preference order, they cannot stop the search before the node that makes
room; before, they counted towards a limit of ``4 × max_victim_nodes`` nodes scanned.
"""

from __future__ import annotations

from tessera.core.cycle import CycleConfig, Plan, Snapshot, run_cycle

from .scenario import evicted, nodes, project, waiting, workload

NOW = 1000.0


def _plan(untakable_nodes: int, full_nodes: int = 0) -> Plan:
    # x1..xK: 1 GPU each, project X (lower priority: its victims come first) holds K GPUs with
    # a fair share of K - 0.5, so none of them may go (0.5 GPU is all X can give). f1..fF: full
    # of a non-preemptible workload of Y beside a small Y victim: no room there even with it
    # gone. y1: one 1-GPU workload of Y, whose fair share is 0. r asks 1 GPU and deserves it.
    ns = (nodes(untakable_nodes, 1, prefix="x") + nodes(full_nodes, 2, prefix="f")
          + nodes(1, 1, prefix="y"))
    projects = [project("X", untakable_nodes - 0.5, weight=0, priority=50),
                project("Y", 0, weight=0), project("R", 1)]
    workloads = [workload(ns, f"x{k + 1}", "X", 1, on=[f"x{k + 1}:0"]) for k in range(untakable_nodes)]
    for k in range(full_nodes):
        workloads.append(workload(ns, f"g{k + 1}", "Y", 1, cls="inference", on=[f"f{k + 1}:0"]))
        workloads.append(workload(ns, f"h{k + 1}", "Y", 0.5, on=[f"f{k + 1}:1"]))
        workloads.append(workload(ns, f"i{k + 1}", "Y", 0.5, cls="inference", on=[f"f{k + 1}:1"]))
    workloads += [workload(ns, "y", "Y", 1, on=["y1:0"]), workload(ns, "r", "R", 1, created=1.0)]
    snap = Snapshot(tuple(ns), tuple(projects), tuple(workloads), NOW)
    return run_cycle(snap, CycleConfig(reclaim_min_runtime=60.0, max_victim_nodes=1))


def test_nodes_with_nothing_takeable_do_not_use_up_the_scan() -> None:
    plan = _plan(untakable_nodes=6)
    shares = {name: s.fair_share[0] for name, s in plan.projects.items()}
    assert shares["X"] == 5.5 and shares["Y"] == 0, shares  # the premise: X may give 0.5
    # Six nodes with X's untakable victims come first; a scan limit counting them (4 × 1)
    # stopped before y1.
    assert evicted(plan) == {"y"}, waiting(plan)
    assert plan.binding("r") is not None


def test_nodes_without_room_even_emptied_do_not_count_either() -> None:
    # f1..f3 hold a victim of Y (h) that this search may take, but even with it gone no GPU is
    # free: they come before y1 in preference order (Y's victims by start time: all equal, then
    # id) and do not count towards the one node the search may look at.
    plan = _plan(untakable_nodes=2, full_nodes=3)
    assert evicted(plan) == {"y"}, waiting(plan)
    assert plan.binding("r") is not None
