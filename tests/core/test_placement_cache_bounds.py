"""The placer's caches stay correct when they pass their size bounds (issue 15, bug 2).

The memo was once cleared mid-decision together with the request ids, and ids were reused, so a
later request could receive another request's cached placement: a G3-only pod on a T4.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement import POLICIES, Placement, Placer
from tessera.core.placement.devices import device_options
from tessera.core.placement.fragmentation import Fragmentation
from tessera.core.state import ClusterState
from tessera.core.units import GiB

MODELS = ("T4", "G3", "V100M32")


def _node(name: str, model: str, gpus: int, size_gib: int = 16) -> Node:
    devices = tuple(GpuDevice(f"{name}-{i}", i, size_gib * GiB, model) for i in range(gpus))
    return Node(name, devices, 64_000, 256 * GiB)


def test_state_refuses_a_placement_that_breaks_a_model_constraint() -> None:
    state = ClusterState([_node("t4", "T4", 2), _node("g3", "G3", 8, 32)])
    bad = Placement("t4", (0,), (8 * GiB,), (8 * GiB,), models=frozenset({"G3"}))
    with pytest.raises(InvalidRequest, match="GPU 0 of node t4 is a T4, not G3"):
        state.assign("p", bad)
    assert state.fits(Placement("g3", (0,), (8 * GiB,), (8 * GiB,), models=frozenset({"G3"}))) is None
    assert state.fits(Placement("t4", (0,), (8 * GiB,), (8 * GiB,))) is None


def test_placements_carry_the_model_constraint() -> None:
    state = ClusterState([_node("t4", "T4", 2), _node("g3", "G3", 8, 32)])
    request = ResourceRequest(GpuRequest.fraction(Decimal("0.5"), models=frozenset({"G3"})), 1000, GiB)
    where = Placer(state, "fgd").place(request)
    assert isinstance(where, Placement) and where.node == "g3" and where.models == frozenset({"G3"})


@pytest.mark.parametrize("memo", [3, 10, 30, 100])
def test_memo_cleared_mid_decision_never_hands_over_another_requests_placement(memo: int) -> None:
    """The reported case: a tiny memo bound, many shapes, G3-only and T4-only pods."""
    nodes = [_node(f"t4-{i}", "T4", 2) for i in range(6)] + [_node(f"g3-{i}", "G3", 8, 32) for i in range(3)]
    state = ClusterState(nodes)
    placer = Placer(state, "fgd")
    placer.MAX_MEMO = memo
    placer.MAX_RANKINGS = 2
    for i in range(300):
        model = ("G3", "T4", "")[i % 3]
        gpu = GpuRequest.fraction(Decimal(50 + 37 * (i % 23) % 900) / 1000, models=frozenset({model} - {""}))
        request = ResourceRequest(gpu, 100 * (i % 7), GiB * (i % 5))
        where = placer.place(request)
        if isinstance(where, Placement):
            ns = state.by_name[where.node]
            assert all(gpu.allows(ns.dev_models[d]) for d in where.devices), (i, where)
            state.assign(f"p{i}", where)
        if i % 4 == 3:
            state.release(sorted(state.allocations)[0])


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for n in range(draw(st.integers(1, 6))):
        model = draw(st.sampled_from(MODELS))
        nodes.append(_node(f"n{n}", model, draw(st.integers(1, 8)), draw(st.sampled_from((16, 32)))))
    return nodes


@st.composite
def requests(draw: st.DrawFn) -> ResourceRequest:
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    if draw(st.booleans()):
        gpu = GpuRequest.fraction(Decimal(draw(st.integers(1, 999))) / 1000, draw(st.integers(1, 2)), None, models)
    else:
        gpu = GpuRequest.whole(draw(st.integers(1, 4)), models)
    return ResourceRequest(gpu, draw(st.integers(0, 8)) * 1000, draw(st.integers(0, 16)) * GiB)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clusters(),
    st.lists(requests(), min_size=1, max_size=40),
    st.sampled_from(POLICIES),
    st.integers(1, 6),
    st.integers(1, 3),
)
def test_small_cache_bounds_keep_every_constraint(
    nodes: list[Node], stream: list[ResourceRequest], policy: str, memo: int, rankings: int
) -> None:
    """With caches far too small for the shapes in play, every placement still honours its
    request (models, devices, capacity: ``assign`` checks them), and a request that fits
    somewhere is placed."""
    state = ClusterState(nodes)
    placer = Placer(state, policy, seed=1, workload=[(r, 1.0) for r in stream])
    placer.MAX_MEMO = memo
    placer.MAX_RANKINGS = rankings
    frag = getattr(placer.policy, "fragmentation", None)
    if isinstance(frag, Fragmentation):
        frag.MAX_MEMO = memo
    for i, r in enumerate(stream * 2):
        possible = any(device_options(ns, r) for ns in state.nodes)
        where = placer.place(r, explain=False)
        assert isinstance(where, Placement) == possible
        if isinstance(where, Placement):
            ns = state.by_name[where.node]
            assert all(r.gpu.allows(ns.dev_models[d]) for d in where.devices), "model constraint broken"
            assert len(where.devices) == (r.gpu.devices if r.gpu.kind is not GpuKind.NONE else 0)
            state.assign(f"w{i}", where)
        if i % 3 == 2 and state.allocations:
            state.release(sorted(state.allocations)[0])


@pytest.mark.parametrize("table", [1, 2, 5, 1000])
def test_a_signature_id_never_stands_for_two_node_states(table: int) -> None:
    """The placer's memo is keyed by ``ClusterState.signature_id``: equal ids must mean equal
    node states, also after the id table passed its bound and was cleared (ids not reused)."""
    state = ClusterState([_node(f"n{i}", "T4", 2) for i in range(3)])
    state.MAX_SIGNATURE_IDS = table
    seen: dict[int, tuple[object, ...]] = {}
    for step in range(200):
        ns = state.nodes[step % 3]
        pid = f"p{step % 7}"
        if pid in state.allocations:
            state.release(pid)
        else:
            gib = 1 + step % 5
            device = (step // 3) % 2
            p = Placement(ns.name, (device,), (gib * GiB,), (gib * GiB,))
            if state.fits(p) is None:
                state.assign(pid, p)
        for node in state.nodes:
            sid = state.signature_id(node)
            assert seen.setdefault(sid, node.signature()) == node.signature()
    if table >= 1000:  # one table for the whole run: equal states share one id
        assert len(set(seen.values())) == len(seen)
