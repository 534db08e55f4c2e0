"""The mutable view of a cluster that placement and the cycle work on.

``ClusterState`` holds what is free on every node and device and which allocation holds what.
Changes can be simulated: ``checkpoint()`` marks a point, ``rollback()`` undoes everything after
it, ``commit()`` keeps it. Observers (placement caches) subscribe to learn which nodes changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tessera.core.errors import InvalidRequest
from tessera.core.model import COMPUTE_FULL, Node


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one pod runs: a node, its device indices and what it holds on each."""

    node: str
    devices: tuple[int, ...] = ()
    request_bytes: tuple[int, ...] = ()
    """Guaranteed bytes on each device (the whole device for exclusive GPUs)."""
    limit_bytes: tuple[int, ...] = ()
    """Burst cap on each device; equal to the request when no limit was asked."""
    exclusive: bool = False
    """Whole GPUs: no other tenant may share these devices."""
    cpu_milli: int = 0
    memory: int = 0
    models: frozenset[str] = frozenset()
    """GPU models the request allows on its devices; empty: any model."""
    gpus: float | None = None
    """GPUs it counts as for quota and fair share when its GPU is none of the node's devices
    (a MIG partition: the profile's fraction, tessera.core.mig); None: counted from devices."""
    compute: int = 0
    """Compute request on each of its devices, in millionths of a device's time
    (``GpuRequest.compute_units``): the promises on a device stay within ``COMPUTE_FULL``."""


class NodeState:
    """Free capacity of one node. Mutated only through ClusterState."""

    __slots__ = (
        "dev_compute",
        "dev_memory",
        "dev_models",
        "dev_tenants",
        "dev_used",
        "dev_whole",
        "free_cpu",
        "free_mem",
        "homogeneous",
        "index",
        "node",
        "sid",
        "sig",
        "static_id",
    )

    def __init__(self, node: Node, index: int, static_id: int) -> None:
        self.node = node
        self.index = index
        self.static_id = static_id
        self.free_cpu = node.cpu_milli
        self.free_mem = node.memory
        gpus = sorted(node.gpus, key=lambda g: g.index)
        self.dev_memory = [g.schedulable for g in gpus]
        self.dev_models = [g.model for g in gpus]
        self.dev_used = [0] * len(gpus)
        self.dev_compute = [0] * len(gpus)
        """Compute requests promised on each device, in millionths of its time."""
        self.dev_tenants = [0] * len(gpus)
        self.dev_whole = [False] * len(gpus)
        """Held by a whole-GPU (exclusive) placement: no one else may take a share of it."""
        self.homogeneous = len(set(zip(self.dev_memory, self.dev_models, strict=True))) <= 1
        self.sig: tuple[object, ...] | None = None
        self.sid: int | None = None
        """A small id of ``signature()`` (``ClusterState.signature_id``), kept until it changes."""

    @property
    def name(self) -> str:
        return self.node.name

    def dev_free(self, i: int) -> int:
        return self.dev_memory[i] - self.dev_used[i]

    def dev_compute_free(self, i: int) -> int:
        """Millionths of device ``i``'s time no share is promised."""
        return COMPUTE_FULL - self.dev_compute[i]

    def signature(self) -> tuple[object, ...]:
        """Everything placement decisions on this node depend on (cached until it changes)."""
        if self.sig is None:
            self.sig = (self.static_id, self.free_cpu, self.free_mem, tuple(self.dev_used),
                        tuple(self.dev_compute))
        return self.sig

    def gpus_total(self) -> int:
        return len(self.dev_memory)

    def gpus_allocated(self) -> float:
        return sum(u / m for u, m in zip(self.dev_used, self.dev_memory, strict=True))


