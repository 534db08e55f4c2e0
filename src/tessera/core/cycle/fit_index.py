"""The cluster's GPUs grouped for ``FitExplainer``: by device state, and nodes by the multiset of
their devices' states.

Every answer ``FitExplainer`` gives about a GPU request depends on a device only through its
*kind*: (memory, model, bytes used, compute promised, has a tenant, held whole). Two devices of
one kind fit, count and rank alike for any request; two nodes whose devices have the same kinds
(in any order) have the same count of fitting devices. So the explainer judges each kind once
per request and each node *profile* (the multiset of its devices' kinds) once per request,
instead of every device of every node (the cycle benchmark's 5,000-node end state: 2 kinds and 9
profiles against 40,000 devices). What depends on position (the first node with the most, the largest free GPU
with the lowest node and device index) is kept per kind and per profile as its first position
in node order.

The index is built once per cluster state it explains (one pass over the devices) and judged
per request; ``tests/core/cycle/test_fit_index.py`` checks the explanations against a scan of
every device on random clusters.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.model import COMPUTE_FULL, GpuKind, GpuRequest
from tessera.core.state import ClusterState, NodeState

from .kept_with import KeptWith

Kind = tuple[int, str, int, int, bool, bool]
"""memory, model, bytes used, compute promised, has a tenant, held whole"""


class KindsKept:
    """Each node's device kinds in device order and sorted (its profile), kept between the
    indexes of one ``ClusterState`` and computed again only for the nodes that changed since
    (``ClusterState.subscribe``): a warm session's state is the same object cycle after cycle,
    and most of its nodes end each cycle as they ended the last."""

    def __init__(self, state: ClusterState) -> None:
        # No reference to ``state`` here: it is the key of ``_KEPT``, held weakly.
        self.dirty = state.subscribe()
        self.kinds: dict[int, tuple[tuple[Kind, ...], tuple[Kind, ...]]] = {}

    def refresh(self, state: ClusterState) -> dict[int, tuple[tuple[Kind, ...], tuple[Kind, ...]]]:
        nodes = state.nodes
        for i in self.dirty:
            ns = nodes[i]
            keys = tuple(zip(ns.dev_memory, ns.dev_models, ns.dev_used, ns.dev_compute,
                             [t > 0 for t in ns.dev_tenants], ns.dev_whole, strict=True))
            self.kinds[i] = (keys, tuple(sorted(keys)))
        self.dirty.clear()
        return self.kinds


_KEPT: KeptWith[ClusterState, KindsKept] = KeptWith(KindsKept)


def kinds_of(state: ClusterState) -> dict[int, tuple[tuple[Kind, ...], tuple[Kind, ...]]]:
    """Node index -> its devices' kinds (in device order, sorted), up to date."""
    return _KEPT(state).refresh(state)


class DeviceIndex:
    """Device kinds and node profiles of a cluster state as it is now (rebuild after a
    change; what is kept between builds is ``KindsKept``)."""

    def __init__(self, state: ClusterState) -> None:
        kinds: dict[Kind, int] = {}
        self.kind_ids = kinds
        self.kinds: list[Kind] = []
        profiles: dict[tuple[Kind, ...], int] = {}
        self.profiles: list[tuple[tuple[int, int], ...]] = []
        """Per profile: (kind, how many devices of that kind), kinds ascending."""
        self.node_keys: dict[int, tuple[Kind, ...]] = {}
        """Node index -> the kind of each of its devices."""
        self.profile_of: dict[int, int] = {}
        """Node index -> profile."""
        kept = kinds_of(state)
        for ns in state.nodes:
            keys, sig = kept[ns.index]
            self.node_keys[ns.index] = keys
            p = profiles.get(sig)
            if p is None:
                p = profiles[sig] = len(self.profiles)
                pairs: dict[int, int] = {}
                for key in sig:
                    k = kinds.get(key)
                    if k is None:
                        k = kinds[key] = len(self.kinds)
                        self.kinds.append(key)
                    pairs[k] = pairs.get(k, 0) + 1
                self.profiles.append(tuple(pairs.items()))
            self.profile_of[ns.index] = p

    def view(self, nodes: Sequence[NodeState]) -> View:
        return View(self, nodes)


