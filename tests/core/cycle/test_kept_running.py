"""The candidates preempt and consolidate keep (``cycle.kept_running``): consolidate's key is
the GPUs of a workload's spec placements, whatever the cycle has done to its pods since; the
kept quota vector of a pod stands in for ``placement_vector`` only while the pod is where its
spec puts it (the whole index is compared with a fresh one after and during every warm cycle
in tests/core/cycle/test_warm.py)."""

from __future__ import annotations

from tessera.core.cycle import CycleConfig, Snapshot
from tessera.core.cycle.kept_running import KeptRunning, _spec_gpus
from tessera.core.cycle.session import Session, Statement

from .scenario import nodes, placement, project, request, workload


def _straight(session: Session, wid: str) -> float:
    total = 0.0
    for p in session.workloads[wid].spec.placements:
        if p is not None:
            total = total + session.quota.placement_vector(p)[0]
    return total


def test_the_gpus_of_the_spec_placements_whatever_the_cycle_did_to_the_pods() -> None:
    small = nodes(1, gpus=2, memory_gib=16, prefix="s")
    big = nodes(1, gpus=2, memory_gib=32, prefix="b")
    ns = small + big
    w = workload(ns, "w", "a", memory_gib=8, pods=2, on=["s1:0", "s1:1"], started=0.0)
    x = workload(ns, "x", "a", memory_gib=8, on=["b1:1"], started=0.0)
    snap = Snapshot(tuple(ns), (project("a", 4),), (w, x), 1000.0)
    session = Session(snap, CycleConfig())
    ws = session.workloads["w"]
    assert _spec_gpus(session, ws) == _straight(session, "w") == 1.0  # 8 of 16 GiB, twice
    stmt = Statement(session)
    # Pod 1 moves to the 32 GiB GPU (it counts 0.25 there), pod 0 is released and put back.
    session.release_pod(ws, 1)
    session.assign_pod(ws, 1, placement(ns, request(memory_gib=8), "b1:0"))
    assert ws.vector()[0] == 0.75
    assert _spec_gpus(session, ws) == _straight(session, "w") == 1.0
    p0 = session.release_pod(ws, 0)
    assert _spec_gpus(session, ws) == 1.0
    session.assign_pod(ws, 0, p0)
    assert _spec_gpus(session, ws) == 1.0
    session.evict(session.workloads["x"], "preempt", "test", "w")
    assert _spec_gpus(session, session.workloads["x"]) == _straight(session, "x") == 0.25
    kept = KeptRunning(session)  # built mid-cycle: the keys as the cycle began
    assert [(e[0], e[1]) for e in kept.movable] == [(0.25, "x"), (1.0, "w")]
    stmt.discard()
