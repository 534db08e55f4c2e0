"""The core's ``NodeConstraint`` for a Kubernetes pod: kube-scheduler's filter plugins as the
static and dynamic filters, its score plugins (default weights) as the preference."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.core.constraints import PlacedPods
from tessera.core.model import Node
from tessera.kube.predicates.cluster import ClusterView, NodeFacts
from tessera.kube.predicates.plugins import (
    DYNAMIC_FILTERS,
    NO_SPEC,
    WEIGHTS,
    Pod,
    StaticFilter,
    gpu_node_ready_filter,
    inter_pod_affinity_score,
    node_affinity_filter,
    node_affinity_score,
    node_unschedulable_filter,
    pod_topology_spread_score,
    taint_toleration_filter,
    taint_toleration_score,
    topology_placement_filter,
    topology_placement_score,
)
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.predicates.topology import Domain

ScoreFn = Callable[[NodeFacts], "float | None"]
_STATIC_SCORES = frozenset(("NodeAffinity", "TaintToleration", "TopologyPlacement"))
"""Scores that read only the pod and the node's facts (the others read the pods placed)."""


def _cluster_flags(view: ClusterView) -> dict[str, bool]:
    """What the cluster holds this cycle that makes a filter or score worth asking."""
    nodes = view.nodes.values()
    return {
        "unschedulable": any(f.unschedulable for f in nodes),
        "hard-taints": any(t.effect in ("NoSchedule", "NoExecute") for f in nodes for t in f.taints),
        "soft-taints": any(t.effect == "PreferNoSchedule" for f in nodes for t in f.taints),
        "gpu-closed": any(f.gpu_closed for f in nodes),
        "soft-pod-terms": any(p.spec is not None and (
            p.spec.preferred_affinity or p.spec.preferred_anti_affinity or p.spec.affinity)
            for p in view.pods),
    }


