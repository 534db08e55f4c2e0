"""ClusterState + Placer checked against a plain reference model (hypothesis stateful test).

The reference model is deliberately naive: a list of allocations, with every device's used
bytes, tenants and exclusive holder recomputed from it on each step, and whether a request can
run anywhere decided by brute force. The machine mixes the placer's placements with forged ones
(wrong model, too big, a device named twice, a whole GPU on a shared device, negative amounts),
releases, and nested checkpoint/rollback/commit; the placer runs with tiny cache bounds so its
memo and rankings are cleared mid-stream. After every step the real state must equal the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement import POLICIES, NoFit, Placement, Placer
from tessera.core.state import ClusterState
from tessera.core.units import GiB

MODELS = ("T4", "G3", "A100")


@dataclass
class Model:
    """What the state should hold: nodes as plain data and the allocations, nothing derived."""

    nodes: dict[str, Node]
    allocations: dict[str, Placement] = field(default_factory=dict)

    def device(self, node: str, i: int) -> GpuDevice:
        return sorted(self.nodes[node].gpus, key=lambda g: g.index)[i]

    def used(self, node: str, i: int) -> int:
        return sum(b for p in self.allocations.values() if p.node == node
                   for d, b in zip(p.devices, p.request_bytes, strict=True) if d == i)

    def holders(self, node: str, i: int) -> list[Placement]:
        return [p for p in self.allocations.values() if p.node == node and i in p.devices]

    def free_host(self, node: str) -> tuple[int, int]:
        held = [p for p in self.allocations.values() if p.node == node]
        n = self.nodes[node]
        return n.cpu_milli - sum(p.cpu_milli for p in held), n.memory - sum(p.memory for p in held)

    def valid(self, p: Placement) -> bool:
        if p.node not in self.nodes:
            return False
        if len(p.request_bytes) != len(p.devices) or len(p.limit_bytes) != len(p.devices):
            return False
        if len(set(p.devices)) != len(p.devices) or p.cpu_milli < 0 or p.memory < 0:
            return False
        cpu, mem = self.free_host(p.node)
        if p.cpu_milli > cpu or p.memory > mem:
            return False
        count = len(self.nodes[p.node].gpus)
        for i, want, limit in zip(p.devices, p.request_bytes, p.limit_bytes, strict=True):
            if not 0 <= i < count:
                return False
            dev = self.device(p.node, i)
            if p.models and dev.model not in p.models:
                return False
            if want <= 0 or limit < want:
                return False
            holders = self.holders(p.node, i)
            if p.exclusive and holders:
                return False
            if any(h.exclusive for h in holders):
                return False
            if want > dev.memory - self.used(p.node, i):
                return False
        return True

    def can_host(self, request: ResourceRequest) -> bool:
        """Brute force: some node has the CPU, the memory and enough suitable devices."""
        gpu = request.gpu
        for name, node in self.nodes.items():
            cpu, mem = self.free_host(name)
            if request.cpu_milli > cpu or request.memory > mem:
                continue
            if gpu.kind is GpuKind.NONE:
                return True
            suitable = 0
            for dev in node.gpus:
                if not gpu.allows(dev.model):
                    continue
                if gpu.kind is GpuKind.WHOLE:
                    suitable += not self.holders(name, dev.index)
                elif not any(h.exclusive for h in self.holders(name, dev.index)):
                    suitable += gpu.bytes_on(dev.memory) <= dev.memory - self.used(name, dev.index)
            if suitable >= gpu.devices:
                return True
        return False


@st.composite
def nodes_st(draw: st.DrawFn) -> list[Node]:
    out = []
    for n in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(MODELS))
        size = draw(st.sampled_from((16, 32))) * GiB
        gpus = tuple(GpuDevice(f"g{n}-{i}", i, size, model) for i in range(draw(st.integers(0, 4))))
        out.append(Node(f"n{n}", gpus, draw(st.integers(1, 16)) * 1000, draw(st.integers(1, 64)) * GiB))
    return out


@st.composite
def requests_st(draw: st.DrawFn) -> ResourceRequest:
    kind = draw(st.sampled_from((GpuKind.NONE, GpuKind.WHOLE, GpuKind.PORTION, GpuKind.PORTION, GpuKind.MEMORY)))
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    devices = draw(st.integers(1, 3))
    if kind is GpuKind.NONE:
        gpu = GpuRequest.none()
    elif kind is GpuKind.WHOLE:
        gpu = GpuRequest.whole(devices, models)
    elif kind is GpuKind.PORTION:
        gpu = GpuRequest.fraction(Decimal(draw(st.integers(1, 999))) / 1000, devices, None, models)
    else:
        gpu = GpuRequest.of_memory(draw(st.integers(1, 40)) * GiB // 2, devices, None, models)
    return ResourceRequest(gpu, draw(st.integers(0, 8)) * 500, draw(st.integers(0, 16)) * GiB)


class PlacementMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.counter = 0
        self.marks: list[tuple[int, dict[str, Placement]]] = []

    @initialize(nodes=nodes_st(), policy=st.sampled_from(POLICIES), memo=st.integers(1, 40),
                rankings=st.integers(1, 3))
    def setup(self, nodes: list[Node], policy: str, memo: int, rankings: int) -> None:
        self.model = Model({n.name: n for n in nodes})
        self.state = ClusterState(nodes)
        self.placer = Placer(self.state, policy, seed=7)
        self.placer.MAX_MEMO = memo
        self.placer.MAX_RANKINGS = rankings
        if hasattr(self.placer.policy, "fragmentation"):
            self.placer.policy.fragmentation.MAX_MEMO = memo

    def _assign(self, placement: Placement) -> None:
        self.counter += 1
        alloc_id = f"a{self.counter}"
        expected = self.model.valid(placement)
        try:
            self.state.assign(alloc_id, placement)
        except InvalidRequest:
            assert not expected, f"state refused a valid placement {placement}"
            return
        assert expected, f"state accepted an invalid placement {placement}"
        self.model.allocations[alloc_id] = placement

    @rule(request=requests_st())
    def place(self, request: ResourceRequest) -> None:
        where = self.placer.place(request)
        if isinstance(where, NoFit):
            assert not self.model.can_host(request), f"placer found no node for {request} but one fits"
            return
        gpu = request.gpu
        assert len(where.devices) == (0 if gpu.kind is GpuKind.NONE else gpu.devices)
        assert all(gpu.allows(self.model.device(where.node, d).model) for d in where.devices)
        assert self.model.valid(where), f"placer proposed an invalid placement {where}"
        self._assign(where)

    @rule(node=st.integers(0, 4), devices=st.lists(st.integers(-1, 4), max_size=3),
          sizes=st.lists(st.integers(-1, 40), min_size=3, max_size=3), exclusive=st.booleans(),
          whole=st.booleans(), cpu=st.integers(-1, 8), mem=st.integers(-1, 16),
          models=st.sets(st.sampled_from(MODELS), max_size=2), short=st.booleans())
    def forge(self, node: int, devices: list[int], sizes: list[int], exclusive: bool, whole: bool,
              cpu: int, mem: int, models: set[str], short: bool) -> None:
        """A placement built by hand: valid or not, the state must agree with the model."""
        name = f"n{node}"
        request_bytes = []
        for i, size in zip(devices, sizes, strict=False):
            n = self.model.nodes.get(name)
            if whole and n is not None and 0 <= i < len(n.gpus):
                request_bytes.append(self.model.device(name, i).memory)
            else:
                request_bytes.append(size * GiB // 2)
        if short and request_bytes:
            request_bytes.pop()
        placement = Placement(name, tuple(devices), tuple(request_bytes), tuple(request_bytes),
                              exclusive, cpu * 500, mem * GiB, frozenset(models))
        before = self._snapshot()
        try:
            self._assign(placement)
        except ValueError:  # pragma: no cover - a crash instead of a clear refusal
            raise AssertionError(f"assign crashed on {placement}") from None
        if placement not in self.model.allocations.values():
            assert self._snapshot() == before, "a refused placement changed the state"

    @rule(request=requests_st(), mutation=st.sampled_from(
        ("model", "bigger", "twice", "whole", "zero", "short", "cpu", "none")))
    def mutate(self, request: ResourceRequest, mutation: str) -> None:
        """The placer's own placement with one thing broken: the state must refuse exactly those."""
        where = self.placer.place(request)
        if not isinstance(where, Placement) or not where.devices:
            return
        d = where.devices[0]
        dev = self.model.device(where.node, d)
        if mutation == "model":
            where = replace(where, models=frozenset(m for m in MODELS if m != dev.model))
        elif mutation == "bigger":
            where = replace(where, request_bytes=(dev.memory + 1, *where.request_bytes[1:]),
                            limit_bytes=(dev.memory + 1, *where.limit_bytes[1:]))
        elif mutation == "twice":
            where = replace(where, devices=(d, *where.devices), request_bytes=where.request_bytes[:1] * 2
                            + where.request_bytes[1:], limit_bytes=where.limit_bytes[:1] * 2 + where.limit_bytes[1:])
        elif mutation == "whole":
            where = replace(where, exclusive=not where.exclusive)
        elif mutation == "zero":
            where = replace(where, request_bytes=(0, *where.request_bytes[1:]))
        elif mutation == "short":
            where = replace(where, limit_bytes=where.limit_bytes[1:])
        elif mutation == "cpu":
            where = replace(where, cpu_milli=-1)
        before = self._snapshot()
        self._assign(where)
        if where not in self.model.allocations.values():
            assert self._snapshot() == before, "a refused placement changed the state"

    @precondition(lambda self: bool(self.model.allocations))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        alloc_id = data.draw(st.sampled_from(sorted(self.model.allocations)))
        assert self.state.release(alloc_id) == self.model.allocations.pop(alloc_id)

    @precondition(lambda self: len(self.marks) < 3)
    @rule()
    def checkpoint(self) -> None:
        self.marks.append((self.state.checkpoint(), dict(self.model.allocations)))

    @precondition(lambda self: bool(self.marks))
    @rule()
    def rollback(self) -> None:
        mark, saved = self.marks.pop()
        self.state.rollback(mark)
        self.model.allocations = saved

    @precondition(lambda self: bool(self.marks))
    @rule()
    def commit(self) -> None:
        mark, _ = self.marks.pop()
        self.state.commit(mark)

    def _snapshot(self) -> list[tuple[object, ...]]:
        return [(ns.free_cpu, ns.free_mem, tuple(ns.dev_used), tuple(ns.dev_tenants)) for ns in self.state.nodes]

    @invariant()
    def state_matches_model(self) -> None:
        if not hasattr(self, "model"):
            return
        assert self.state.allocations == self.model.allocations
        for ns in self.state.nodes:
            assert (ns.free_cpu, ns.free_mem) == self.model.free_host(ns.name)
            for i in range(len(ns.dev_memory)):
                assert ns.dev_used[i] == self.model.used(ns.name, i)
                assert ns.dev_tenants[i] == len(self.model.holders(ns.name, i))
                assert 0 <= ns.dev_used[i] <= ns.dev_memory[i]
        expected = sum(self.model.used(name, d.index) / d.memory
                       for name, n in self.model.nodes.items() for d in n.gpus)
        assert abs(self.state.gpus_allocated() - expected) < 1e-9


PlacementMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPlacementStateModel = PlacementMachine.TestCase
