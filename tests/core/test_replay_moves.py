"""Consolidation in the trace replay (``tessera.bench.trace --moves``): a pod that finds no room
gets it when fractional pods can move elsewhere, never over the move limit, and a failed try
leaves the state as it was."""

from __future__ import annotations

from decimal import Decimal

from tessera.bench.replay_moves import Mover
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import NoFit, Placement, Placer
from tessera.core.state import ClusterState
from tessera.core.units import GiB


def _cluster(gpus_per_node: int = 1, nodes: int = 2, cpu: int = 32_000) -> ClusterState:
    return ClusterState([Node(f"n{k}", tuple(GpuDevice(f"n{k}-{i}", i, 16 * GiB, "T4")
                                             for i in range(gpus_per_node)), cpu, 64 * GiB)
                         for k in range(nodes)])


def _put(state: ClusterState, mover: Mover, name: str, node: str, request: ResourceRequest) -> None:
    ns = state.by_name[node]
    where = Placement(node, (0,), (request.gpu.bytes_on(ns.dev_memory[0]),),
                      (request.gpu.bytes_on(ns.dev_memory[0]),), False, request.cpu_milli,
                      request.memory)
    state.assign(name, where)
    mover.placed(name, request, where)


def test_a_whole_gpu_pod_gets_a_gpu_by_moving_a_half_next_to_another() -> None:
    state = _cluster()
    placer = Placer(state, "fgd")
    mover = Mover(state, placer, max_moves=1)
    half = ResourceRequest(GpuRequest.fraction(Decimal("0.5")), 1000, GiB)
    _put(state, mover, "a", "n0", half)
    _put(state, mover, "b", "n1", half)
    whole = ResourceRequest(GpuRequest.whole(1), 1000, GiB)
    assert isinstance(placer.place(whole, explain=False), NoFit)
    where = mover.make_room("c", whole)
    assert isinstance(where, Placement) and state.allocations["c"] == where
    assert mover.moves == 1 and mover.rescued == 1
    other = "n1" if where.node == "n0" else "n0"
    assert {state.allocations["a"].node, state.allocations["b"].node} == {other}
    assert state.by_name[other].dev_used[0] == 16 * GiB


def test_no_move_past_the_limit_and_a_failed_try_changes_nothing() -> None:
    state = _cluster(nodes=2)
    placer = Placer(state, "fgd")
    quarter = ResourceRequest(GpuRequest.fraction(Decimal("0.25")), 1000, GiB)
    mover = Mover(state, placer, max_moves=1)
    for name in ("a", "b"):
        _put(state, mover, name, "n0", quarter)
    _put(state, mover, "c", "n1", ResourceRequest(GpuRequest.fraction(Decimal("0.75")), 1000, GiB))
    whole = ResourceRequest(GpuRequest.whole(1), 1000, GiB)
    before = dict(state.allocations)
    # n0 needs 2 moves (over the limit); n1's 0.75 has nowhere to go (n0 has 0.5 free)
    assert mover.make_room("w", whole) is None
    assert state.allocations == before and mover.moves == 0
    two = Mover(state, placer, max_moves=2)
    two.requests, two.on_node = mover.requests, mover.on_node
    assert two.make_room("w", whole) is None  # a and b (0.25 each) fit nowhere but n0 either
    assert state.allocations == before


def test_cpu_short_nodes_free_cpu_by_moving_fractional_pods() -> None:
    """The node's GPU is free enough but its CPU is taken by a fractional pod: moving that pod
    frees the CPU."""
    state = _cluster(nodes=2, cpu=8_000)
    placer = Placer(state, "fgd")
    mover = Mover(state, placer, max_moves=2)
    small = ResourceRequest(GpuRequest.fraction(Decimal("0.25")), 6_000, GiB)
    _put(state, mover, "hog", "n0", small)
    _put(state, mover, "x", "n1", ResourceRequest(GpuRequest.fraction(Decimal("0.6")), 1_000, GiB))
    pod = ResourceRequest(GpuRequest.fraction(Decimal("0.5")), 7_000, GiB)  # n0: CPU; n1: GPU
    assert isinstance(placer.place(pod, explain=False), NoFit)
    where = mover.make_room("p", pod)
    assert isinstance(where, Placement) and where.node == "n0"
    assert state.allocations["hog"].node == "n1"