class ClusterState:
    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes: list[NodeState] = []
        self.by_name: dict[str, NodeState] = {}
        self.allocations: dict[str, Placement] = {}
        self._statics: dict[tuple[object, ...], int] = {}
        self._undo: list[tuple[str, str, Placement]] = []
        self._open = 0
        self._listeners: list[set[int]] = []
        self._sig_ids: dict[tuple[object, ...], int] = {}
        self._next_sig = 0
        for node in nodes:
            self.add_node(node)

    def add_node(self, node: Node) -> NodeState:
        if node.name in self.by_name:
            raise InvalidRequest("node.name", "must be unique in the cluster", node.name)
        ns = NodeState(node, len(self.nodes), 0)
        static = (node.cpu_milli, node.memory, tuple(zip(ns.dev_memory, ns.dev_models, strict=True)),
                  node.nvlink)
        ns.static_id = self._statics.setdefault(static, len(self._statics))
        self.nodes.append(ns)
        self.by_name[node.name] = ns
        self._touch(ns.index)
        return ns

    MAX_SIGNATURE_IDS = 200_000

    def signature_id(self, ns: NodeState) -> int:
        """An int standing for ``ns.signature()``: equal signatures get one id while both are
        known, and an id is never given to another signature (ids are not reused when the
        table is cleared), so a memo keyed by it never answers for another node state."""
        sid = ns.sid
        if sid is None:
            sig = ns.signature()
            ids = self._sig_ids
            sid = ids.get(sig)
            if sid is None:
                if len(ids) >= self.MAX_SIGNATURE_IDS:
                    ids.clear()
                sid = ids[sig] = self._next_sig
                self._next_sig += 1
            ns.sid = sid
        return sid

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self.nodes)

    def subscribe(self) -> set[int]:
        """A set that receives the index of every node that changes from now on."""
        dirty = set(range(len(self.nodes)))
        self._listeners.append(dirty)
        return dirty

    def unsubscribe(self, dirty: set[int]) -> None:
        self._listeners = [s for s in self._listeners if s is not dirty]

    def _touch(self, index: int) -> None:
        for dirty in self._listeners:
            dirty.add(index)

    # -- allocations --------------------------------------------------------------------------

    def fits(self, placement: Placement) -> str | None:
        """Why this placement cannot be applied now, or None if it can.

        The common case (it fits) is answered by one pass with the node's lists held in
        locals; anything that pass does not accept gets the full check, which words the
        first rule broken (``tests/core/test_state_fits.py`` compares the two)."""
        ns = self.by_name.get(placement.node)
        if ns is not None:
            cpu, mem, compute = placement.cpu_milli, placement.memory, placement.compute
            devices = placement.devices
            wants = placement.request_bytes
            limits = placement.limit_bytes
            n = len(devices)
            if (0 <= cpu <= ns.free_cpu and 0 <= mem <= ns.free_mem and 0 <= compute <= COMPUTE_FULL
                    and len(wants) == n and len(limits) == n
                    and (n < 2 or len(set(devices)) == n)):
                if not n:
                    return None
                size, used, dev_compute = ns.dev_memory, ns.dev_used, ns.dev_compute
                whole, tenants, models = ns.dev_whole, ns.dev_tenants, placement.models
                count = len(size)
                exclusive = placement.exclusive
                room = COMPUTE_FULL - compute
                for i, want, limit in zip(devices, wants, limits, strict=True):
                    if not (0 <= i < count and 0 < want <= limit and want <= size[i] - used[i]
                            and dev_compute[i] <= room and not whole[i]
                            and not (exclusive and tenants[i])
                            and (not models or ns.dev_models[i] in models)):
                        break
                else:
                    return None
        return self._why_not(placement)

    def _why_not(self, placement: Placement) -> str | None:
        """``fits`` rule by rule, in the order the reasons are given."""
        ns = self.by_name.get(placement.node)
        if ns is None:
            return f"node {placement.node} is not in the cluster"
        if placement.cpu_milli < 0 or placement.memory < 0:
            return "cpu and memory must be 0 or more"
        if placement.cpu_milli > ns.free_cpu or placement.memory > ns.free_mem:
            return f"node {ns.name} lacks CPU or memory"
        if len(set(placement.devices)) != len(placement.devices):
            return "a device is named twice"
        if not len(placement.request_bytes) == len(placement.limit_bytes) == len(placement.devices):
            return "request_bytes and limit_bytes must give one amount per device"
        for i, want, limit in zip(placement.devices, placement.request_bytes, placement.limit_bytes, strict=True):
            if not 0 <= i < len(ns.dev_memory):
                return f"node {ns.name} has no GPU {i}"
            if placement.models and ns.dev_models[i] not in placement.models:
                return (
                    f"GPU {i} of node {ns.name} is a {ns.dev_models[i]}, not "
                    f"{'|'.join(sorted(placement.models))}"
                )
            if want <= 0 or limit < want:
                return f"GPU {i} of node {ns.name}: a share must hold 1 byte or more, at most its limit"
            if ns.dev_whole[i]:
                return f"GPU {i} of node {ns.name} is held whole by another pod"
            if placement.exclusive and ns.dev_tenants[i]:
                return f"GPU {i} of node {ns.name} is shared"
            if want > ns.dev_free(i):
                return f"GPU {i} of node {ns.name} has too little memory free"
            if placement.compute > ns.dev_compute_free(i):
                return (f"GPU {i} of node {ns.name} has {ns.dev_compute_free(i) / COMPUTE_FULL:g} of "
                        f"its time unpromised, less than the compute request "
                        f"{placement.compute / COMPUTE_FULL:g}")
        if not 0 <= placement.compute <= COMPUTE_FULL:
            return f"a compute request must be within [0, 1] of a device's time ({placement.compute})"
        return None

    def assign(self, alloc_id: str, placement: Placement) -> None:
        if alloc_id in self.allocations:
            raise InvalidRequest("allocation", "is already placed", alloc_id)
        problem = self.fits(placement)
        if problem is not None:
            raise InvalidRequest(f"allocation {alloc_id}", problem)
        self._apply(placement, +1)
        self.allocations[alloc_id] = placement
        if self._open:
            self._undo.append(("assign", alloc_id, placement))

    def load(self, items: Sequence[tuple[str, Placement]]) -> bool:
        """Assign every (id, placement) into a state that holds none yet, as ``assign`` one
        by one would, in one pass: each placement's own rules (node, amounts, devices,
        models) are checked as it is applied, the capacity rules once per node at the end.
        Amounts only add up, so a node whose totals fit had every prefix fit too, and a
        whole GPU with one tenant met no other (docs/scheduling.md, "Building a session").
        If anything fails, nothing is kept and False is returned: the caller assigns one by
        one, which names the first placement that does not fit."""
        if self.allocations or self._open:
            raise RuntimeError("load: the state already holds allocations")
        by_name, allocations = self.by_name, self.allocations
        touched: dict[int, NodeState] = {}
        ok = True
        for alloc_id, p in items:
            ns = by_name.get(p.node)
            cpu, mem, compute = p.cpu_milli, p.memory, p.compute
            devices, wants, limits = p.devices, p.request_bytes, p.limit_bytes
            n = len(devices)
            if (ns is None or alloc_id in allocations or cpu < 0 or mem < 0
                    or not 0 <= compute <= COMPUTE_FULL or len(wants) != n or len(limits) != n
                    or (n > 1 and len(set(devices)) != n)):
                ok = False
                break
            touched[ns.index] = ns
            allocations[alloc_id] = p
            ns.free_cpu -= cpu
            ns.free_mem -= mem
            if n:
                count, models, dev_models = len(ns.dev_memory), p.models, ns.dev_models
                used, dev_compute, tenants = ns.dev_used, ns.dev_compute, ns.dev_tenants
                for i, want, limit in zip(devices, wants, limits, strict=True):
                    if not (0 <= i < count and 0 < want <= limit
                            and (not models or dev_models[i] in models)):
                        ok = False
                        break
                    used[i] += want
                    dev_compute[i] += compute
                    tenants[i] += 1
                    if p.exclusive:
                        ns.dev_whole[i] = True
                if not ok:
                    break
        if ok:
            for ns in touched.values():
                if (ns.free_cpu < 0 or ns.free_mem < 0
                        or any(u > m for u, m in zip(ns.dev_used, ns.dev_memory, strict=True))
                        or any(c > COMPUTE_FULL for c in ns.dev_compute)
                        or any(w and t > 1 for w, t in zip(ns.dev_whole, ns.dev_tenants, strict=True))):
                    ok = False
                    break
        for ns in touched.values():
            if not ok:  # back to empty
                ns.free_cpu, ns.free_mem = ns.node.cpu_milli, ns.node.memory
                count = len(ns.dev_memory)
                ns.dev_used, ns.dev_compute = [0] * count, [0] * count
                ns.dev_tenants, ns.dev_whole = [0] * count, [False] * count
            ns.sig = None
            ns.sid = None
            self._touch(ns.index)
        if not ok:
            allocations.clear()
        return ok

    def release(self, alloc_id: str) -> Placement:
        placement = self.allocations.pop(alloc_id)
        self._apply(placement, -1)
        if self._open:
            self._undo.append(("release", alloc_id, placement))
        return placement

    def _apply(self, p: Placement, sign: int) -> None:
        ns = self.by_name[p.node]
        ns.free_cpu -= sign * p.cpu_milli
        ns.free_mem -= sign * p.memory
        if p.devices:
            used, dev_compute, tenants = ns.dev_used, ns.dev_compute, ns.dev_tenants
            compute = sign * p.compute
            for i, nbytes in zip(p.devices, p.request_bytes, strict=True):
                used[i] += sign * nbytes
                dev_compute[i] += compute
                tenants[i] += sign
            if p.exclusive:
                whole = ns.dev_whole
                for i in p.devices:
                    whole[i] = sign > 0
        ns.sig = None
        ns.sid = None
        for dirty in self._listeners:
            dirty.add(ns.index)

    # -- transactions -------------------------------------------------------------------------

    def checkpoint(self) -> int:
        self._open += 1
        return len(self._undo)

    def rollback(self, mark: int) -> None:
        while len(self._undo) > mark:
            op, alloc_id, placement = self._undo.pop()
            if op == "assign":
                del self.allocations[alloc_id]
                self._apply(placement, -1)
            else:
                self.allocations[alloc_id] = placement
                self._apply(placement, +1)
        self._close()

    def commit(self, mark: int) -> None:
        """Keep the changes since ``mark``; an enclosing checkpoint can still undo them."""
        self._close()

    def _close(self) -> None:
        if self._open <= 0:
            raise RuntimeError("no open checkpoint")
        self._open -= 1
        if not self._open:
            self._undo.clear()

    # -- totals -------------------------------------------------------------------------------

    def gpus_total(self) -> int:
        return sum(ns.gpus_total() for ns in self.nodes)

    def gpus_allocated(self) -> float:
        return sum(ns.gpus_allocated() for ns in self.nodes)
