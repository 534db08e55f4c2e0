"""kube-scheduler's filter and score plugins, with its documented semantics, named for the
plugin and phase they mirror. A filter returns None (the node passes) or the reason in
kube-scheduler's words, counted per reason in a pod's pending message; a score returns 0..1.

Static filters depend only on the node (asked once per node per cycle); dynamic ones also look
at where other pods are at that moment of the cycle (``placed``; None: as the cycle began).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from tessera.core.constraints import PlacedPods
from tessera.kube.names import MIG_RESOURCE_PREFIX
from tessera.kube.predicates.cluster import ClusterView, NodeFacts, OtherPod, domains
from tessera.kube.predicates.spec import (
    TAINT_UNSCHEDULABLE,
    SchedulingSpec,
    SpreadConstraint,
    Taint,
)
from tessera.kube.predicates.topology import Domain

NO_SPEC = SchedulingSpec("", ())


@dataclass(frozen=True, slots=True)
class Pod:
    """The pod being placed, as the plugins need it."""

    spec: SchedulingSpec
    gpu: bool
    """It asks for a GPU (whole or a share): tessera-node must be ready on its node."""
    domain: Domain | None = None
    """The topology domain chosen for its workload this cycle (tessera.kube.predicates.topology)."""


StaticFilter = Callable[[Pod, NodeFacts], str | None]
DynamicFilter = Callable[[Pod, NodeFacts, ClusterView, PlacedPods | None], str | None]


# ---- static filters ---------------------------------------------------------------------------

def node_unschedulable_filter(pod: Pod, node: NodeFacts) -> str | None:
    """NodeUnschedulable: a cordoned node takes only pods tolerating its unschedulable taint."""
    if node.unschedulable and not pod.spec.tolerates(Taint(TAINT_UNSCHEDULABLE, "", "NoSchedule")):
        return "were unschedulable"
    return None


def node_affinity_filter(pod: Pod, node: NodeFacts) -> str | None:
    """NodeAffinity: nodeSelector and required node affinity, both."""
    spec = pod.spec
    for k, v in spec.node_selector:
        if node.labels.get(k) != v:
            return "didn't match nodeSelector " + ",".join(f"{a}={b}" for a, b in spec.node_selector)
    if spec.required_terms is not None and not any(t.matches(node.name, node.labels)
                                                   for t in spec.required_terms):
        terms = " or ".join(f"({t.text()})" for t in spec.required_terms) or "(no terms)"
        return f"didn't match Pod's node affinity {terms}"
    return None


def taint_toleration_filter(pod: Pod, node: NodeFacts) -> str | None:
    """TaintToleration: every NoSchedule/NoExecute taint must be tolerated."""
    for t in node.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not pod.spec.tolerates(t):
            if node.unschedulable and t.key == TAINT_UNSCHEDULABLE:
                continue  # reported by NodeUnschedulable
            return f"had untolerated taint {t.text()}"
    return None


def gpu_node_ready_filter(pod: Pod, node: NodeFacts) -> str | None:
    """tessera's own: GPU pods only where tessera-node reports the node ready for shares."""
    if pod.gpu and node.gpu_closed:
        return "were not ready for GPU shares (tessera-node)"
    return None


def topology_placement_filter(pod: Pod, node: NodeFacts) -> str | None:
    """tessera's (KAI's topology-required-placement): the workload's pods in one domain."""
    d = pod.domain
    if d is not None and d.required and (d.value is None or node.labels.get(d.key) != d.value):
        return d.text()
    return None


STATIC_FILTERS: tuple[StaticFilter, ...] = (
    node_unschedulable_filter, node_affinity_filter, taint_toleration_filter, gpu_node_ready_filter,
    topology_placement_filter)


# ---- dynamic filters ----------------------------------------------------------------------------

def node_ports_filter(pod: Pod, node: NodeFacts, view: ClusterView, placed: PlacedPods | None) -> str | None:
    """NodePorts: no host port (protocol, port, overlapping host IP) used twice on a node."""
    if not pod.spec.host_ports:
        return None
    for other in view.port_holders():
        if other.where(placed) != node.name:
            continue
        for mine in pod.spec.host_ports:
            if any(mine.conflicts(theirs) for theirs in other.ports):
                return "didn't have free ports for the requested pod ports"
    return None


def node_resources_fit_filter(pod: Pod, node: NodeFacts, view: ClusterView, placed: PlacedPods | None) -> str | None:
    """NodeResourcesFit for what the core does not account: ephemeral-storage, hugepages-*,
    extended resources, against allocatable minus what every pod on the node requests."""
    if not pod.spec.resources:
        return None
    used: Counter[str] = Counter()
    for other in view.resource_holders():
        if other.where(placed) == node.name:
            used.update(other.resources)
    for name, amount in pod.spec.resources:
        if amount + used[name] > node.resources.get(name, 0):
            if name.startswith(MIG_RESOURCE_PREFIX):
                return _mig_insufficient(name, view)
            return f"Insufficient {name}"
    return None


