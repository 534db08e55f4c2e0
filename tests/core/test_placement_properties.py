"""Invariants of placement over random clusters and request streams, for every policy."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement import POLICIES, NoFit, Placement, Placer
from tessera.core.state import ClusterState
from tessera.core.units import GiB

MODELS = ("V100M16", "A100", "H100")


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for n in range(draw(st.integers(1, 6))):
        count = draw(st.integers(0, 8))
        model = draw(st.sampled_from(MODELS))
        size = draw(st.sampled_from((16, 40, 80))) * GiB
        mixed = draw(st.booleans())
        gpus = tuple(
            GpuDevice(f"GPU-{n}-{i}", i, size + (i * GiB if mixed else 0), model) for i in range(count)
        )
        nodes.append(Node(f"node-{n}", gpus, draw(st.integers(1, 64)) * 1000, draw(st.integers(1, 256)) * GiB))
    return nodes


@st.composite
def requests(draw: st.DrawFn) -> ResourceRequest:
    kind = draw(st.sampled_from(list(GpuKind)))
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    devices = draw(st.integers(1, 4))
    if kind is GpuKind.NONE:
        gpu = GpuRequest.none()
    elif kind is GpuKind.WHOLE:
        gpu = GpuRequest.whole(devices, models)
    elif kind is GpuKind.PORTION:
        milli = draw(st.integers(1, 999))
        limit = draw(st.one_of(st.none(), st.integers(milli, 1000)))
        gpu = GpuRequest.fraction(
            Decimal(milli) / 1000, devices, None if limit is None else Decimal(limit) / 1000, models
        )
    else:
        nbytes = draw(st.integers(1, 90)) * GiB // 2
        gpu = GpuRequest.of_memory(nbytes, devices, None, models)
    return ResourceRequest(gpu, draw(st.integers(0, 16)) * 1000, draw(st.integers(0, 64)) * GiB)


def check_invariants(state: ClusterState) -> None:
    for ns in state.nodes:
        assert 0 <= ns.free_cpu <= ns.node.cpu_milli
        assert 0 <= ns.free_mem <= ns.node.memory
        for i, size in enumerate(ns.dev_memory):
            assert 0 <= ns.dev_used[i] <= size, "a device holds more than its memory in requests"
    holders: dict[tuple[str, int], list[Placement]] = {}
    for p in state.allocations.values():
        assert len(set(p.devices)) == len(p.devices), "devices of one request must be distinct"
        for i in p.devices:
            holders.setdefault((p.node, i), []).append(p)
    for held in holders.values():
        if any(p.exclusive for p in held):
            assert len(held) == 1, "a whole GPU shares its device"


def run_stream(nodes: list[Node], stream: list[ResourceRequest], policy: str, seed: int) -> list[object]:
    state = ClusterState(nodes)
    placer = Placer(state, policy, seed=seed)
    trail: list[object] = []
    for i, r in enumerate(stream):
        where = placer.place(r)
        if isinstance(where, Placement):
            ns = state.by_name[where.node]
            assert len(where.devices) == (r.gpu.devices if r.gpu.kind is not GpuKind.NONE else 0)
            assert all(r.gpu.allows(ns.dev_models[d]) for d in where.devices), "model constraint broken"
            state.assign(f"w{i}", where)
            trail.append(where)
        else:
            assert isinstance(where, NoFit) and where.reason
            trail.append(where.reason)
        if i % 3 == 2 and state.allocations:
            state.release(sorted(state.allocations)[0])
        check_invariants(state)
    return trail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(requests(), max_size=25), st.sampled_from(POLICIES), st.integers(0, 3))
def test_invariants_hold_for_every_policy(
    nodes: list[Node], stream: list[ResourceRequest], policy: str, seed: int
) -> None:
    run_stream(nodes, stream, policy, seed)


@settings(max_examples=30, deadline=None)
@given(clusters(), st.lists(requests(), max_size=20), st.sampled_from(POLICIES), st.integers(0, 3))
def test_placement_is_deterministic_for_a_seed(
    nodes: list[Node], stream: list[ResourceRequest], policy: str, seed: int
) -> None:
    assert run_stream(nodes, stream, policy, seed) == run_stream(nodes, stream, policy, seed)


@settings(max_examples=40, deadline=None)
@given(clusters(), st.lists(requests(), min_size=1, max_size=20))
def test_placer_agrees_with_an_exhaustive_search(nodes: list[Node], stream: list[ResourceRequest]) -> None:
    """The cached rankings never miss a node: whenever some node could host a request, it is placed."""
    from tessera.core.placement.devices import device_options

    state = ClusterState(nodes)
    placer = Placer(state, "fgd")
    for i, r in enumerate(stream):
        possible = any(device_options(ns, r) for ns in state.nodes)
        where = placer.place(r)
        assert isinstance(where, Placement) == possible
        if isinstance(where, Placement):
            state.assign(f"w{i}", where)


@settings(max_examples=30, deadline=None)
@given(clusters(), st.lists(requests(), max_size=15), st.lists(requests(), max_size=10))
def test_rollback_restores_the_exact_state(
    nodes: list[Node], before: list[ResourceRequest], during: list[ResourceRequest]
) -> None:
    state = ClusterState(nodes)
    placer = Placer(state, "binpack")
    for i, r in enumerate(before):
        where = placer.place(r)
        if isinstance(where, Placement):
            state.assign(f"b{i}", where)
    snapshot = [ns.signature() for ns in state.nodes], dict(state.allocations)
    mark = state.checkpoint()
    for i, r in enumerate(during):
        where = placer.place(r)
        if isinstance(where, Placement):
            state.assign(f"d{i}", where)
        if state.allocations and i % 2:
            state.release(sorted(state.allocations)[-1])
    state.rollback(mark)
    assert ([ns.signature() for ns in state.nodes], state.allocations) == snapshot


@settings(max_examples=100, deadline=None)
@given(requests())
def test_gpu_requests_round_trip_through_their_stored_form(request: ResourceRequest) -> None:
    import json

    from tessera.core.requests import gpu_request_from_dict, gpu_request_to_dict

    stored = json.loads(json.dumps(gpu_request_to_dict(request.gpu)))
    assert gpu_request_from_dict(stored) == request.gpu
