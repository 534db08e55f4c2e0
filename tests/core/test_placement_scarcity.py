"""The scarcity term: GPUs of a model that constrained pods need are left to them."""

from __future__ import annotations

from decimal import Decimal

from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import Placement, Placer
from tessera.core.placement.policies import model_pressure
from tessera.core.state import ClusterState
from tessera.core.units import GiB


def _node(name: str, model: str, gpus: int) -> Node:
    return Node(name, tuple(GpuDevice(f"{name}-{i}", i, 16 * GiB, model) for i in range(gpus)), 64_000, 256 * GiB)


def test_pressure_is_constrained_demand_over_the_models_gpus() -> None:
    anywhere = ResourceRequest(GpuRequest.whole(1))
    t4_only = ResourceRequest(GpuRequest.whole(1, frozenset({"T4"})))
    either = ResourceRequest(GpuRequest.fraction(Decimal("0.5"), models=frozenset({"T4", "P100"})))
    # GPU demand: 6 anywhere + 3 T4-only + 1 either (2 × 0.5) = 10, scaled to 20 GPUs of capacity
    workload = [(anywhere, 6.0), (t4_only, 3.0), (either, 2.0)]
    pressure = model_pressure(workload, {"T4": 4, "P100": 4, "G2": 12})
    assert pressure["G2"] == 0.0
    # T4: 3/10 × 20 / 4 = 1.5 (capped at 1) + ...; P100: 1/10 × 20 / 8 = 0.25
    assert pressure["T4"] == 1.0
    assert abs(pressure["P100"] - 0.25) < 1e-9


def test_unconstrained_pods_leave_the_scarce_model_to_the_pods_that_need_it() -> None:
    # a small T4 node fills up fastest, so packing alone would put the first pods there
    state = ClusterState([_node("g2", "G2", 8), _node("t4", "T4", 2)])
    anywhere = ResourceRequest(GpuRequest.whole(1), 1000, GiB)
    t4_only = ResourceRequest(GpuRequest.whole(1, frozenset({"T4"})), 1000, GiB)
    placer = Placer(state, "fgd", workload=[(anywhere, 8.0), (t4_only, 2.0)])
    for i in range(8):
        where = placer.place(anywhere)
        assert isinstance(where, Placement) and where.node == "g2"
        state.assign(f"a{i}", where)
    for i in range(2):
        where = placer.place(t4_only)
        assert isinstance(where, Placement) and where.node == "t4"
        state.assign(f"t{i}", where)