def _mig_insufficient(name: str, view: ClusterView) -> str:
    """A GPU operator MIG resource no node has at all is said so, with the MIG resources the
    nodes do advertise (an unknown or mistyped profile otherwise reads like a busy one)."""
    known = view.memo("mig-resources", lambda: sorted(
        {k for n in view.nodes.values() for k in n.resources if k.startswith(MIG_RESOURCE_PREFIX)}))
    if name in known:
        return f"Insufficient {name}"
    return (f"Insufficient {name} (no node has this MIG profile; MIG resources the nodes "
            f"advertise: {', '.join(known) or 'none'})")


def inter_pod_affinity_filter(pod: Pod, node: NodeFacts, view: ClusterView, placed: PlacedPods | None) -> str | None:
    """InterPodAffinity: existing pods' required anti-affinity, then the pod's own required
    anti-affinity, then its required affinity (per topology domain)."""
    spec = pod.spec
    for other, term in view.symmetric_anti(spec.namespace, spec.labels):
        where = other.where(placed)
        value = node.labels.get(term.topology_key)
        if value is not None and where is not None and view.label(where, term.topology_key) == value:
            return "didn't satisfy existing pods anti-affinity rules"
    for term in spec.anti_affinity:
        value = node.labels.get(term.topology_key)
        if value is None:
            continue
        if value in domains(view, view.matching(term), term.topology_key, placed):
            return "didn't match pod anti-affinity rules"
    if spec.affinity:
        if any(t.topology_key not in node.labels for t in spec.affinity):
            return "didn't match pod affinity rules"
        peers = [p for p in view.matching_all(spec.affinity) if p.where(placed) is not None]
        for term in spec.affinity:
            if node.labels[term.topology_key] not in domains(view, peers, term.topology_key, placed):
                break
        else:
            return None
        # No peer in this node's domain: allowed only for the first of its kind (no pod matches
        # the terms anywhere, and the pod matches its own terms).
        lab = spec.label_map
        counted = any(domains(view, peers, t.topology_key, placed) for t in spec.affinity)
        if not counted and all(t.matches_pod(spec.namespace, lab, view.namespaces) for t in spec.affinity):
            return None
        return "didn't match pod affinity rules"
    return None


def _spread_eligible(pod: Pod, c: SpreadConstraint, node: NodeFacts, keys: tuple[str, ...]) -> bool:
    if any(k not in node.labels for k in keys):
        return False
    if c.honor_affinity and node_affinity_filter(pod, node) is not None:
        return False
    return not (c.honor_taints and taint_toleration_filter(pod, node) is not None)


def _spread_counts(pod: Pod, c: SpreadConstraint, view: ClusterView, placed: PlacedPods | None,
                   keys: tuple[str, ...]) -> tuple[dict[str, int], set[str]]:
    def eligible() -> tuple[frozenset[str], frozenset[str]]:
        names = frozenset(n for n, f in view.nodes.items() if _spread_eligible(pod, c, f, keys))
        return names, frozenset(view.nodes[n].labels[c.topology_key] for n in names)

    names, doms = view.memo(("spread-eligible", pod, c), eligible)
    counts: dict[str, int] = dict.fromkeys(doms, 0)
    if c.selector is None:
        return counts, set(doms)
    sel = c.selector
    members = view.memo(("spread-pods", pod.spec.namespace, sel),
                        lambda: [p for p in view.in_namespace(pod.spec.namespace) if sel.matches(p.labels)])
    for p in members:
        where = p.where(placed)
        if where is not None and where in names:
            d = view.nodes[where].labels[c.topology_key]
            counts[d] = counts.get(d, 0) + 1
    return counts, set(doms)


def pod_topology_spread_filter(pod: Pod, node: NodeFacts, view: ClusterView, placed: PlacedPods | None) -> str | None:
    """PodTopologySpread (DoNotSchedule): the pod's domain may hold at most maxSkew more
    matching pods than the emptiest eligible domain (0 while fewer than minDomains exist)."""
    hard = tuple(c for c in pod.spec.spread if c.hard)
    if not hard:
        return None
    keys = tuple(c.topology_key for c in hard)
    if any(k not in node.labels for k in keys):
        return "didn't match pod topology spread constraints (missing required label)"
    lab = pod.spec.label_map
    for c in hard:
        counts, doms = _spread_counts(pod, c, view, placed, keys)
        minimum = min(counts.values()) if counts else 0
        if c.min_domains is not None and len(doms) < c.min_domains:
            minimum = 0
        self_match = 1 if c.selector is not None and c.selector.matches(lab) else 0
        if counts.get(node.labels[c.topology_key], 0) + self_match - minimum > c.max_skew:
            return "didn't match pod topology spread constraints"
    return None


DYNAMIC_FILTERS: tuple[DynamicFilter, ...] = (
    node_ports_filter, node_resources_fit_filter, inter_pod_affinity_filter, pod_topology_spread_filter)


