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



def test_stranding_keeps_cpu_heavy_pods_off_nodes_whose_gpus_still_need_the_cpu() -> None:
    """Typical pod: 1 GPU + 2 CPU. Node a already lost 6 of its 16 CPU; a 4-CPU pod there
    leaves CPU for 3 of its 4 free GPUs, on b for all 4. One more typical pod fits on either
    (FGD alone sees a tie and takes the first node); the stranding term takes b."""
    from tessera.core.placement.policies import FragmentationGradient

    def node(name: str) -> Node:
        return Node(name, tuple(GpuDevice(f"{name}-{i}", i, 16 * GiB, "T4") for i in range(4)), 16_000, 256 * GiB)

    workload = [(ResourceRequest(GpuRequest.whole(1), 2000, GiB), 1.0)]
    pod = ResourceRequest(GpuRequest.none(), 4000, GiB)
    picks = {}
    for strand in (0.0, 0.3):
        state = ClusterState([node("a"), node("b")])
        state.assign("x", Placement("a", cpu_milli=6000, memory=GiB))
        placer = Placer(state, "fgd", workload=workload)
        assert isinstance(placer.policy, FragmentationGradient)
        placer.policy.strand = strand
        a = state.by_name["a"]
        assert placer.policy._stranded(a, a.free_cpu - 4000, a.free_mem - GiB, a.dev_used) == 1.0
        where = placer.place(pod)
        assert isinstance(where, Placement)
        picks[strand] = where.node
    assert picks == {0.0: "a", 0.3: "b"}


def test_stranding_weight_follows_the_share_of_gpu_demand_that_is_shared() -> None:
    """Off where whole GPUs carry the demand (the free whole GPUs stranding spends are what they
    need), full where shared GPUs carry 40% or more of it, a straight line between; the policy
    built for a mix takes that weight."""
    from tessera.core.placement.policies import FragmentationGradient as F

    half = ResourceRequest(GpuRequest.fraction(Decimal("0.5")), 4000, GiB)
    whole = ResourceRequest(GpuRequest.whole(1), 8000, GiB)
    cpu_only = ResourceRequest(GpuRequest.none(), 2000, GiB)

    def weight(halves: float, wholes: float) -> float:  # GPU demand: halves × 0.5 + wholes
        return F.strand_weight([(half, halves), (whole, wholes), (cpu_only, 50.0)])

    assert weight(0, 10) == 0.0
    assert weight(6, 7) == 0.0  # 3 of 10 GPUs shared: 30%
    assert abs(weight(7, 6.5) - 0.15) < 1e-9  # 35%
    assert abs(weight(8, 6) - F.strand_max) < 1e-9  # 40%
    assert weight(20, 0) == F.strand_max
    assert F.strand_weight([(cpu_only, 1.0)]) == 0.0  # no GPU demand at all
    state = ClusterState([_node("g", "T4", 4)])
    placer = Placer(state, "fgd", workload=[(half, 20.0)])
    assert isinstance(placer.policy, F) and placer.policy.strand == F.strand_max
    assert Placer(state, "fgd", workload=[(whole, 1.0)]).policy.strand == 0.0  # type: ignore[attr-defined]
