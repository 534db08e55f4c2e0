"""Reclaim's shortcuts decide nothing: the same plan with and without them.

``cheapest_node`` visits only the nodes the candidate lists offer (``TakeableNodes``: those
holding a victim of a size the search may take), skips nodes marked as having no room for the
request even with every victim gone, memoises per node state what they would have free
then (``NodeIndex.no_room_even_empty``), and passes (only counting it) a node where the request
would not fit even with every victim this search may take alone gone, without taking them one
by one (``NodeIndex.no_room_taking``, memoised per node state and set of victims), and
memoises both tests' outcome per node state, request and set of victims
(``NodeIndex.room_verdict``). Each must leave every decision as the full scan makes
it (every node of the index, asking ``allow`` per victim, the room worked out afresh and
nothing marked or memoised), so the plans of whole cycles on seeded synthetic clusters (the
``bench.cycle`` mix: fractions, memory requests, whole GPUs, gangs, over- and under-quota
projects) must be equal, with each shortcut taken.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tessera.core.cycle.actions.preempt as preempt
import tessera.core.cycle.takeable as takeable
import tessera.core.cycle.victims as victims
from tessera.bench.cycle import build
from tessera.core.cycle import CycleConfig, Plan, Snapshot, run_cycle
from tessera.core.cycle.room_fit import fits_after, free_all_on
from tessera.core.cycle.scan_prefix import LOOKED, ScanPrefix

CONFIG = CycleConfig(reclaim_min_runtime=60.0, preempt_min_runtime=60.0, max_victim_nodes=3)
"""A scan limit of 3 × 4 nodes binds on these small clusters as the default's 4 × 64 does at
5,000 nodes, so the pruning and no-room marks (which decide what the limit counts) matter."""


def _snapshots() -> Iterator[tuple[str, Snapshot]]:
    for seed in (1, 7, 11):
        for nodes, spread in ((40, 0.2), (60, 1.0)):
            yield f"seed{seed}-{nodes}n-spread{spread}", build(
                nodes=nodes, gpus=8, projects=10, running=nodes * 10, pending=nodes * 3,
                seed=seed, spread=spread)


@pytest.fixture(scope="module")
def snapshots() -> list[tuple[str, Snapshot]]:
    return list(_snapshots())


def _plan(snapshot: Snapshot) -> Plan:
    return run_cycle(snapshot, CONFIG)


def test_candidate_lists_marks_and_room_memo_leave_the_plan_as_the_full_scan(
        snapshots: list[tuple[str, Snapshot]], monkeypatch: pytest.MonkeyPatch) -> None:
    original_scan = victims.cheapest_node
    original_room = victims.NodeIndex.no_room_even_empty
    original_candidates = takeable.LazyUnion.from_position
    original_taking = victims.NodeIndex.no_room_taking
    original_verdict = victims.NodeIndex.room_verdict
    used = {"offered": 0, "memo_hits": 0, "room_fast": 0, "room_full": 0, "taking_no_room": 0,
            "taking_full": 0, "verdict_hits": 0}
    run = {"mode": "fast"}

    def offered(self, start):  # type: ignore[no-untyped-def]
        for node in original_candidates(self, start):
            used["offered"] += 1
            yield node

    def counting_room(self, session, request, node):  # type: ignore[no-untyped-def]
        used["room_" + run["mode"]] += 1
        seen = self.room_seen.get(node)
        if seen is not None and seen.sig is session.state.by_name[node].sig and request in seen.answers:
            used["memo_hits"] += 1
        return original_room(self, session, request, node)

    def fresh_room(self, session, request, node):  # type: ignore[no-untyped-def]
        self.room_seen.clear()
        self.no_room.clear()
        if self.kept is not None:  # nor what the session kept (kept_room)
            self.kept.seen.clear()
        return counting_room(self, session, request, node)

    def taking(self, session, request, node, mask):  # type: ignore[no-untyped-def]
        no_room = original_taking(self, session, request, node, mask)
        used["taking_no_room" if run["mode"] == "fast" else "taking_full"] += no_room
        return no_room

    def verdict(self, session, request, key, node, scope, mask_of):  # type: ignore[no-untyped-def]
        if run["mode"] == "full":
            self.verdicts.clear()
        memo = self.verdicts.get(node)
        if memo is not None and memo[0] is session.state.by_name[node].sig and (key, scope) in memo[1]:
            used["verdict_hits"] += 1
        return original_verdict(self, session, request, key, node, scope, mask_of)

    def full_scan(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["takes_up_to"] = None
        return original_scan(*args, **kwargs)

    monkeypatch.setattr(takeable.LazyUnion, "from_position", offered)
    monkeypatch.setattr(victims.NodeIndex, "no_room_taking", taking)
    monkeypatch.setattr(victims.NodeIndex, "room_verdict", verdict)
    for name, snap in snapshots:
        run["mode"] = "fast"
        monkeypatch.setattr(victims.NodeIndex, "no_room_even_empty", counting_room)
        fast = _plan(snap)
        run["mode"] = "full"
        monkeypatch.setattr(victims.NodeIndex, "no_room_even_empty", fresh_room)
        monkeypatch.setattr(victims, "cheapest_node", full_scan)
        full = _plan(snap)
        monkeypatch.setattr(victims, "cheapest_node", original_scan)
        assert fast.evictions, name  # reclaim had work to do
        assert fast == full, name
    # Each shortcut was taken (else this test would prove nothing): the lists offered nodes,
    # the memo answered, nodes were passed for what the takeable victims alone free (never in
    # the full scan, which takes victims one by one on every node), and the marks and lists
    # spared room tests the full scan made.
    assert used["offered"] > 0 and used["memo_hits"] > 0 and used["verdict_hits"] > 0, used
    assert used["taking_no_room"] > 0 and used["taking_full"] == 0, used
    assert used["room_fast"] < used["room_full"], used


def test_preempt_caches_leave_the_plan_as_building_everything_each_time(
        snapshots: list[tuple[str, Snapshot]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Preempt keeps each (project, priority)'s victim list through the action (less what its
    project's kept attempts evicted or bound) and
    builds its node index on first use, from the kept per-node lists: the same plans as
    filtering the list for every waiting workload and building the index at once with
    ``NodeIndex``."""
    cached = {name: _plan(snap) for name, snap in snapshots}
    monkeypatch.setattr(preempt, "_KEEP_LISTS", False)
    monkeypatch.setattr(preempt, "_KEPT_GROUPS", False)

    def eager(found, build=None):  # type: ignore[no-untyped-def]
        if not found[1]:
            found[1].append(victims.NodeIndex(found[0]))
        return lambda: found[1][0]

    monkeypatch.setattr(preempt, "_lazy", eager)
    preempted = 0
    for name, snap in snapshots:
        plan = _plan(snap)
        assert plan == cached[name], name
        preempted += sum(1 for b in plan.bindings if b.action == "preempt")
    assert preempted > 0  # preemption had work to do


