"""A session kept between cycles (``WarmCycle``) gives exactly the plan a new session gives,
over random sequences of changes: the last plan applied, finishes, arrivals, and now and then
a node added or a project's quota changed (those build a new session)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.bench import cycle as bench
from tessera.bench.changes import advance
from tessera.core.cycle import CycleConfig, Plan, Quota, Snapshot, Workload, kept_room, run_cycle
from tessera.core.cycle.actions.allocate import gang_demand, shape
from tessera.core.cycle.kept_room import kept_room as KEPT_ROOM
from tessera.core.cycle.kept_running import _KEPT, KeptRunning
from tessera.core.cycle.kept_victims import kept_victims as KEPT_VICTIMS
from tessera.core.cycle.session import Session
from tessera.core.cycle.warm import WarmCycle
from tessera.core.cycle.workload_state import WorkloadState
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.units import GiB
from tests.core.cycle.strategies import PROPERTY, snapshots

NOTHING = Plan((), (), (), (), {})


def _frame_change(snap: Snapshot, kind: str, step: int) -> Snapshot:
    if kind == "node":
        gpus = tuple(GpuDevice(f"x{step}-{i}", i, 32 * GiB, "V100") for i in range(2))
        return replace(snap, nodes=(*snap.nodes, Node(f"x{step}", gpus, cpu_milli=16_000, memory=64 * GiB)))
    first = snap.projects[-1]
    changed = replace(first, gpu=Quota(first.gpu.deserved + 1, None, first.gpu.over_quota_weight))
    return replace(snap, projects=(*snap.projects[:-1], changed))


@settings(PROPERTY, max_examples=60)
@given(snapshots(), st.lists(st.tuples(st.sampled_from([0.0, 0.2, 0.5]), st.integers(0, 3),
                                       st.sampled_from(["", "", "", "node", "project"]), st.booleans()),
                             min_size=1, max_size=4), st.integers(0, 1000))
def test_warm_session_plans_as_a_new_one(case: tuple[Snapshot, CycleConfig],
                                         steps: list[tuple[float, int, str, bool]], seed: int) -> None:
    """A step applies the last plan or not (an adapter that did not get to bind it)."""
    snap, config = case
    rng = random.Random(seed)
    warm = WarmCycle(config)
    plan = warm.run(snap)
    assert plan == run_cycle(snap, config)
    with _refresh_checked():
        _warm_steps(warm, snap, config, plan, rng, steps)


def _warm_steps(warm: WarmCycle, snap: Snapshot, config: CycleConfig, plan: Plan, rng: random.Random,
                steps: list[tuple[float, int, str, bool]]) -> None:
    for step, (finish, arrive, frame, applied) in enumerate(steps):
        snap = advance(snap, plan if applied else NOTHING, rng, finish=finish, arrive=arrive, prefix=f"a{step}")
        if frame:
            snap = _frame_change(snap, frame, step)
        plan = warm.run(snap)
        assert warm.warm == (not frame)
        assert plan == run_cycle(snap, config)
        _kept_as_the_snapshot_has_it(warm, snap)
        _kept_running_is_fresh(warm)
        _kept_reclaim_is_fresh(warm)


def _kept_as_the_snapshot_has_it(warm: WarmCycle, snap: Snapshot) -> None:
    """The session holds the snapshot's workloads in id order (what iterates over them relies
    on it), and the diff's memory names the snapshot's own objects."""
    session = warm._session
    assert session is not None
    assert list(session.workloads) == sorted(w.id for w in snap.workloads)
    assert all(session.workloads[w.id].spec == w for w in snap.workloads)
    assert warm._specs == {w.id: w for w in snap.workloads}
    assert all(warm._specs[w.id] is w for w in snap.workloads)


@pytest.mark.parametrize("policy", ["fgd", "binpack"])
def test_warm_session_plans_as_a_new_one_on_a_bench_cluster(policy: str) -> None:
    """Four cycles of the cycle benchmark's mix (60 nodes), each plan applied to the next."""
    rng = random.Random(3)
    snap = bench.build(nodes=60, running=500, pending=120, seed=11)
    config = CycleConfig(policy=policy, reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    warm = WarmCycle(config)
    plan = warm.run(snap)
    changed = 0
    with _refresh_checked() as seen:
        changed = _bench_steps(warm, snap, config, plan, rng)
    assert changed > 0  # the cycles decided something
    assert seen[1] > 0  # and the kept index had entries both taken out and put in


def _bench_steps(warm: WarmCycle, snap: Snapshot, config: CycleConfig, plan: Plan, rng: random.Random) -> int:
    changed = 0
    for step in range(4):
        snap = advance(snap, plan, rng, finish=0.02, arrive=10, prefix=f"a{step}")
        # Some unchanged workloads as new, equal objects (an adapter that built them again).
        snap = replace(snap, workloads=tuple(replace(w) if i % 7 == step else w for i, w in enumerate(snap.workloads)))
        plan = warm.run(snap)
        assert warm.warm
        cold = run_cycle(snap, config)
        assert plan == cold
        _kept_as_the_snapshot_has_it(warm, snap)
        changed += len(plan.bindings) + len(plan.evictions)
        _kept_facts_are_fresh(warm)
        _kept_reclaim_is_fresh(warm)
    return changed


def _kept_facts_are_fresh(warm: WarmCycle) -> None:
    """What a kept workload remembers across cycles (unplaced pods, gang minimum left, gang
    demand, shape, quota vector, never-fits reason) equals what a fresh look at it gives now."""
    session = warm._session
    assert session is not None
    for ws in session.workloads.values():
        fresh = WorkloadState(ws.spec, ws.chain)
        fresh.placements[:] = ws.placements
        assert ws.unplaced() == fresh.unplaced()
        assert ws.required() == fresh.required()
        assert gang_demand(session, ws) == gang_demand(session, fresh)
        assert shape(ws) == shape(fresh)
        total = (0.0, 0.0, 0.0)
        for v in ws.pod_vectors:
            if v is not None:
                total = (total[0] + v[0], total[1] + v[1], total[2] + v[2])
        assert ws.vector() == total
        if ws.never is not None and ws.never[0] == ws.unplaced():
            assert ws.never[1] == session.waiting.never.gang(fresh, session.placer, session.mig)
    _counted_as_a_new_session_counts(warm)
    _kept_running_is_fresh(warm)


def _counted_as_a_new_session_counts(warm: WarmCycle) -> None:
    """The kept ledger (sums changed only by workloads entering and leaving) started the cycle
    with what a new session counts, to the last bit, and with the correctly rounded sum
    (``math.fsum``) of every placed pod's quota under each project."""
    session, snap = warm._session, warm._last
    assert session is not None and snap is not None
    kept = session.quota.allocated_before
    assert kept == Session(snap, warm.config).quota.allocated_before
    for name in session.tree.order:
        under = [ws for ws in session.workloads.values() if name in ws.chain]
        for r in range(3):
            assert kept[name][r] == math.fsum(v[r] for ws in under for v in ws.pod_vectors if v is not None)


def test_what_reclaim_keeps_between_cycles_is_what_it_would_work_out_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm cycles on a cluster where reclaim evicts (the fast-path test's mix and scan
    limit): each plan equals a new session's, and after each cycle every room and victim entry
    reclaim kept that a next cycle would use equals a fresh one; later cycles used the kept
    rooms (else this proves nothing)."""
    calls = {"room": 0, "fresh": 0}
    real_room, real_fresh = kept_room.KeptRoom.room, kept_room.fresh_room

    def room(self: kept_room.KeptRoom, *args: Any) -> Any:
        calls["room"] += 1
        return real_room(self, *args)

    def fresh(*args: Any) -> Any:
        calls["fresh"] += 1
        return real_fresh(*args)

    monkeypatch.setattr(kept_room.KeptRoom, "room", room)
    monkeypatch.setattr(kept_room, "fresh_room", fresh)
    rng = random.Random(5)
    snap = bench.build(nodes=60, gpus=8, projects=10, running=600, pending=180, seed=7, spread=0.2)
    config = CycleConfig(reclaim_min_runtime=60.0, preempt_min_runtime=60.0, max_victim_nodes=3)
    warm = WarmCycle(config)
    plan = warm.run(snap)
    evicted = kept = 0
    for step in range(3):
        snap = advance(snap, plan, rng, finish=0.02, arrive=20, prefix=f"a{step}")
        calls["room"] = calls["fresh"] = 0
        plan = warm.run(snap)
        warm_calls = dict(calls)
        assert warm.warm
        assert plan == run_cycle(snap, config)
        evicted += sum(1 for e in plan.evictions if e.action == "reclaim")
        kept += _kept_reclaim_is_fresh(warm)
    assert evicted > 0 and kept > 0
    assert warm_calls["fresh"] < warm_calls["room"], warm_calls  # the last cycle used kept rooms


def _kept_reclaim_is_fresh(warm: WarmCycle) -> int:
    """What reclaim keeps between cycles (kept_room, kept_victims) equals what it would work
    out afresh now, wherever it would be used; how many entries would be used."""
    session = warm._session
    assert session is not None
    used = 0
    room = KEPT_ROOM.get(session)
    if room is not None:
        assert room.stale(session) == []
        used += len(room.seen)
    facts = KEPT_VICTIMS.get(session)
    if facts is not None:
        assert facts.stale(session) == []
        used += len(facts.facts)
    return used


def _kept_running_is_fresh(warm: WarmCycle) -> None:
    """The running, preemptible workloads preempt and consolidate keep between cycles
    (kept_running) equal an index built afresh from the session now."""
    session = warm._session
    assert session is not None
    kept = _KEPT.get(session)
    if kept is None:
        return  # no action asked for it yet
    kept.refresh(session)
    _same_index(kept, KeptRunning(session), session)


def _same_index(kept: KeptRunning, fresh: KeptRunning, session: Session) -> None:
    assert kept.entries == fresh.entries
    assert kept._where == fresh._where
    assert {p: g for p, g in kept.by_project.items() if g} == fresh.by_project
    # consolidate's lists, once it asked (made afresh on the new index)
    assert kept.movable_made or not (kept.movable or kept.movable_entry or kept.movable_nodes)
    if kept.movable_made:
        assert kept.movable == fresh.movables(session)
    assert kept.movable_entry == fresh.movable_entry
    assert kept.movable_nodes == fresh.movable_nodes
    assert {n: g for n, g in kept.movable_on.items() if g} == fresh.movable_on
    assert {m: g for m, g in kept.timed.items() if g} == fresh.timed
    # preempt's per-node lists, for each project it asked for (made afresh on the new index)
    for p, on in kept.preempt_on.items():
        assert {n: g for n, g in on.items() if g} == fresh.on_nodes(p), p
    assert kept.preempt_nodes == fresh.preempt_nodes


@contextmanager
def _refresh_checked() -> Iterator[list[int]]:
    """While open, every ``KeptRunning.refresh`` with changes to apply applies them both ways
    (filter and merge; binary searches, on a copy), and both must equal an index built afresh
    from the session there and then (mid-cycle: the GPUs of the spec's placements are worked
    out whatever the cycle did to the workload). Yields [refreshes checked, of which with
    entries both taken out and put in]."""
    real = KeptRunning.refresh
    seen = [0, 0]

    def checked(self: KeptRunning, session: Session, batch: bool | None = None) -> None:
        if not self.dirty:
            return
        twin = KeptRunning.__new__(KeptRunning)
        twin.entries, twin._where, twin._minimum = dict(self.entries), dict(self._where), {}
        twin.movable_made, twin.movable_entry = self.movable_made, dict(self.movable_entry)
        twin.by_project = {p: list(g) for p, g in self.by_project.items()}
        twin.movable = list(self.movable)
        twin.movable_nodes = dict(self.movable_nodes)
        twin.movable_on = {n: list(g) for n, g in self.movable_on.items()}
        twin.timed = {m: list(g) for m, g in self.timed.items()}
        twin.preempt_on = {p: {n: list(g) for n, g in on.items()} for p, on in self.preempt_on.items()}
        twin.preempt_nodes = dict(self.preempt_nodes)
        twin.dirty = set(self.dirty)
        before = len(self.entries)
        removed = sum(1 for wid in self.dirty if wid in self.entries)
        real(self, session, True)
        real(twin, session, False)
        fresh = KeptRunning(session)
        _same_index(self, fresh, session)
        _same_index(twin, fresh, session)
        seen[0] += 1
        seen[1] += removed > 0 and len(self.entries) > before - removed

    KeptRunning.refresh = checked  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        KeptRunning.refresh = real  # type: ignore[method-assign]


def test_a_refused_snapshot_raises_as_run_cycle_does_and_the_next_one_runs() -> None:
    snap = bench.build(nodes=4, running=20, pending=5, seed=2)
    warm = WarmCycle()
    warm.run(snap)
    running = next(w for w in snap.workloads if w.running)
    clash = replace(running, id="zz-clash", started_at=snap.now)  # the same devices again
    bad = replace(snap, workloads=(*snap.workloads, clash))
    with pytest.raises(InvalidRequest) as warm_error:
        warm.run(bad)
    with pytest.raises(InvalidRequest) as cold_error:
        run_cycle(bad)
    assert warm_error.value.field == cold_error.value.field
    assert warm.run(snap) == run_cycle(snap)


class _Cordoned:
    """Like the Kubernetes adapter's constraint: equal for equal pods, answering from this
    cycle's view of the cluster (here: the set of cordoned nodes)."""

    dynamic = False

    def __init__(self, cordoned: frozenset[str]) -> None:
        self.cordoned = cordoned

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Cordoned)

    def __hash__(self) -> int:
        return 1

    def allows(self, node: Node) -> bool:
        return node.name not in self.cordoned

    def score(self, node: Node) -> float:
        return 0.0

    def admits(self, node: Node, placed: object) -> bool:
        return True

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        n = sum(1 for x in nodes if x.name in self.cordoned)
        return f"{n} node(s) were unschedulable" if n else ""


