"""Placement keeps the compute requests on every GPU within 1 (issue 30; docs/compute-share.md).

A share's compute request is the part of its GPU's time it is promised. Portion shares get
r <= portion (so their memory already bounds it); memory shares (``--gpu-memory 8G
--gpu-compute-request 0.6``) do not, so placement must count time separately from memory. These
properties check, over random clusters and streams, with every policy and through whole cycles
(reclaim and preemption included), that no GPU is ever promised more than its whole time, and
that placement never refuses a share some node could take.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cycle import CycleConfig, Plan, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement import POLICIES, NoFit, Placer
from tessera.core.requests import gpu_request_from_dict, gpu_request_to_dict
from tessera.core.state import ClusterState, Placement
from tessera.core.units import GiB
from tessera.wire import placement_from_json, placement_to_json

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def node(name: str, gpus: int = 1, size: int = 80) -> Node:
    return Node(name, tuple(GpuDevice(f"{name}-g{i}", i, size * GiB, "H100") for i in range(gpus)),
                cpu_milli=64_000, memory=256 * GiB)


@st.composite
def shares(draw: st.DrawFn) -> ResourceRequest:
    """A share with (often) a compute request: portions r <= portion, memory shares any r."""
    devices = draw(st.sampled_from([1, 1, 1, 2]))
    if draw(st.booleans()):
        portion = Decimal(draw(st.integers(1, 9))) / 10
        r = draw(st.one_of(st.none(), st.integers(0, int(portion * 10)).map(lambda x: Decimal(x) / 10)))
        gpu = GpuRequest(GpuKind.PORTION, devices=devices, portion=portion, compute=r)
    else:
        r = draw(st.one_of(st.none(), st.integers(0, 100).map(lambda x: Decimal(x) / 100)))
        gpu = GpuRequest(GpuKind.MEMORY, devices=devices, memory=draw(st.integers(1, 40)) * GiB, compute=r)
    return ResourceRequest(gpu, cpu_milli=1000, memory=GiB)


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    return [node(f"n{k}", draw(st.integers(1, 3)), draw(st.sampled_from([40, 80])))
            for k in range(draw(st.integers(1, 3)))]


def promised(state: ClusterState) -> dict[tuple[str, int], int]:
    """Compute promised per GPU, recounted from the allocations (not from the node counters)."""
    out: dict[tuple[str, int], int] = {}
    for p in state.allocations.values():
        for d in p.devices:
            out[(p.node, d)] = out.get((p.node, d), 0) + p.compute
    return out


def could_take(state: ClusterState, r: ResourceRequest) -> bool:
    """Brute force: a node with the host room and enough devices with both memory and time."""
    time = promised(state)
    want = int(r.gpu.compute * 1_000_000) if r.gpu.compute is not None else 0
    for ns in state.nodes:
        if r.cpu_milli > ns.free_cpu or r.memory > ns.free_mem:
            continue
        ok = [d for d in range(len(ns.dev_memory))
              if r.gpu.bytes_on(ns.dev_memory[d]) <= ns.dev_memory[d] - ns.dev_used[d]
              and time.get((ns.name, d), 0) + want <= 1_000_000]
        if len(ok) >= r.gpu.devices:
            return True
    return False


@PROPERTY
@given(clusters(), st.lists(shares(), min_size=1, max_size=25), st.sampled_from(POLICIES), st.integers(0, 2))
def test_no_gpu_is_promised_more_than_its_time(nodes: list[Node], stream: list[ResourceRequest],
                                               policy: str, seed: int) -> None:
    state = ClusterState(nodes)
    placer = Placer(state, policy, seed=seed)
    for i, r in enumerate(stream):
        possible = could_take(state, r)
        where = placer.place(r)
        assert isinstance(where, Placement) == possible, (r, where)
        if isinstance(where, Placement):
            assert where.compute == (0 if r.gpu.compute is None else int(r.gpu.compute * 1_000_000))
            state.assign(f"w{i}", where)
        else:
            assert where.reason
        if i % 4 == 3 and state.allocations:
            state.release(sorted(state.allocations)[0])
        for (name, d), total in promised(state).items():
            assert total <= 1_000_000, f"{name} GPU {d} promised {total / 1e6} of its time"
            assert state.by_name[name].dev_compute[d] == total


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = draw(clusters())
    state = ClusterState(nodes)
    placer = Placer(state, "binpack")
    projects = (Project("a", Quota(draw(st.sampled_from([0.0, 1.0, 2.0])))),
                Project("b", Quota(draw(st.sampled_from([0.0, 1.0, 2.0])))))
    workloads: list[Workload] = []
    for i in range(draw(st.integers(0, 8))):
        req = draw(shares())
        found = placer.place(req, explain=False)
        if isinstance(found, NoFit):
            continue
        state.assign(f"r{i}", found)
        workloads.append(Workload(f"r{i}", draw(st.sampled_from(["a", "b"])), (req,),
                                  priority_class=draw(st.sampled_from(["train", "build", "inference"])),
                                  started_at=0.0, placements=(found,)))
    for i in range(draw(st.integers(1, 6))):
        workloads.append(Workload(f"q{i}", draw(st.sampled_from(["a", "b"])), (draw(shares()),),
                                  priority_class=draw(st.sampled_from(["train", "build", "inference"])),
                                  created_at=float(i)))
    return Snapshot(tuple(nodes), projects, tuple(workloads), now=1000.0)


def after(snap: Snapshot, plan: Plan) -> ClusterState:
    """The cluster once the plan is applied (``assign`` refuses any over-promise)."""
    state = ClusterState(snap.nodes)
    gone = set(plan.evicted)
    moved = {(m.workload_id, m.pod): m.target for m in plan.moves}
    for w in snap.workloads:
        if w.id not in gone:
            for i, p in enumerate(w.placements):
                if p is not None:
                    state.assign(f"{w.id}#{i}", moved.get((w.id, i), p))
    for b in plan.bindings:
        for pb in b.pods:
            state.assign(f"{b.workload_id}#{pb.pod}", pb.placement)
    return state


@PROPERTY
@given(snapshots())
def test_cycles_with_reclaim_and_preemption_keep_time_within_one(snap: Snapshot) -> None:
    plan = run_cycle(snap, CycleConfig())
    state = after(snap, plan)
    for (name, d), total in promised(state).items():
        assert total <= 1_000_000, f"{name} GPU {d} promised {total / 1e6} of its time"
    waiting = {w.workload_id for w in plan.waiting}
    bound = {b.workload_id for b in plan.bindings}
    for w in snap.workloads:
        if not w.placements:
            assert w.id in bound or w.id in waiting


def test_a_memory_share_waits_for_time_and_says_so() -> None:
    state = ClusterState([node("n1")])
    placer = Placer(state)
    first = ResourceRequest(GpuRequest(GpuKind.MEMORY, devices=1, memory=8 * GiB, compute=Decimal("0.6")))
    where = placer.place(first)
    assert isinstance(where, Placement) and where.compute == 600_000
    state.assign("first", where)
    second = ResourceRequest(GpuRequest(GpuKind.MEMORY, devices=1, memory=8 * GiB, compute=Decimal("0.5")))
    refused = placer.place(second)
    assert isinstance(refused, NoFit)
    assert "waiting for GPU time" in refused.reason and "0.4 on n1 GPU 0" in refused.reason
    # Without a compute request the same memory fits: memory was never the problem.
    assert isinstance(placer.place(ResourceRequest(GpuRequest.of_memory(8 * GiB))), Placement)
    # A request for the time that is left fits.
    assert isinstance(placer.place(ResourceRequest(
        GpuRequest(GpuKind.MEMORY, devices=1, memory=8 * GiB, compute=Decimal("0.4")))), Placement)


def test_cycle_reason_and_preemption_for_time() -> None:
    small = ResourceRequest(GpuRequest(GpuKind.MEMORY, devices=1, memory=4 * GiB, compute=Decimal("0.7")))
    state = ClusterState([node("n1")])
    running = Placer(state).place(small)
    assert isinstance(running, Placement)
    low = Workload("low", "a", (small,), priority_class="train", started_at=0.0, placements=(running,))
    same = Workload("same", "a", (small,), priority_class="train", created_at=1.0)
    plan = run_cycle(Snapshot((node("n1"),), (Project("a", Quota(1.0)),), (low, same), now=1000.0))
    reason = next(w.reason for w in plan.waiting if w.workload_id == "same")
    assert "waiting for GPU time" in reason, reason
    # A higher-priority share of the same project takes the time by preemption: the memory was
    # free all along, so only counting time makes ``low`` a victim.
    high = Workload("high", "a", (small,), priority_class="build", created_at=1.0)
    plan = run_cycle(Snapshot((node("n1"),), (Project("a", Quota(1.0)),), (low, high), now=1000.0))
    assert set(plan.evicted) == {"low"}
    bound = plan.binding("high")
    assert bound is not None and bound.pods[0].placement.compute == 700_000


def test_quota_counts_the_larger_of_memory_and_time() -> None:
    gpu = GpuRequest(GpuKind.MEMORY, devices=2, memory=8 * GiB, compute=Decimal("0.5"))
    assert gpu.gpus_on(80 * GiB) == 1.0  # 2 x max(0.1, 0.5)
    assert GpuRequest.of_memory(8 * GiB, 2).gpus_on(80 * GiB) == 0.2


def test_compute_travels_in_stored_requests_and_placements() -> None:
    gpu = GpuRequest(GpuKind.MEMORY, devices=1, memory=8 * GiB, compute=Decimal("0.25"))
    assert gpu_request_from_dict(gpu_request_to_dict(gpu)) == gpu
    p = Placement("n1", (0,), (8 * GiB,), (8 * GiB,), compute=250_000)
    assert placement_from_json(placement_to_json(p)) == p