def test_every_room_verdict_is_the_straightforward_computation(
        snapshots: list[tuple[str, Snapshot]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each answer of ``NodeIndex.room_verdict`` (memoised per node state, request and choice of
    candidate lists, which stands for the mask of takeable victims; the room tests' own memos
    behind it) equals what the mask worked out afresh and freeing the victims on the node
    afresh give at that moment: every victim not evicted, then only the mask's victims."""
    original = victims.NodeIndex.room_verdict
    seen = {victims.NO_ROOM: 0, victims.NO_ROOM_TAKING: 0, victims.SCAN: 0,
            victims.NOTHING_TAKEABLE: 0, "hits": 0}

    def fits_with(session, request, node, gone):  # type: ignore[no-untyped-def]
        ns = session.state.by_name[node]
        free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
        tenants, compute = list(ns.dev_tenants), list(ns.dev_compute)
        cpu, mem = free_all_on(node, gone, free, tenants, compute)
        return fits_after(ns, request, free, tenants, ns.free_cpu + cpu, ns.free_mem + mem, compute)

    def checked(self, session, request, key, node, scope, mask_of):  # type: ignore[no-untyped-def]
        memo = self.verdicts.get(node)
        if memo is not None and memo[0] is session.state.by_name[node].sig and (key, scope) in memo[1]:
            seen["hits"] += 1
        got = original(self, session, request, key, node, scope, mask_of)
        mask = mask_of()  # the victims this search may take, worked out afresh
        group = self.by_node[node]
        if not mask:
            expected = victims.NOTHING_TAKEABLE
        elif not fits_with(session, request, node, [v for v in group if not v.evicted]):
            expected = victims.NO_ROOM
        elif mask > 0 and not fits_with(session, request, node,
                                        [v for k, v in enumerate(group) if mask >> k & 1]):
            expected = victims.NO_ROOM_TAKING
        else:
            expected = victims.SCAN
        assert got == expected, (node, request, scope, mask)
        seen[got] += 1
        return got

    monkeypatch.setattr(victims.NodeIndex, "room_verdict", checked)
    for _name, snap in snapshots:
        _plan(snap)
    assert seen["hits"] > 0 and all(seen[k] > 0 for k in
                                    (victims.NO_ROOM, victims.NO_ROOM_TAKING, victims.SCAN)), seen


def test_each_search_chooses_the_same_victims_without_the_replayed_prefixes(
        snapshots: list[tuple[str, Snapshot]], monkeypatch: pytest.MonkeyPatch) -> None:
    """``cheapest_node`` reuses what earlier searches found at each candidate node while its
    state stands (``ScanPrefix``): run every search once with its index's records set aside
    (the scan works every node out) and once with them, and compare the victims; records
    must have stood, for nodes passed and nodes looked at fully (else this proves nothing)."""
    original = victims.cheapest_node
    original_walk = ScanPrefix.walk
    stood = {"entries": 0, "looked": 0, "searches": 0}

    def walk(self, skip, union, names):  # type: ignore[no-untyped-def]
        for position, node, did in original_walk(self, skip, union, names):
            stood["entries"] += did is not None
            stood["looked"] += did == LOOKED
            yield position, node, did

    def both(session, request, index, allow, **kwargs):  # type: ignore[no-untyped-def]
        kept, index.prefixes = index.prefixes, {}
        fresh = original(session, request, index, allow, **kwargs)
        index.prefixes = kept
        replayed = original(session, request, index, allow, **kwargs)
        assert replayed == fresh
        stood["searches"] += 1
        return replayed

    monkeypatch.setattr(ScanPrefix, "walk", walk)
    monkeypatch.setattr(victims, "cheapest_node", both)
    for _name, snap in snapshots:
        _plan(snap)
    assert stood["entries"] > 0 and stood["looked"] > 0 and stood["searches"] > 0, stood
