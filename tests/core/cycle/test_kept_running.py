"""The candidates preempt and consolidate keep (``cycle.kept_running``): consolidate's key is
the GPUs of a workload's spec placements, whatever the cycle has done to its pods since; the
kept quota vector of a pod stands in for ``placement_vector`` only while the pod is where its
spec puts it (the whole index is compared with a fresh one after and during every warm cycle
in tests/core/cycle/test_warm.py); consolidate's node index made from the kept per-node
lists is the one ``NodeIndex`` builds."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping

import pytest

from tessera.bench import cycle as bench
from tessera.bench.changes import advance
from tessera.core.cycle import CycleConfig, Snapshot, run_cycle
from tessera.core.cycle.actions import consolidate, preempt
from tessera.core.cycle.kept_groups import KeptGroups
from tessera.core.cycle.kept_running import KeptRunning, _spec_gpus
from tessera.core.cycle.session import Session, Statement, WorkloadState
from tessera.core.cycle.victims import NodeIndex
from tessera.core.cycle.warm import WarmCycle

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
    assert [(e[0], e[1]) for e in kept.movables(session)] == [(0.25, "x"), (1.0, "w")]
    stmt.discard()


def test_kept_groups_are_the_node_index_consolidate_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consolidate's node index read from the kept per-node lists (``kept_groups``) has the
    nodes, in the same order, and the groups of ``NodeIndex(found)``: on the benchmark's mix,
    cold and over warm cycles (each plan applied), every time consolidate makes its index."""
    real = consolidate._index
    compared = [0]

    def both(movable: tuple[list[WorkloadState], KeptGroups | None], built: list[NodeIndex]) -> NodeIndex:
        found, groups = movable
        if groups is not None and not built:
            eager = NodeIndex(found).by_node
            assert list(groups) == list(eager)
            assert len(groups) == len(eager) and all(n in groups for n in eager)
            assert all(groups[n] == eager[n] for n in reversed(list(eager)))  # any order of reads
            compared[0] += 1
        return real(movable, built)

    monkeypatch.setattr(consolidate, "_index", both)
    config = CycleConfig(policy="fgd", reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    for seed in range(2):
        snap = bench.build(40, 8, 8, 400, 80, seed, 0.5)
        warm = WarmCycle(config)
        plan = warm.run(snap)
        rng = random.Random(seed)
        for step in range(3):
            snap = advance(snap, plan, rng, finish=0.02, arrive=10, prefix=f"a{step}")
            plan = warm.run(snap)
            assert plan == run_cycle(snap, config)
    assert compared[0] > 0


class _Checked(Mapping[str, list[WorkloadState]]):
    """A lazy node index (``KeptGroups``) whose every read is compared with ``NodeIndex``'s
    groups made when the lazy one was."""

    def __init__(self, lazy: Mapping[str, list[WorkloadState]], eager: Mapping[str, list[WorkloadState]],
                 reads: list[int]) -> None:
        self.lazy, self.eager, self.reads = lazy, eager, reads
        self.eager_order = list(eager)

    def __iter__(self) -> Iterator[str]:
        i = 0
        for i, node in enumerate(self.lazy, 1):
            assert node == self.eager_order[i - 1]
            self.reads[0] += 1
            yield node
        assert i == len(self.eager_order)  # read to its end: no node more or less

    def __getitem__(self, node: str) -> list[WorkloadState]:
        group = self.lazy[node]
        assert group == self.eager[node]
        self.reads[1] += 1
        return group

    def __len__(self) -> int:
        assert len(self.lazy) == len(self.eager)
        return len(self.lazy)


def test_preempt_reads_the_node_index_it_would_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node index preempt reads from the kept per-node lists (the node order made a victim
    at a time as its searches read it, each group when first read, while the searches evict
    and put victims back) reads what ``NodeIndex(victims)`` held when it was made: every read
    compared, on the benchmark's mix, cold and over warm cycles (each plan applied)."""
    real = preempt._index
    reads = [0, 0]
    made = [0]

    def checked(kept: KeptRunning, project: str, victims: list[WorkloadState]) -> NodeIndex:
        eager = NodeIndex(victims).by_node
        index = real(kept, project, victims)
        index.by_node = _Checked(index.by_node, eager, reads)
        made[0] += 1
        return index

    monkeypatch.setattr(preempt, "_index", checked)
    config = CycleConfig(policy="fgd", reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    preempted = 0
    made_warm = 0
    for seed in range(2):
        snap = bench.build(60, 8, 6, 600, 150, seed, 0.5)
        warm = WarmCycle(config)
        plan = warm.run(snap)
        preempted += sum(1 for b in plan.bindings if b.action == "preempt")
        rng = random.Random(seed)
        for step in range(3):
            snap = advance(snap, plan, rng, finish=0.05, arrive=40, prefix=f"a{step}")
            before = made[0]
            plan = warm.run(snap)
            made_warm += made[0] - before
            assert warm.warm and plan == run_cycle(snap, config)
    assert preempted > 0 and made_warm > 0 and reads[0] > 0 and reads[1] > 0, (preempted, made, reads)