# ---- scores ------------------------------------------------------------------------------------

def node_affinity_score(pod: Pod, node: NodeFacts) -> float | None:
    """NodeAffinity (score): the weights of the preferred terms the node matches, of all."""
    terms = pod.spec.preferred_terms
    if not terms:
        return None
    total = sum(w for w, _ in terms)
    return sum(w for w, t in terms if t.matches(node.name, node.labels)) / total


def taint_toleration_score(pod: Pod, node: NodeFacts) -> float | None:
    """TaintToleration (score): fewer untolerated PreferNoSchedule taints is better."""
    soft = [t for t in node.taints if t.effect == "PreferNoSchedule"]
    if not soft:
        return 1.0
    bad = sum(1 for t in soft if not any(
        tol.tolerates(t) for tol in pod.spec.tolerations if tol.effect in ("", "PreferNoSchedule")))
    return 1.0 / (1 + bad)


def _inter_pod_raw(pod: Pod, view: ClusterView) -> dict[str, float]:
    """InterPodAffinity (score) per node as the cycle began: +weight per matching pod in the
    node's domain for preferred affinity, -weight for preferred anti-affinity, and the same
    for existing pods' preferred terms (and required affinity, weight 1) that match this pod."""
    spec = pod.spec
    lab = spec.label_map
    by_domain: Counter[tuple[str, str]] = Counter()
    for weight, term in spec.preferred_affinity:
        for d in _domain_list(view, view.matching(term), term.topology_key):
            by_domain[(term.topology_key, d)] += weight
    for weight, term in spec.preferred_anti_affinity:
        for d in _domain_list(view, view.matching(term), term.topology_key):
            by_domain[(term.topology_key, d)] -= weight
    for other in view.memo("soft-holders", lambda: [
            p for p in view.pods if p.spec is not None and (
                p.spec.preferred_affinity or p.spec.preferred_anti_affinity or p.spec.affinity)]):
        assert other.spec is not None
        where = other.where(None)
        if where is None:
            continue
        weighted = [(w, t, 1) for w, t in other.spec.preferred_affinity]
        weighted += [(w, t, -1) for w, t in other.spec.preferred_anti_affinity]
        weighted += [(1, t, 1) for t in other.spec.affinity]
        for w, t, sign in weighted:
            v = view.label(where, t.topology_key)
            if v is not None and t.matches_pod(spec.namespace, lab, view.namespaces):
                by_domain[(t.topology_key, v)] += sign * w
    raw = {}
    for name, facts in view.nodes.items():
        raw[name] = float(sum(s for (k, v), s in by_domain.items() if facts.labels.get(k) == v))
    return raw


def _domain_list(view: ClusterView, pods: list[OtherPod], key: str) -> list[str]:
    out = []
    for p in pods:
        v = view.label(p.where(None), key)
        if v is not None:
            out.append(v)
    return out


def inter_pod_affinity_score(pod: Pod, node: NodeFacts, view: ClusterView) -> float | None:
    spec = pod.spec
    if not (bool(spec.preferred_affinity or spec.preferred_anti_affinity)
            or view.memo("any-soft", lambda: any(p.spec is not None and (
                p.spec.preferred_affinity or p.spec.preferred_anti_affinity or p.spec.affinity)
                for p in view.pods))):
        return None

    def normalised() -> dict[str, float]:
        raw = _inter_pod_raw(pod, view)
        lo, hi = min(raw.values(), default=0.0), max(raw.values(), default=0.0)
        if hi == lo:
            return {}
        return {n: (s - lo) / (hi - lo) for n, s in raw.items()}

    table = view.memo(("ipa-score", pod), normalised)
    if not table:
        return None
    return table.get(node.name, 0.0)


def pod_topology_spread_score(pod: Pod, node: NodeFacts, view: ClusterView) -> float | None:
    """PodTopologySpread (score, ScheduleAnyway): fewer matching pods in the node's domain is
    better (as the cycle began)."""
    soft = tuple(c for c in pod.spec.spread if not c.hard)
    if not soft:
        return None
    total = 0.0
    for c in soft:
        if c.topology_key not in node.labels:
            return 0.0
        counts, _ = _spread_counts(pod, c, view, None, (c.topology_key,))
        most = max(counts.values(), default=0)
        here = counts.get(node.labels[c.topology_key], 0)
        total += 1.0 - (here / most if most else 0.0)
    return total / len(soft)


def topology_placement_score(pod: Pod, node: NodeFacts) -> float | None:
    """Preferred topology: the chosen domain's nodes first."""
    d = pod.domain
    if d is None or d.required or d.value is None:
        return None
    return 1.0 if node.labels.get(d.key) == d.value else 0.0


WEIGHTS = {"TopologyPlacement": 4.0, "NodeAffinity": 2.0, "TaintToleration": 3.0, "InterPodAffinity": 2.0, "PodTopologySpread": 2.0}
"""kube-scheduler's default score plugin weights."""
