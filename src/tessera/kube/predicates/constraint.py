"""The core's ``NodeConstraint`` for a Kubernetes pod: kube-scheduler's filter plugins as the
static and dynamic filters, its score plugins (default weights) as the preference."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tessera.core.constraints import PlacedPods
from tessera.core.model import Node
from tessera.kube.predicates.cluster import ClusterView, NodeFacts
from tessera.kube.predicates.plugins import (
    DYNAMIC_FILTERS,
    NO_SPEC,
    STATIC_FILTERS,
    WEIGHTS,
    Pod,
    inter_pod_affinity_score,
    node_affinity_score,
    pod_topology_spread_score,
    taint_toleration_score,
    topology_placement_score,
)
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.predicates.topology import Domain

_UNKNOWN = NodeFacts("", {})


@dataclass(unsafe_hash=True)
class KubeConstraint:
    """Equal pods (same spec, both asking or not asking a GPU) share one constraint, so the
    placer ranks nodes once for all of them."""

    pod: Pod
    view: ClusterView = field(compare=False, repr=False)
    symmetric: bool = False
    """Some existing pod's required anti-affinity selects this pod."""
    dynamic: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.dynamic = self.symmetric or self.pod.spec.dynamic

    def _facts(self, node: Node) -> NodeFacts:
        return self.view.nodes.get(node.name) or NodeFacts(node.name, node.labels)

    def static_reason(self, facts: NodeFacts) -> str | None:
        for f in STATIC_FILTERS:
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
        return self.static_reason(self._facts(node)) is None

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return self.dynamic_reason(self._facts(node), placed) is None

    def score(self, node: Node) -> float:
        facts = self._facts(node)
        parts = (
            ("TopologyPlacement", topology_placement_score(self.pod, facts)),
            ("NodeAffinity", node_affinity_score(self.pod, facts)),
            ("TaintToleration", taint_toleration_score(self.pod, facts)
             if self.view.memo("soft-taints", lambda: any(
                 t.effect == "PreferNoSchedule" for f in self.view.nodes.values() for t in f.taints))
             else None),
            ("InterPodAffinity", inter_pod_affinity_score(self.pod, facts, self.view)),
            ("PodTopologySpread", pod_topology_spread_score(self.pod, facts, self.view)),
        )
        total = weight = 0.0
        for name, s in parts:
            if s is not None:
                total += WEIGHTS[name] * s
                weight += WEIGHTS[name]
        return total / weight if weight else 0.0

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