def test_a_constraint_that_compares_equal_but_answers_from_a_new_view_is_asked_again() -> None:
    """A node cordoned between two cycles: the pending pod's constraint equals last cycle's,
    but the warm session must not keep the old answer (the placer's per-constraint caches
    are dropped, and such a workload is new unless it is the same object)."""
    snap = bench.build(nodes=4, running=0, pending=0, seed=2)
    request = snap.workloads[0].pods[0] if snap.workloads else None
    from tessera.core.cycle import Workload
    request = ResourceRequest(GpuRequest.whole(1), 1000, GiB)

    def pending(cordoned: frozenset[str]) -> Workload:
        return Workload("w", "team-01", (request,), constraints=(_Cordoned(cordoned),))

    first = replace(snap, workloads=(pending(frozenset({"node-0001", "node-0002", "node-0003"})),))
    warm = WarmCycle()
    plan = warm.run(first)
    assert plan.bindings[0].pods[0].placement.node == "node-0000"
    # Not applied (the bind failed); meanwhile node-0000 is cordoned and the others are not.
    second = replace(first, workloads=(pending(frozenset({"node-0000"})),), now=first.now + 1)
    plan = warm.run(second)
    assert warm.warm and plan == run_cycle(second)
    assert plan.bindings[0].pods[0].placement.node != "node-0000"


