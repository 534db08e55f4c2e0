"""``ClusterState.load`` (a new session's pods put on their nodes in one pass, capacity checked
once per node) and the one-pass ``fits`` against the straightforward computations they replace:
``assign`` one placement at a time, and the rule-by-rule ``_why_not``. Random small clusters
with placements that break each rule now and then (unknown node, negative amounts, a device
named twice or out of range, a model not allowed, a share larger than its limit, too much
memory or compute on a device, a whole GPU shared)."""

from __future__ import annotations

import random

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import COMPUTE_FULL, GpuDevice, Node
from tessera.core.state import ClusterState, NodeState, Placement

MODELS = ("A", "B")


def _cluster(rng: random.Random) -> list[Node]:
    nodes = []
    for n in range(rng.randint(1, 4)):
        gpus = tuple(GpuDevice(f"g{n}-{i}", i, rng.choice((8, 16)), rng.choice(MODELS))
                     for i in range(rng.randint(0, 4)))
        nodes.append(Node(f"n{n}", gpus, rng.choice((4, 8)), rng.choice((16, 32))))
    return nodes


def _placement(rng: random.Random, nodes: list[Node]) -> Placement:
    node = rng.choice(nodes)
    name = node.name if rng.random() > 0.02 else "elsewhere"
    count = len(node.gpus)
    k = rng.randint(0, min(count, 3)) if count else 0
    devices = rng.sample(range(count), k) if k else []
    if devices and rng.random() < 0.03:
        devices.append(devices[0])
    if rng.random() < 0.03:
        devices.append(count)
    exclusive = bool(devices) and rng.random() < 0.3
    sizes = {g.index: g.memory for g in node.gpus}
    # a whole GPU holds all its memory, or (a record from elsewhere) less: then only the
    # whole-GPU rule keeps others off it
    whole_bytes = rng.random() < 0.5
    wants = [sizes.get(d, 8) if exclusive and whole_bytes else rng.choice((1, 2, 4, 6)) for d in devices]
    if wants and rng.random() < 0.03:
        wants[0] = 0
    limits = [w if rng.random() > 0.03 else w - 1 for w in wants]
    if limits and rng.random() < 0.03:
        limits.pop()
    compute = rng.choice((0, 0, COMPUTE_FULL // 4, COMPUTE_FULL // 2, COMPUTE_FULL))
    if rng.random() < 0.02:
        compute = rng.choice((-1, COMPUTE_FULL + 1))
    models = frozenset(rng.sample(MODELS, rng.randint(0, 1))) if rng.random() < 0.2 else frozenset()
    cpu = rng.choice((0, 1, 2)) if rng.random() > 0.02 else -1
    memory = rng.choice((0, 2, 4)) if rng.random() > 0.02 else -1
    return Placement(name, tuple(devices), tuple(wants), tuple(limits), exclusive, cpu, memory,
                     models, None, compute)


def _view(ns: NodeState) -> tuple[object, ...]:
    return (ns.free_cpu, ns.free_mem, ns.dev_used, ns.dev_compute, ns.dev_tenants, ns.dev_whole,
            ns.signature())


def _one_by_one(nodes: list[Node], items: list[tuple[str, Placement]]) -> ClusterState | None:
    state = ClusterState(nodes)
    for alloc_id, p in items:
        try:
            state.assign(alloc_id, p)
        except InvalidRequest:
            return None
    return state


@pytest.mark.parametrize("seed", range(400))
def test_load_equals_assign_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _cluster(rng)
    items = [(f"w{i}#0", _placement(rng, nodes)) for i in range(rng.randint(0, 12))]
    if items and rng.random() < 0.05:
        items.append(items[0])  # an id given twice
    expected = _one_by_one(nodes, items)
    state = ClusterState(nodes)
    dirty = state.subscribe()
    dirty.clear()
    loaded = state.load(items)
    assert loaded == (expected is not None)
    reference = expected if expected is not None else ClusterState(nodes)
    assert state.allocations == reference.allocations
    assert [_view(ns) for ns in state.nodes] == [_view(ns) for ns in reference.nodes]
    touched = {state.by_name[p.node].index for _, p in items if p.node in state.by_name}
    if loaded:
        assert touched <= dirty  # placement caches learn of every node that changed
    # whatever came of it, the state goes on answering as the reference does
    for _ in range(6):
        p = _placement(rng, nodes)
        assert state.fits(p) == reference.fits(p)


@pytest.mark.parametrize("seed", range(200))
def test_fits_equals_rule_by_rule(seed: int) -> None:
    rng = random.Random(1000 + seed)
    nodes = _cluster(rng)
    state = ClusterState(nodes)
    for i in range(rng.randint(0, 10)):
        p = _placement(rng, nodes)
        if state._why_not(p) is None:
            state.assign(f"w{i}#0", p)
    for _ in range(20):
        p = _placement(rng, nodes)
        assert state.fits(p) == state._why_not(p)


def test_load_refuses_a_state_that_already_holds_pods() -> None:
    node = Node("n0", (GpuDevice("g", 0, 16, "A"),), 4, 16)
    state = ClusterState([node])
    state.assign("a#0", Placement("n0", (0,), (4,), (4,)))
    with pytest.raises(RuntimeError, match="already holds"):
        state.load([("b#0", Placement("n0", (0,), (4,), (4,)))])


@pytest.mark.parametrize("whole_first", [True, False])
def test_load_refuses_a_whole_gpu_shared_in_either_order(whole_first: bool) -> None:
    """Memory alone would let these two share the GPU: only the whole-GPU rule refuses."""
    node = Node("n0", (GpuDevice("g", 0, 16, "A"),), 4, 16)
    whole = Placement("n0", (0,), (4,), (4,), exclusive=True)
    share = Placement("n0", (0,), (4,), (4,))
    items = [("a#0", whole), ("b#0", share)] if whole_first else [("b#0", share), ("a#0", whole)]
    assert _one_by_one([node], items) is None
    state = ClusterState([node])
    assert not state.load(items)
    assert state.allocations == {}
    assert _view(state.nodes[0]) == _view(ClusterState([node]).nodes[0])
