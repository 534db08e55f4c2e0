"""NVLink islands in placement: multi-GPU sets inside one island, single GPUs from partly used
islands, nodes where the set stays on NVLink preferred (docs/kube-constraints.md, "NVLink")."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.core import nvlink
from tessera.core.errors import InvalidRequest
from tessera.core.model import Node, ResourceRequest
from tessera.core.placement import POLICIES, Placement, Placer
from tessera.core.requests import parse_gpu_request
from tessera.core.state import ClusterState
from tests.core.factories import gpu_node


def req(**fields: object) -> ResourceRequest:
    return ResourceRequest(parse_gpu_request(**fields))  # type: ignore[arg-type]


def with_links(node: Node, islands: tuple[int, ...] | None) -> Node:
    return dataclasses.replace(node, nvlink=islands)


def place(state: ClusterState, placer: Placer, name: str, request: ResourceRequest) -> Placement:
    where = placer.place(request)
    assert isinstance(where, Placement), where
    state.assign(name, where)
    return where


def test_islands_are_the_connected_components_of_the_nvlink_pairs() -> None:
    assert nvlink.islands(4, [(0, 1), (2, 3)]) == (0, 0, 1, 1)
    assert nvlink.islands(4, [(3, 2), (1, 0)]) == (0, 0, 1, 1)
    assert nvlink.islands(4, [(0, 1), (1, 2), (2, 3)]) == (0, 0, 0, 0)  # through other devices
    assert nvlink.islands(3, []) == (0, 1, 2)
    assert nvlink.islands(2, [(0, 5), (-1, 1)]) == (0, 1)  # a stale pair is ignored
    assert nvlink.one_island((0, 0, 1, 1), (0, 1)) and not nvlink.one_island((0, 0, 1, 1), (1, 2))
    assert nvlink.one_island(None, (0, 3))  # unknown topology: no preference


def test_a_node_needs_one_island_per_gpu() -> None:
    with pytest.raises(InvalidRequest, match="nvlink"):
        with_links(gpu_node("n", gpus=4), (0, 0, 1))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_four_gpu_pod_gets_an_intact_nvlink_quad(policy: str) -> None:
    # Two NVLink quads; a 2-GPU pod first. First-fit would then hand the 4-GPU pod 2,3,4,5.
    state = ClusterState([with_links(gpu_node("n", gpus=8), (0, 0, 0, 0, 1, 1, 1, 1))])
    placer = Placer(state, policy)
    two = place(state, placer, "two", req(gpu="2"))
    four = place(state, placer, "four", req(gpu="4"))
    assert nvlink.one_island(state.nodes[0].node.nvlink, two.devices)
    assert nvlink.one_island(state.nodes[0].node.nvlink, four.devices), four.devices


def test_without_topology_the_same_pods_span_quads() -> None:
    """The control for the test above: nothing but the islands changed the choice."""
    state = ClusterState([gpu_node("n", gpus=8)])
    placer = Placer(state, "binpack")
    place(state, placer, "two", req(gpu="2"))
    four = place(state, placer, "four", req(gpu="4"))
    assert not nvlink.one_island((0, 0, 0, 0, 1, 1, 1, 1), four.devices)


def test_single_gpus_fill_a_partly_used_island_first() -> None:
    # NVLink pairs (PCIe cards with bridges) 0+2 and 1+3: first-fit would put two 1-GPU pods
    # on 0 and 1 and break both pairs.
    islands = (0, 1, 0, 1)
    state = ClusterState([with_links(gpu_node("n", gpus=4), islands)])
    placer = Placer(state, "binpack")
    a = place(state, placer, "a", req(gpu="1"))
    b = place(state, placer, "b", req(gpu="1"))
    assert nvlink.one_island(islands, (a.devices[0], b.devices[0]))
    pair = place(state, placer, "pair", req(gpu="2"))
    assert nvlink.one_island(islands, pair.devices)


def test_shared_multi_device_request_stays_in_one_island() -> None:
    state = ClusterState([with_links(gpu_node("n", gpus=4), (0, 1, 0, 1))])
    placer = Placer(state, "fgd")
    where = place(state, placer, "w", req(gpu="0.5", gpu_devices=2))
    assert nvlink.one_island((0, 1, 0, 1), where.devices), where.devices


def test_spanning_islands_when_no_island_holds_the_request() -> None:
    state = ClusterState([with_links(gpu_node("n", gpus=4), (0, 0, 1, 2))])
    placer = Placer(state, "fgd")
    where = place(state, placer, "w", req(gpu="3"))
    assert set(where.devices) >= {0, 1}  # the largest island, plus one more


@pytest.mark.parametrize("policy", ["fgd", "binpack", "best-fit"])
def test_the_node_where_the_set_stays_on_nvlink_wins(policy: str) -> None:
    # pcie: PCIe only, and fuller (every packing policy prefers it); nvl: one NVSwitch island.
    pcie = with_links(gpu_node("pcie", gpus=4), (0, 1, 2, 3))
    nvl = with_links(gpu_node("nvl", gpus=4), (0, 0, 0, 0))
    state = ClusterState([pcie, nvl])
    placer = Placer(state, policy)
    place(state, placer, "filler", req(gpu="1"))
    assert state.by_name["pcie"].dev_tenants.count(1) + state.by_name["nvl"].dev_tenants.count(1) == 1
    filled = "pcie" if any(state.by_name["pcie"].dev_tenants) else "nvl"
    if filled != "pcie":  # make pcie the fuller node whatever the policy chose
        state = ClusterState([pcie, nvl])
        placer = Placer(state, policy)
        state.assign("filler", Placement(node="pcie", devices=(0,), request_bytes=(16 * 2**30,),
                                         limit_bytes=(16 * 2**30,), exclusive=True))
    where = place(state, placer, "pair", req(gpu="2"))
    assert where.node == "nvl"


def test_unknown_topology_keeps_the_policy_choice() -> None:
    pcie = gpu_node("pcie", gpus=4)  # nvlink None: unknown, no penalty
    nvl = with_links(gpu_node("nvl", gpus=4), (0, 0, 0, 0))
    state = ClusterState([pcie, nvl])
    placer = Placer(state, "binpack")
    state.assign("filler", Placement(node="pcie", devices=(0,), request_bytes=(16 * 2**30,),
                                     limit_bytes=(16 * 2**30,), exclusive=True))
    assert place(state, placer, "pair", req(gpu="2")).node == "pcie"
