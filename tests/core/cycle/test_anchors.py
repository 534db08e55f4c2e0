"""Gang anchors (core/cycle/anchors.py, docs/scheduling.md "Gang anchors"): a gang starts and
grows only with every anchor placed, in addition to its minimum; shrink never takes an anchor."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cycle import CycleConfig, Snapshot, Workload, run_cycle
from tessera.core.errors import InvalidRequest

from .plan_helpers import apply
from .scenario import cycle, nodes, project, request, workload
from .strategies import gpu_request, snapshots

N = nodes(2, 4)
PROJECTS = [project("a", 6), project("blk", 2)]
NAMES = ("rc-head-x7k", "rc-worker-a", "rc-worker-b", "rc-worker-c")


def blockers(*where: str) -> list[Workload]:
    """Non-preemptible one-GPU pods of another project (nothing may evict them)."""
    return [workload(N, f"blk{k}", "blk", 1, cls="inference", on=[w]) for k, w in enumerate(where)]


def raycluster(anchors: tuple[int, ...] = (0,), **kw: object) -> Workload:
    """A head of 4 whole GPUs (a whole node) and 3 workers of one GPU; minimum head + 1."""
    head, worker = request(4), request(1)
    return Workload("rc", "a", (head, worker, worker, worker), min_members=2, anchors=anchors,
                    pod_names=NAMES, **kw)  # type: ignore[arg-type]


def test_a_gang_whose_anchor_does_not_fit_does_not_start_although_its_minimum_fits() -> None:
    # One GPU taken on each node: no node has the head's 4 GPUs free, the 3 workers would fit.
    plan = cycle(N, PROJECTS, [*blockers("n1:0", "n2:0"), raycluster()])
    assert plan.binding("rc") is None
    reason = plan.waiting_for("rc").reason  # type: ignore[union-attr]
    assert reason.startswith("waiting for 2 of 2 gang members to fit: anchor pod rc-head-x7k does "
                             "not fit: "), reason
    assert reason.endswith("does not fit: no node has 4 idle GPUs: the most idle on one node is 3 "
                           "(node n1)"), reason
    # Without the anchor the same gang starts with its workers and no head: the gap closed here.
    plan = cycle(N, PROJECTS, [*blockers("n1:0", "n2:0"), raycluster(anchors=())])
    assert sorted(pb.pod for pb in plan.binding("rc").pods) == [1, 2, 3]  # type: ignore[union-attr]


def test_once_the_anchor_fits_the_gang_starts_whole_with_it() -> None:
    plan = cycle(N, PROJECTS, [*blockers("n2:0"), raycluster()])
    b = plan.binding("rc")
    assert b is not None
    pods = {pb.pod: pb.placement for pb in b.pods}
    assert pods[0].node == "n1" and pods[0].devices == (0, 1, 2, 3)  # the head
    assert sorted(pods) == [0, 1, 2, 3] and {pods[i].node for i in (1, 2, 3)} == {"n2"}
    assert plan.waiting_for("rc") is None


def test_anchors_are_tried_first_wherever_they_are_in_the_gang() -> None:
    # The head last: still required, and the one named.
    head, worker = request(4), request(1)
    rc = Workload("rc", "a", (worker, worker, worker, head), min_members=2, anchors=(3,),
                  pod_names=("w0", "w1", "w2", "head-9"))
    plan = cycle(N, PROJECTS, [*blockers("n1:0", "n2:0"), rc])
    assert plan.binding("rc") is None
    assert "anchor pod head-9 does not fit" in plan.waiting_for("rc").reason  # type: ignore[union-attr]
    plan = cycle(N, PROJECTS, [*blockers("n2:0"), rc])
    assert sorted(pb.pod for pb in plan.binding("rc").pods) == [0, 1, 2, 3]  # type: ignore[union-attr]


def test_a_running_gang_without_its_anchor_does_not_grow_until_the_anchor_is_placed() -> None:
    # Workers 1 and 2 run (the minimum's count), the head's pod was recreated and waits; five
    # GPUs are idle but the head needs a whole node: worker 3 does not start without it.
    head, worker = request(4), request(1)
    running = dataclasses.replace(
        raycluster(), started_at=0.0,
        placements=(None, *(workload(N, "x", "a", 1, on=[w]).placements[0] for w in ("n1:0", "n1:1")), None))
    assert running.placements[1] is not None and running.pods[1] == worker and running.pods[0] == head
    plan = cycle(N, PROJECTS, [*blockers("n2:0"), running])
    assert plan.binding("rc") is None
    reason = plan.waiting_for("rc").reason  # type: ignore[union-attr]
    assert "anchor pod rc-head-x7k does not fit" in reason and "elastic" not in reason, reason
    # With n2 free the head starts there, and the last worker with it (on n1).
    plan = cycle(N, PROJECTS, [running])
    pods = {pb.pod: pb.placement.node for pb in plan.binding("rc").pods}  # type: ignore[union-attr]
    assert pods == {0: "n2", 3: "n1"}


def test_reclaim_makes_room_for_the_anchor() -> None:
    # b is over its share on both nodes' first GPU; a (deserving 8) waits for its head.
    projects = [project("a", 8), project("b", 0)]
    over = [workload(N, f"b{k}", "b", 1, on=[w]) for k, w in enumerate(("n1:0", "n2:0"))]
    plan = cycle(N, projects, [*over, raycluster()])
    b = plan.binding("rc")
    assert b is not None and 0 in {pb.pod for pb in b.pods}, plan.waiting
    assert len(plan.evictions) == 1  # one node's GPU freed for the head, not both


def test_shrink_never_takes_an_anchor() -> None:
    # An elastic gang of 8 one-GPU pods on all GPUs, minimum 1, its anchor the highest index
    # (which shrink would give back first): b asks for one GPU.
    g = workload(N, "e", "a", 1, pods=8, min_members=1,
                 on=[f"n{k}:{i}" for k in (1, 2) for i in range(4)], anchors=(7,))
    projects = [project("a", 0), project("b", 1)]
    plan = cycle(N, projects, [g, workload(N, "w", "b", 1)])
    (ev,) = plan.evictions
    assert ev.action == "shrink" and ev.pods == (6,), ev
    plain = cycle(N, projects, [dataclasses.replace(g, anchors=()), workload(N, "w", "b", 1)])
    assert plain.evictions[0].pods == (7,)


@pytest.mark.parametrize(("anchors", "rule"), [
    ((4,), "must be indexes of its pods (0 to 3)"),
    ((-1,), "must be indexes of its pods (0 to 3)"),
    ((1, 1), "must not name a pod twice"),
])
def test_bad_anchors_are_refused_naming_the_field(anchors: tuple[int, ...], rule: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        raycluster(anchors=anchors).validate()
    assert exc.value.field == "workloads.rc.anchors" and rule in str(exc.value)


def test_pod_names_must_match_the_pods() -> None:
    with pytest.raises(InvalidRequest) as exc:
        dataclasses.replace(raycluster(), pod_names=("a",)).validate()
    assert exc.value.field == "workloads.rc.pod_names"


@st.composite
def anchored(draw: st.DrawFn) -> tuple[Snapshot, CycleConfig]:
    """The cycle property tests' random clusters, plus gangs with anchors: pending ones whose
    anchors ask other shapes than their workers, and running elastic ones (some with the
    anchor placed and the highest index, some with it unplaced above a running minimum)."""
    snap, config = draw(snapshots())
    projects = [p.name for p in snap.projects if p.name != "dept"]
    extra: list[Workload] = []
    for i in range(draw(st.integers(1, 3))):
        size = draw(st.integers(2, 4))
        anchors = tuple(sorted(draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=2))))
        # anchors often larger than their workers (a head of whole GPUs, workers of a share)
        big = draw(st.sampled_from([request(2), request(3), request(1)]) | st.builds(gpu_request, st.just(draw)))
        small = gpu_request(draw)
        pods = tuple(big if k in anchors else small for k in range(size))
        extra.append(Workload(f"anc{i}", draw(st.sampled_from(projects)), pods,
                              min_members=draw(st.integers(1, size - len(anchors) + 1)), anchors=anchors,
                              created_at=float(draw(st.integers(0, 100)))))
    running = []
    for w in snap.workloads:
        if w.placements and len(w.pods) == 2 and draw(st.booleans()):
            # elastic: its two pods run, a third (unplaced) or its last placed pod is the anchor
            grow = draw(st.booleans())
            w = dataclasses.replace(w, pods=(*w.pods, w.pods[0]), placements=(*w.placements, None),
                                    min_members=draw(st.integers(1, 2)), anchors=(2,) if grow else (1,))
        running.append(w)
    return dataclasses.replace(snap, workloads=(*running, *extra)), config


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anchored())
def test_no_gang_runs_without_its_anchors_and_shrink_never_takes_one(
        case: tuple[Snapshot, CycleConfig]) -> None:
    snap, config = case
    plan = run_cycle(snap, config)
    apply(snap, plan)  # the plan's placements fit together
    by_id = {w.id: w for w in snap.workloads}
    for b in plan.bindings:
        w = by_id[b.workload_id]
        placed = {i for i, p in enumerate(w.placements) if p is not None} | {pb.pod for pb in b.pods}
        assert set(w.anchors) <= placed, (w, b)
        if w.placements is None or not any(w.placements):
            assert len(placed) >= w.gang_min
    for ev in plan.evictions:
        assert not set(ev.pods) & set(by_id[ev.workload_id].anchors), ev
    # With every action, and with allocate alone, the rule holds alike.
    alone = run_cycle(snap, dataclasses.replace(config, actions=("allocate",)))
    for b in alone.bindings:
        w = by_id[b.workload_id]
        placed = {i for i, p in enumerate(w.placements) if p is not None} | {pb.pod for pb in b.pods}
        assert set(w.anchors) <= placed


def test_an_anchor_no_node_could_ever_hold_is_named_in_the_unschedulable_reason() -> None:
    head, worker = request(8), request(1)  # 8 GPUs on one node: the nodes have 4
    rc = Workload("rc", "a", (head, worker, worker), min_members=2, anchors=(0,),
                  pod_names=("rc-head-q", "w1", "w2"))
    plan = cycle(N, PROJECTS, [rc])
    wait = plan.waiting_for("rc")
    assert plan.binding("rc") is None and wait is not None and wait.kind == "unschedulable"
    assert wait.reason.startswith("anchor pod rc-head-q does not fit: no node can ever hold it: "), wait
