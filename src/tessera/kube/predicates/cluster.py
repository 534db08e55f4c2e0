"""The cluster as the predicates see it in one cycle: nodes (labels, taints, resources), the
namespaces' labels, and every other pod with where it is.

Pods of other schedulers are where the API server says; tessera's own pods are asked of the
cycle (``PlacedPods.node_of``), so pods placed earlier in the same cycle (a gang's members, a
Deployment's replicas) count, and pods evicted in it do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tessera.core.constraints import PlacedPods
from tessera.kube.predicates.spec import (
    TAINT_NOT_READY,
    TAINT_UNSCHEDULABLE,
    HostPort,
    PodAffinityTerm,
    SchedulingSpec,
    Taint,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    """Its taints, plus the lifecycle taint Kubernetes' node controller would add (not-ready,
    unschedulable) where the node's state says so and the taint is not there yet."""
    unschedulable: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)
    """Allocatable resources the core does not account (milli-units)."""
    gpu_closed: str = ""
    """Why tessera-node keeps this GPU node closed to GPU pods ('' when open)."""

    @property
    def closed(self) -> bool:
        return bool(self.gpu_closed or self.unschedulable
                    or any(t.effect in ("NoSchedule", "NoExecute") for t in self.taints))


def node_facts(name: str, labels: Mapping[str, str], taints: tuple[Taint, ...], *,
               unschedulable: bool, ready: bool, resources: Mapping[str, int],
               gpu_closed: str = "") -> NodeFacts:
    keys = {(t.key, t.effect) for t in taints}
    extra = []
    if not ready and (TAINT_NOT_READY, "NoSchedule") not in keys and (TAINT_NOT_READY, "NoExecute") not in keys:
        extra.append(Taint(TAINT_NOT_READY, "", "NoSchedule"))
    if unschedulable and (TAINT_UNSCHEDULABLE, "NoSchedule") not in keys:
        extra.append(Taint(TAINT_UNSCHEDULABLE, "", "NoSchedule"))
    return NodeFacts(name, labels, taints + tuple(extra), unschedulable, resources, gpu_closed)


@dataclass(frozen=True, slots=True)
class OtherPod:
    """A pod that is not the one being placed."""

    namespace: str
    labels: Mapping[str, str]
    spec: SchedulingSpec | None
    node: str | None = None
    """Where it is, for pods of other schedulers; None: ask the cycle (``ref``)."""
    ref: tuple[str, int] | None = None
    """(workload id, pod index) in the cycle's snapshot."""
    start_node: str | None = None
    """Where a snapshot pod was when the cycle began (for scores and reasons)."""
    resources: Mapping[str, int] = field(default_factory=dict)
    ports: tuple[HostPort, ...] = ()

    def where(self, placed: PlacedPods | None) -> str | None:
        if self.ref is None:
            return self.node
        if placed is None:
            return self.start_node
        return placed.node_of(*self.ref)


class ClusterView:
    """Rebuilt by the snapshot builder before each cycle (``reset``); constraints hold the one
    view of their scheduler and read it while the cycle runs. Derived tables (which pods match
    a term, ...) are computed on first use and kept until the next ``reset``."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeFacts] = {}
        self.namespaces: Mapping[str, Mapping[str, str]] = {}
        self.pods: list[OtherPod] = []
        self.cache: dict[Any, Any] = {}
        self.generation = 0
        self.facts_version = 0
        """Changes only when some node's facts do (a node added, removed or given new facts):
        what a constraint's static answers stand on (``KubeConstraint.static_token``)."""

    def reset(self, nodes: dict[str, NodeFacts], namespaces: Mapping[str, Mapping[str, str]],
              pods: list[OtherPod]) -> None:
        old = self.nodes
        if len(old) != len(nodes) or any(old.get(k) is not f for k, f in nodes.items()):
            self.facts_version += 1  # the builder keeps one NodeFacts per unchanged node
        self.nodes = nodes
        self.namespaces = namespaces
        self.pods = pods
        self.cache = {}
        self.generation += 1

    def memo(self, key: Any, compute: Callable[[], T]) -> T:
        if key in self.cache:
            return self.cache[key]  # type: ignore[no-any-return]
        found = self.cache[key] = compute()
        return found

    def _candidates(self, term: PodAffinityTerm) -> list[OtherPod]:
        """Pods that may match ``term``: those carrying one label it requires (``In`` with
        one value, as matchLabels are), else all."""
        sel = term.selector
        if sel is not None:
            for r in sel.requirements:
                if r.operator == "In" and len(r.values) == 1:
                    index = self.memo("label-index", self._label_index)
                    return index.get((r.key, r.values[0]), [])
        return self.pods

    def _label_index(self) -> dict[tuple[str, str], list[OtherPod]]:
        index: dict[tuple[str, str], list[OtherPod]] = {}
        for p in self.pods:
            for kv in p.labels.items():
                index.setdefault(kv, []).append(p)
        return index

    def matching(self, term: PodAffinityTerm) -> list[OtherPod]:
        """Pods a pod-affinity term selects (namespaces and labels)."""
        return self.memo(("term", term), lambda: [
            p for p in self._candidates(term) if term.matches_pod(p.namespace, p.labels, self.namespaces)])

    def matching_all(self, terms: tuple[PodAffinityTerm, ...]) -> list[OtherPod]:
        return self.memo(("all", terms), lambda: [
            p for p in (self._candidates(terms[0]) if terms else self.pods)
            if all(t.matches_pod(p.namespace, p.labels, self.namespaces) for t in terms)])

    def anti_holders(self) -> list[tuple[OtherPod, PodAffinityTerm]]:
        """(pod, term) for every required anti-affinity term of every other pod."""
        return self.memo("anti-holders", lambda: [
            (p, t) for p in self.pods if p.spec is not None for t in p.spec.anti_affinity])

    def symmetric_anti(self, namespace: str, labels: tuple[tuple[str, str], ...]) -> list[tuple[OtherPod, PodAffinityTerm]]:
        """Existing pods' anti-affinity terms that a pod with these labels matches."""
        lab = dict(labels)
        return self.memo(("sym", namespace, labels), lambda: [
            (p, t) for p, t in self.anti_holders() if t.matches_pod(namespace, lab, self.namespaces)])

    def port_holders(self) -> list[OtherPod]:
        return self.memo("ports", lambda: [p for p in self.pods if p.ports])

    def resource_holders(self) -> list[OtherPod]:
        return self.memo("resources", lambda: [p for p in self.pods if p.resources])

    def in_namespace(self, namespace: str) -> list[OtherPod]:
        return self.memo(("ns", namespace), lambda: [p for p in self.pods if p.namespace == namespace])

    def label(self, node: str | None, key: str) -> str | None:
        if node is None:
            return None
        facts = self.nodes.get(node)
        return None if facts is None else facts.labels.get(key)


def domains(view: ClusterView, pods: Iterable[OtherPod], key: str, placed: PlacedPods | None) -> set[str]:
    """The values of node label ``key`` on the nodes where these pods are."""
    out = set()
    for p in pods:
        v = view.label(p.where(placed), key)
        if v is not None:
            out.add(v)
    return out
