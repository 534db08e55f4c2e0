"""Applying a plan to the workloads it was made for, and the GPUs a placement holds (the
cycle's property tests share them)."""

from __future__ import annotations

from tessera.core.cycle import Plan, Snapshot
from tessera.core.state import ClusterState, Placement


def apply(snap: Snapshot, plan: Plan) -> ClusterState:
    """The cluster after the plan; ``assign`` refuses any over-commitment."""
    state = ClusterState(snap.nodes)
    gone = {e.workload_id for e in plan.evictions if not e.pods}
    shrunk = {(e.workload_id, i) for e in plan.evictions for i in e.pods}
    moved = {(m.workload_id, m.pod): m.target for m in plan.moves}
    by_id = {w.id: w for w in snap.workloads}
    for m in plan.moves:
        assert m.source == by_id[m.workload_id].placements[m.pod]
        assert (m.source.node, m.source.devices) != (m.target.node, m.target.devices)
        assert m.workload_id not in gone and by_id[m.workload_id].is_preemptible
        assert all(r.gpu.shared for r in by_id[m.workload_id].pods)
    for w in snap.workloads:
        if w.id in gone:
            continue
        for i, p in enumerate(w.placements):
            if p is not None and (w.id, i) not in shrunk:
                state.assign(f"{w.id}#{i}", moved.get((w.id, i), p))
    for b in plan.bindings:
        for pb in b.pods:
            state.assign(f"{b.workload_id}#{pb.pod}", pb.placement)
    return state


def gpus(state: ClusterState, p: Placement) -> float:
    if p.exclusive:
        return float(len(p.devices))
    mem = state.by_name[p.node].dev_memory
    return sum(b / mem[d] for d, b in zip(p.devices, p.request_bytes, strict=True))
