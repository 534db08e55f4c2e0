"""Property tests: random clusters, project trees and workloads through whole cycles."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cycle import CycleConfig, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.projects import ProjectTree
from tessera.core.state import Placement
from tessera.core.units import GiB
from tessera.core.workloads import priority_class
from tests.core.cycle.plan_helpers import apply, gpus
from tests.core.cycle.strategies import PROPERTY, snapshots

EPS = 1e-6


@PROPERTY
@given(snapshots())
def test_cycle_invariants(case: tuple[Snapshot, CycleConfig]) -> None:
    snap, config = case
    plan = run_cycle(snap, config)
    by_id = {w.id: w for w in snap.workloads}
    tree = ProjectTree(snap.projects)

    # No device over-committed, no shared whole GPU (ClusterState.assign refuses both).
    final = apply(snap, plan)
    for ns in final.nodes:
        assert all(0 <= u <= m for u, m in zip(ns.dev_used, ns.dev_memory, strict=True))
        assert ns.free_cpu >= 0 and ns.free_mem >= 0

    # Determinism.
    assert run_cycle(snap, config) == plan

    # Fair shares never sum above what their parent divides.
    capacity = float(sum(len(n.gpus) for n in snap.nodes))
    for parent, kids in tree.children.items():
        whole = capacity if parent is None else plan.projects[parent].fair_share[0]
        assert sum(plan.projects[k].fair_share[0] for k in kids) <= whole + EPS

    # Deserved quota is honoured when requested (top level, deserved not over-subscribed).
    top = tree.children[None]
    if sum(tree[p].gpu.deserved for p in top) <= capacity:
        for p in top:
            q = tree[p].gpu
            asked = min(plan.projects[p].requested[0], q.limit_amount)
            assert plan.projects[p].fair_share[0] >= min(q.deserved, asked) - EPS

    # Every pending workload is bound (with its gang) or says why it waits.
    waiting = {w.workload_id: w for w in plan.waiting}
    for w in snap.workloads:
        unplaced = [i for i in range(len(w.pods)) if not w.placements or w.placements[i] is None]
        if not unplaced:
            continue
        b = plan.binding(w.id)
        placed_before = len(w.pods) - len(unplaced)
        if b is not None:
            assert placed_before + len(b.pods) >= w.gang_min
        if b is None or placed_before + len(b.pods) < len(w.pods):
            assert w.id in waiting and waiting[w.id].reason

    # Evictions: only preemptible, past their minimum runtime, and only for a workload placed.
    bound_ids = {b.workload_id for b in plan.bindings}
    for e in plan.evictions:
        victim = by_id[e.workload_id]
        assert victim.running and victim.is_preemptible
        assert not priority_class(victim.priority_class).preemptible or victim.preemptible is not False
        minimum = config.reclaim_min_runtime if e.action == "reclaim" else config.preempt_min_runtime
        assert snap.now - (victim.started_at or 0) >= minimum
        assert e.for_workload in bound_ids
        if e.action == "preempt":
            assert victim.project == by_id[e.for_workload].project
            assert victim.priority_value < by_id[e.for_workload].priority_value
        else:
            assert victim.project != by_id[e.for_workload].project

    # Reclaim evicts no more than it places plus what the reclaimer was owed.
    for b in plan.bindings:
        if b.action != "reclaim":
            continue
        placed = sum(gpus(final, pb.placement) for pb in b.pods)
        taken = sum(e.gpus for e in plan.evictions if e.for_workload == b.workload_id)
        status = plan.projects[b.project]
        owed = max(0.0, status.fair_share[0] - status.allocated_before[0])
        assert taken <= placed + owed + EPS

    # Reclaim victims' projects keep their fair share, or at least their deserved quota when the
    # reclaimer only took back its own (when nothing else took more from them).
    preempted = {by_id[e.workload_id].project for e in plan.evictions if e.action == "preempt"}
    for e in plan.evictions:
        if e.action == "reclaim" and e.project not in preempted and not plan.moves:
            status = plan.projects[e.project]
            keep = min(status.fair_share[0], tree[e.project].gpu.deserved_amount)
            assert status.allocated_after[0] >= keep - EPS

    # Limits and in-quota rules hold for what the plan adds.
    usage: dict[str, float] = {p.name: 0.0 for p in snap.projects}
    usage_np: dict[str, float] = dict(usage)
    before_np: dict[str, float] = dict(usage)
    for w in snap.workloads:
        chain = tree.chain(w.project)
        mine = [p for p in w.placements if p is not None] if w.id not in plan.evicted else []
        b = plan.binding(w.id)
        mine += [pb.placement for pb in b.pods] if b else []
        amount = sum(gpus(final, p) for p in mine)
        amount_before = sum(gpus(final, p) for p in w.placements if p is not None)
        for name in chain:
            usage[name] += amount
            if not w.is_preemptible:
                usage_np[name] += amount
                before_np[name] += amount_before
    for p in snap.projects:
        before = plan.projects[p.name].allocated_before[0]
        assert usage[p.name] <= max(p.gpu.limit_amount, before) + EPS
        assert usage_np[p.name] <= max(p.gpu.deserved_amount, before_np[p.name]) + EPS
        assert math.isclose(usage[p.name], plan.projects[p.name].allocated_after[0], abs_tol=1e-6) or plan.moves


@st.composite
def whole_gpu_worlds(draw: st.DrawFn) -> Snapshot:
    """One-GPU nodes, one-GPU preemptible workloads: no fragmentation, nothing protected."""
    count = draw(st.integers(2, 8))
    node_list = [Node(f"n{k}", (GpuDevice(f"g{k}", 0, 16 * GiB, "V100"),), 8000, 32 * GiB) for k in range(count)]
    n_projects = draw(st.integers(2, 4))
    deserved = [draw(st.integers(0, 3)) for _ in range(n_projects)]
    while sum(deserved) > count:
        deserved[deserved.index(max(deserved))] -= 1
    projects = tuple(
        Project(f"p{i}", Quota(float(d), None, draw(st.sampled_from([0.0, 1.0, 2.0]))), priority=draw(st.sampled_from([100, 200])))
        for i, d in enumerate(deserved)
    )
    one = ResourceRequest(GpuRequest.whole(1))
    workloads = []
    free = list(range(count))
    for i in range(draw(st.integers(0, count))):
        node = free.pop(draw(st.integers(0, len(free) - 1)))
        p = node_list[node]
        placement = Placement(p.name, (0,), (16 * GiB,), (16 * GiB,), True)
        workloads.append(Workload(f"r{i}", f"p{draw(st.integers(0, n_projects - 1))}", (one,), started_at=float(i), placements=(placement,)))
    for i in range(draw(st.integers(0, 2 * count))):
        workloads.append(Workload(f"q{i}", f"p{draw(st.integers(0, n_projects - 1))}", (one,), created_at=float(i)))
    return Snapshot(tuple(node_list), projects, tuple(workloads), now=1000.0)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(whole_gpu_worlds())
def test_deserved_quota_is_honoured_when_requested(snap: Snapshot) -> None:
    """Without fragmentation or protected workloads, one cycle gives every project at least
    min(deserved, what it asks), rounded down to whole GPUs."""
    plan = run_cycle(snap, CycleConfig())
    apply(snap, plan)
    for p in snap.projects:
        status = plan.projects[p.name]
        assert status.allocated_after[0] >= math.floor(min(p.gpu.deserved, status.requested[0]) + EPS) - EPS, (p.name, status)