def test_kept_facts_follow_every_placement_change() -> None:
    """A pod placed, then the statement discarded: the gang's unplaced pods, gang minimum left
    and demand follow each change (they are kept on the workload between changes)."""
    from tessera.core.cycle.session import Session, Statement
    from tessera.core.state import Placement

    snap = bench.build(nodes=4, running=0, pending=0, seed=2)
    request = ResourceRequest(GpuRequest.whole(1), 1000, GiB)
    gang = Workload.gang("g", "team-01", request, size=4, min_members=3)
    snap = replace(snap, workloads=(gang,))
    session = Session(snap, CycleConfig())
    ws = session.workloads["g"]

    def check() -> None:
        fresh = WorkloadState(ws.spec, ws.chain)
        fresh.placements[:] = ws.placements
        assert (ws.unplaced(), ws.required(), gang_demand(session, ws), shape(ws)) == (
            fresh.unplaced(), fresh.required(), gang_demand(session, fresh), shape(fresh))

    check()
    assert gang_demand(session, ws)[0] == 3.0
    stmt = Statement(session)
    found = session.placer.place(request, explain=False)
    assert isinstance(found, Placement)
    session.assign_pod(ws, 0, found)
    check()
    assert ws.unplaced() == (1, 2, 3) and ws.required() == 2 and gang_demand(session, ws)[0] == 2.0
    stmt.discard()
    check()
    assert ws.unplaced() == (0, 1, 2, 3) and gang_demand(session, ws)[0] == 3.0