@dataclass(eq=True)
class KubeConstraint:
    """Equal pods (same spec, both asking or not asking a GPU) share one constraint, so the
    placer ranks nodes once for all of them."""

    pod: Pod
    view: ClusterView = field(compare=False, repr=False)
    symmetric: bool = False
    """Some existing pod's required anti-affinity selects this pod."""
    dynamic: bool = field(init=False, compare=False)
    _planned: tuple[int, tuple[StaticFilter, ...], tuple[tuple[str, ScoreFn], ...]] | None = field(
        init=False, compare=False, default=None, repr=False)

    _hash: int = field(init=False, compare=False, default=0, repr=False)
    _allowed: dict[str, tuple[NodeFacts, tuple[StaticFilter, ...], bool]] = field(
        init=False, compare=False, default_factory=dict, repr=False)
    """Node -> (its facts, the filters asked, the answer): the static filters read only the pod
    and the node's facts, so while both are the same objects the answer stands, across cycles
    too (the snapshot keeps one constraint per distinct pod spec and one NodeFacts per unchanged
    node; 60 constraints × 2,000 nodes asked every cycle were a quarter of a cycle)."""

    _scored: dict[str, tuple[NodeFacts, tuple[str, ...], float]] = field(
        init=False, compare=False, default_factory=dict, repr=False)
    """Node -> (its facts, the scores asked, the preference), kept as ``_allowed`` is, while
    every score asked reads only the pod and the node's facts (not the pods placed)."""

    def __post_init__(self) -> None:
        self.dynamic = self.symmetric or self.pod.spec.dynamic
        self._hash = hash((self.pod, self.symmetric))

    def __hash__(self) -> int:
        # Asked for every placement of every pod (rankings are keyed by constraint); the spec's
        # hash walks nested tuples, so it is computed once.
        return self._hash

    def _facts(self, node: Node) -> NodeFacts:
        return self.view.nodes.get(node.name) or NodeFacts(node.name, node.labels)

    def _plan(self) -> tuple[tuple[StaticFilter, ...], tuple[tuple[str, ScoreFn], ...]]:
        """The filters and scores that can matter for this pod in this cycle's cluster (asked
        once: most pods on most clusters need few of them, and this runs per node)."""
        found = self._planned
        if found is not None and found[0] == self.view.generation:
            return found[1], found[2]
        view, pod, spec = self.view, self.pod, self.pod.spec
        flags = view.memo("flags", lambda: _cluster_flags(view))
        filters: list[StaticFilter] = []
        if flags["unschedulable"]:
            filters.append(node_unschedulable_filter)
        if spec.node_selector or spec.required_terms is not None:
            filters.append(node_affinity_filter)
        if flags["hard-taints"]:
            filters.append(taint_toleration_filter)
        if pod.gpu and flags["gpu-closed"]:
            filters.append(gpu_node_ready_filter)
        if pod.domain is not None and pod.domain.required:
            filters.append(topology_placement_filter)
        scores: list[tuple[str, ScoreFn]] = []
        if pod.domain is not None and not pod.domain.required:
            scores.append(("TopologyPlacement", lambda f: topology_placement_score(pod, f)))
        if spec.preferred_terms:
            scores.append(("NodeAffinity", lambda f: node_affinity_score(pod, f)))
        if flags["soft-taints"]:
            scores.append(("TaintToleration", lambda f: taint_toleration_score(pod, f)))
        if spec.preferred_affinity or spec.preferred_anti_affinity or flags["soft-pod-terms"]:
            scores.append(("InterPodAffinity", lambda f: inter_pod_affinity_score(pod, f, view)))
        if any(not c.hard for c in spec.spread):
            scores.append(("PodTopologySpread", lambda f: pod_topology_spread_score(pod, f, view)))
        self._planned = (view.generation, tuple(filters), tuple(scores))
        return self._planned[1], self._planned[2]

    def static_reason(self, facts: NodeFacts) -> str | None:
        for f in self._plan()[0]:
            why = f(self.pod, facts)
            if why is not None:
                return why
        return None

    def dynamic_reason(self, facts: NodeFacts, placed: PlacedPods | None) -> str | None:
        for f in DYNAMIC_FILTERS:
            why = f(self.pod, facts, self.view, placed)
            if why is not None:
                return why
        return None

    def allows(self, node: Node) -> bool:
        filters = self._plan()[0]
        if not filters:
            return True
        facts = self._facts(node)
        got = self._allowed.get(node.name)
        if got is not None and got[0] is facts and got[1] == filters:
            return got[2]
        ok = all(f(self.pod, facts) is None for f in filters)
        self._allowed[node.name] = (facts, filters, ok)
        return ok

    def static_token(self) -> tuple[Any, ...] | None:
        """The placer keeps this constraint's static answers across cycles while this is equal
        (tessera.core.constraints.static_token): the static filters and scores read only the
        pod and the nodes' facts, so they stand while the facts and the plan do. None where a
        score reads the pods placed (inter-pod affinity, spread)."""
        filters, scores = self._plan()
        names = tuple(name for name, _ in scores)
        if not _STATIC_SCORES.issuperset(names):
            return None
        return (self.view.facts_version, filters, names)

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return self.dynamic_reason(self._facts(node), placed) is None

    def score(self, node: Node) -> float:
        scores = self._plan()[1]
        if not scores:
            return 0.0
        facts = self._facts(node)
        names = tuple(name for name, _ in scores)
        static = _STATIC_SCORES.issuperset(names)
        if static:
            got = self._scored.get(node.name)
            if got is not None and got[0] is facts and got[1] == names:
                return got[2]
        total = weight = 0.0
        for name, fn in scores:
            s = fn(facts)
            if s is not None:
                total += WEIGHTS[name] * s
                weight += WEIGHTS[name]
        result = total / weight if weight else 0.0
        if static:
            self._scored[node.name] = (facts, names, result)
        return result

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        """Per reason, how many nodes refuse the pod: static filters, then the dynamic ones as
        the cycle began (the first failing plugin per node, as kube-scheduler reports)."""
        counts: Counter[str] = Counter()
        for n in nodes:
            facts = self._facts(n)
            why = self.static_reason(facts)
            if why is None and self.dynamic:
                why = self.dynamic_reason(facts, None)
            if why is not None:
                counts[why] += 1
        return ", ".join(f"{c} {why}" for why, c in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def constraint_for(spec: SchedulingSpec | None, gpu: bool, view: ClusterView,
                   symmetric: bool = False, domain: Domain | None = None) -> KubeConstraint:
    return KubeConstraint(Pod(spec or NO_SPEC, gpu, domain), view, symmetric)
