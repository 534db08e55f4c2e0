from decimal import Decimal

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest, ResourceRequest
from tessera.core.placement import POLICIES, NoFit, Placement, Placer
from tessera.core.requests import cgpu_request, parse_gpu_request
from tessera.core.state import ClusterState
from tessera.core.units import GiB
from tests.core.factories import gpu_node


def req(**fields: object) -> ResourceRequest:
    return ResourceRequest(parse_gpu_request(**fields))  # type: ignore[arg-type]


def place_all(state: ClusterState, placer: Placer, *requests: ResourceRequest) -> list[Placement]:
    out = []
    for i, r in enumerate(requests):
        where = placer.place(r)
        assert isinstance(where, Placement), where
        state.assign(f"w{i}", where)
        out.append(where)
    return out


@pytest.mark.parametrize("policy", ["fgd", "binpack", "best-fit"])
def test_seed_walkthrough_frac05_and_frac03_share_one_gpu(policy: str) -> None:
    state = ClusterState([gpu_node("node-1", gpus=1), gpu_node("node-2", gpus=1)])
    placer = Placer(state, policy)
    a, b = place_all(state, placer, req(gpu="0.5"), req(gpu="0.3"))
    assert (a.node, a.devices) == (b.node, b.devices)
    assert a.request_bytes == (8 * GiB,)
    assert not a.exclusive


@pytest.mark.parametrize("policy", POLICIES)
def test_two_halves_fill_one_gpu_then_a_third_does_not_fit(policy: str) -> None:
    state = ClusterState([gpu_node("only", gpus=1)])
    placer = Placer(state, policy)
    place_all(state, placer, req(gpu="0.5"), req(gpu="0.5"))
    assert state.nodes[0].dev_free(0) == 0
    third = placer.place(req(gpu="0.1"))
    assert isinstance(third, NoFit)
    assert "largest free is 0 B on only GPU 0" in third.reason


def test_spread_puts_fractions_on_different_gpus() -> None:
    state = ClusterState([gpu_node("n", gpus=2)])
    placer = Placer(state, "spread")
    a, b = place_all(state, placer, req(gpu="0.5"), req(gpu="0.5"))
    assert a.devices != b.devices


def test_whole_gpu_only_takes_devices_with_no_tenant() -> None:
    state = ClusterState([gpu_node("n", gpus=2)])
    placer = Placer(state, "fgd")
    frac, whole = place_all(state, placer, req(gpu="0.1"), req(gpu="1"))
    assert whole.exclusive and whole.devices != frac.devices
    assert whole.request_bytes == (16 * GiB,)
    refused = placer.place(req(gpu="1"))
    assert isinstance(refused, NoFit)
    assert refused.reason == "no node has 1 idle GPU: the most idle on one node is 0"


def test_multi_device_request_takes_distinct_devices_of_one_node() -> None:
    state = ClusterState([gpu_node("small", gpus=2), gpu_node("big", gpus=4)])
    placer = Placer(state, "fgd")
    (p,) = place_all(state, placer, ResourceRequest(cgpu_request(8, 4)))
    assert p.node == "big" and sorted(p.devices) == [0, 1, 2, 3]
    assert p.request_bytes == (2 * GiB,) * 4


def test_memory_request_is_a_portion_of_the_concrete_device() -> None:
    state = ClusterState([gpu_node("v100", memory_gib=16), gpu_node("h100", memory_gib=80, model="H100")])
    placer = Placer(state, "binpack")
    r = ResourceRequest(GpuRequest.of_memory(5 * 10**9, models=frozenset({"H100"})))
    (p,) = place_all(state, placer, r)
    assert p.node == "h100" and p.request_bytes == (5 * 10**9,)
    assert state.by_name["h100"].gpus_allocated() == pytest.approx(5e9 / (80 * GiB))


def test_dynamic_fraction_is_placed_by_request_not_limit() -> None:
    state = ClusterState([gpu_node("n", gpus=1)])
    placer = Placer(state, "fgd")
    burst, other = place_all(
        state, placer, req(gpu_portion="0.25", gpu_portion_limit="0.8"), req(gpu="0.75")
    )
    assert burst.request_bytes == (4 * GiB,) and burst.limit_bytes == (int(Decimal("0.8") * 16 * GiB),)
    assert other.devices == burst.devices


def test_model_constraints_hold() -> None:
    state = ClusterState([gpu_node("t4", model="T4"), gpu_node("v32", memory_gib=32, model="V100M32")])
    placer = Placer(state, "fgd")
    (p,) = place_all(state, placer, req(gpu="1", gpu_model="V100M16|V100M32"))
    assert p.node == "v32"
    refused = placer.place(req(gpu="0.5", gpu_model="V100M16|V100M32"))
    assert isinstance(refused, NoFit)
    assert "of model V100M16|V100M32" in refused.reason


def test_cpu_and_memory_constrain_placement() -> None:
    state = ClusterState([gpu_node("cpu-poor", cpu_milli=2000), gpu_node("cpu-rich", cpu_milli=64000)])
    placer = Placer(state, "binpack")
    (p,) = place_all(state, placer, ResourceRequest(GpuRequest.fraction("0.5"), cpu_milli=8000))
    assert p.node == "cpu-rich" and p.cpu_milli == 8000


def test_explanation_names_largest_free_share() -> None:
    state = ClusterState([gpu_node("node-7", gpus=3)])
    placer = Placer(state, "binpack")
    place_all(state, placer, req(gpu="1"), req(gpu="1"), req(gpu_memory="13.8G"))
    refused = placer.place(req(gpu_memory="5G"))
    assert isinstance(refused, NoFit)
    assert refused.reason == "no GPU with 4.7 GiB free: largest free is 3.1 GiB on node-7 GPU 2"


def test_explanation_for_host_resources() -> None:
    state = ClusterState([gpu_node("n", cpu_milli=4000)])
    placer = Placer(state, "fgd")
    refused = placer.place(ResourceRequest(GpuRequest.fraction("0.5"), cpu_milli=8000))
    assert isinstance(refused, NoFit)
    assert "8 CPU" in refused.reason and "the most is 4 CPU" in refused.reason


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="policy: must be one of fgd, binpack, spread, best-fit, random"):
        Placer(ClusterState([]), "tetris")


def test_release_and_rollback_restore_capacity_and_rankings() -> None:
    state = ClusterState([gpu_node("n", gpus=1)])
    placer = Placer(state, "fgd")
    mark = state.checkpoint()
    place_all(state, placer, req(gpu="1"))
    assert isinstance(placer.place(req(gpu="0.5")), NoFit)
    state.rollback(mark)
    assert state.allocations == {} and state.nodes[0].dev_used == [0]
    assert isinstance(placer.place(req(gpu="0.5")), Placement)
    place_all(state, placer, req(gpu="0.5"))
    state.release("w0")
    assert isinstance(placer.place(req(gpu="1")), Placement)


def test_assign_refuses_overcommit() -> None:
    state = ClusterState([gpu_node("n", gpus=1)])
    placer = Placer(state, "fgd")
    where = placer.place(req(gpu="0.75"))
    assert isinstance(where, Placement)
    state.assign("a", where)
    with pytest.raises(InvalidRequest, match="too little memory free"):
        state.assign("b", where)


def test_cpu_only_request_needs_no_gpu() -> None:
    state = ClusterState([gpu_node("n", gpus=1)])
    (p,) = place_all(state, Placer(state, "fgd"), ResourceRequest(cpu_milli=1000))
    assert p.devices == () and p.cpu_milli == 1000