def test_the_preemption_minimum_runtime_ends_on_the_clock_of_each_warm_cycle() -> None:
    """A kept session: the victim protected at 1000 s (started 995 s, minimum 30 s) is
    preempted at exactly 1025 s, protected again if the clock goes back, and a finished one
    is no victim (the kept index drops it)."""
    from .scenario import nodes, project, workload

    ns = nodes(1, gpus=1)
    victim = workload(ns, "t", "a", 1, on=["n1:0"], started=995)
    other = workload(ns, "u", "a", 1)  # a pending one: a finished victim's place in the index
    waiting = workload(ns, "inf", "a", 1, cls="inference")
    config = CycleConfig(preempt_min_runtime=30)
    warm = WarmCycle(config)
    snap = Snapshot(tuple(ns), (project("a", 1),), (victim, other, waiting), 1000.0)
    for now, workloads, evicted in [(1000.0, (victim, other, waiting), set()),
                                    (1024.999, (victim, other, waiting), set()),
                                    (1025.0, (victim, other, waiting), {"t"}),
                                    (1010.0, (victim, other, waiting), set()),
                                    (1100.0, (other, waiting), set())]:
        snap = replace(snap, workloads=workloads, now=now)
        plan = warm.run(snap)
        assert warm.warm or now == 1000.0
        assert plan == run_cycle(snap, config)
        assert {e.workload_id for e in plan.evictions} == evicted
        _kept_running_is_fresh(warm)
