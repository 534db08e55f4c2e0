"""The session's statements: a discarded one leaves no trace."""

from __future__ import annotations

from tessera.core.cycle import CycleConfig, Snapshot
from tessera.core.cycle.session import Session, Statement

from .scenario import nodes, project, workload


def fingerprint(s: Session) -> object:
    return (
        {k: tuple(v) for k, v in s.quota.alloc.items()},
        {k: tuple(v) for k, v in s.quota.alloc_np.items()},
        [ns.signature() for ns in s.state.nodes],
        dict(s.state.allocations),
        {wid: (tuple(w.placements), w.evicted, tuple(w.bound), w.vector()) for wid, w in s.workloads.items()},
        dict(s.bindings),
        dict(s.evictions),
        dict(s.moves),
    )


def test_discard_restores_state_accounting_and_plan() -> None:
    ns = nodes(2, gpus=2)
    snap = Snapshot(
        tuple(ns),
        (project("a", 2), project("b", 2)),
        (
            workload(ns, "r1", "b", 1, on=["n1:0"]),
            workload(ns, "r2", "b", 0.5, on=["n1:1"], cls="inference"),
            workload(ns, "p1", "a", 1, pods=2),
        ),
    )
    s = Session(snap, CycleConfig())
    before = fingerprint(s)
    outer = Statement(s)
    s.evict(s.workloads["r1"], "reclaim", "test", "p1")
    inner = Statement(s)
    placed, _, _ = s.place_pods(s.workloads["p1"])
    assert len(placed) == 2
    s.record_binding(s.workloads["p1"], placed, "reclaim", "test", ["r1"])
    inner.commit()
    moved = s.release_pod(s.workloads["r2"], 0)
    found = s.placer.place(s.workloads["r2"].spec.pods[0], explain=False)
    s.assign_pod(s.workloads["r2"], 0, found)  # type: ignore[arg-type]
    s.record_move(s.workloads["r2"], 0, moved, found, "test")  # type: ignore[arg-type]
    assert fingerprint(s) != before
    outer.discard()
    assert fingerprint(s) == before
    # The placer follows the rollback: it decides as a fresh session on the same snapshot does.
    fresh = Session(snap, CycleConfig())
    assert s.place_pods(s.workloads["p1"]) == fresh.place_pods(fresh.workloads["p1"])


def test_commit_keeps_and_restore_puts_a_victim_back() -> None:
    ns = nodes(1, gpus=2)
    snap = Snapshot(tuple(ns), (project("a", 2),), (workload(ns, "r1", "a", 1, on=["n1:0"]),))
    s = Session(snap, CycleConfig())
    stmt = Statement(s)
    s.evict(s.workloads["r1"], "preempt", "test", "x")
    assert s.quota.alloc["a"][0] == 0
    assert s.restore(s.workloads["r1"])
    assert s.quota.alloc["a"][0] == 1 and "r1" not in s.evictions
    stmt.commit()
    assert s.state.allocations["r1#0"].devices == (0,)