class View:
    """Some nodes of a ``DeviceIndex`` (in node order) grouped by profile."""

    def __init__(self, index: DeviceIndex, nodes: Sequence[NodeState]) -> None:
        self.index = index
        self.members: dict[int, list[NodeState]] = {}
        """Profile -> its nodes among these, in node order."""
        for ns in nodes:
            p = index.profile_of[ns.index]
            found = self.members.get(p)
            if found is None:
                self.members[p] = [ns]
            else:
                found.append(ns)
        self.first: dict[int, tuple[int, int]] = {}
        """Kind -> (node index, device index) of its first device among these nodes."""
        self.count: dict[int, int] = {}
        """Kind -> devices of that kind among these nodes."""
        for p, members in self.members.items():
            head = members[0].index
            ids = [index.kind_ids[key] for key in index.node_keys[head]]
            for k, c in index.profiles[p]:
                self.count[k] = self.count.get(k, 0) + c * len(members)
                pos = (head, ids.index(k))
                if k not in self.first or pos < self.first[k]:
                    self.first[k] = pos

    def judge(self, gpu: GpuRequest) -> Judged:
        return Judged(self, gpu)


class Judged:
    """One GPU request judged against every kind and profile of a ``View``."""

    def __init__(self, view: View, gpu: GpuRequest) -> None:
        self.view = view
        self.gpu = gpu
        index = view.index
        whole = gpu.kind is GpuKind.WHOLE
        units = gpu.compute_units
        allowed: dict[int, bool] = {}
        need: dict[int, int] = {}
        fits: dict[int, bool] = {}
        pods: dict[int, int] = {}
        shapes: dict[tuple[int, str], tuple[bool, int]] = {}
        for k in view.count:
            memory, model, used, compute, tenant, _whole = index.kinds[k]
            shape = shapes.get((memory, model))
            if shape is None:
                shape = shapes[(memory, model)] = (gpu.allows(model), gpu.bytes_on(memory))
            ok, n = shape
            allowed[k], need[k] = shape
            free = memory - used
            compute_free = COMPUTE_FULL - compute
            if whole:
                fits[k] = ok and not tenant
                pods[k] = 1 if ok and not tenant else 0
            else:
                fits[k] = ok and n <= free and units <= compute_free
                fit = free // n if ok and n > 0 else 0
                if ok and units:
                    fit = min(fit, compute_free // units)
                pods[k] = fit
        self.allowed, self.need, self.fits = allowed, need, fits
        self.counts = {p: sum(c for k, c in index.profiles[p] if fits[k]) for p in view.members}
        """Per profile: devices that fit the request on one of its nodes."""
        self.pods = {p: sum(c * pods[k] for k, c in index.profiles[p]) for p in view.members}
        """Per profile: pods of the request one of its nodes holds now (all its devices)."""

    def any_allowed(self) -> bool:
        return any(self.allowed.values())

    def largest(self) -> tuple[int, int, int, int]:
        """(free bytes, node index, device, bytes needed there) of the allowed GPU with the most
        free memory, the first in node order among equals (requires ``any_allowed``)."""
        best: tuple[int, int, int, int] | None = None
        kinds = self.view.index.kinds
        for k, (node, dev) in self.view.first.items():
            if not self.allowed[k]:
                continue
            memory, _model, used = kinds[k][:3]
            free = memory - used
            if best is None or free > best[0] or (free == best[0] and (node, dev) < (best[1], best[2])):
                best = (free, node, dev, self.need[k])
        assert best is not None
        return best

    def best(self) -> tuple[int, NodeState | None]:
        """The most fitting devices on one node and the first node with that many (None when
        the most is 0)."""
        top, node = 0, None
        for p, members in self.view.members.items():
            c = self.counts[p]
            if c > top or (c == top and node is not None and members[0].index < node.index):
                top, node = c, members[0]
        return top, node

    def nodes_with(self, devices: int) -> list[NodeState]:
        """The nodes with at least ``devices`` fitting devices, in node order."""
        found = [ns for p, members in self.view.members.items() if self.counts[p] >= devices
                 for ns in members]
        found.sort(key=lambda ns: ns.index)
        return found

    def pods_on(self, ns: NodeState) -> int:
        """``_pods_that_fit``: pods of the request the node's free GPU memory holds now."""
        return self.pods[self.view.index.profile_of[ns.index]] // max(self.gpu.devices, 1)

    def timed(self) -> tuple[int, tuple[int, int, int]] | None:
        """For ``compute_reason``: how many GPUs have the request's memory (not held whole), and
        (unpromised time, node index, device) of the one with the most, first in node order;
        None when one of them also has the time (or none has the memory)."""
        want = self.gpu.compute_units
        kinds = self.view.index.kinds
        roomy = 0
        best: tuple[int, int, int] | None = None
        for k, (node, dev) in self.view.first.items():
            memory, _model, used, compute, _tenant, whole = kinds[k]
            if not self.allowed[k] or whole or self.need[k] > memory - used:
                continue
            roomy += self.view.count[k]
            free = COMPUTE_FULL - compute
            if free >= want:
                return None
            if best is None or free > best[0] or (free == best[0] and (node, dev) < (best[1], best[2])):
                best = (free, node, dev)
        return None if best is None else (roomy, best)
