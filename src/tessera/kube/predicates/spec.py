"""What a pod states about where it may run, and what a node offers, parsed once per watch event
into frozen values (so pods stating the same constraint share one placement ranking).

Parsed from the API's JSON form (camelCase dicts): a lightkube object's ``to_dict()`` or an
admission review's pod. Anything malformed raises ``InvalidRequest`` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.units import check_number_size
from tessera.kube.predicates.selectors import (
    LabelSelector,
    NodeSelectorTerm,
    Requirement,
    label_selector,
    node_selector_term,
)

TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"

HANDLED_BY_CORE = frozenset({"cpu", "memory", "nvidia.com/gpu", "pods"})
"""Resources the core accounts itself (or, for ``pods``, that tessera does not count)."""

_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def text(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    seconds: int | None = None
    """tolerationSeconds: how long a NoExecute taint is tolerated once added (the eviction is
    the taint-eviction controller's business; for scheduling it tolerates)."""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    selector: LabelSelector | None
    """None (absent labelSelector) matches no pod."""
    namespaces: frozenset[str]
    namespace_selector: LabelSelector | None
    topology_key: str

    def matches_pod(self, namespace: str, labels: Mapping[str, str],
                    namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        if self.selector is None:
            return False
        if namespace not in self.namespaces and (
                self.namespace_selector is None
                or not self.namespace_selector.matches(namespace_labels.get(namespace, {}))):
            return False
        return self.selector.matches(labels)

    def text(self) -> str:
        sel = self.selector.text() if self.selector is not None else "(nothing)"
        return f"{sel} per {self.topology_key}"


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    max_skew: int
    topology_key: str
    hard: bool
    """whenUnsatisfiable: DoNotSchedule (True) or ScheduleAnyway."""
    selector: LabelSelector | None
    min_domains: int | None
    honor_affinity: bool
    """nodeAffinityPolicy: Honor (default) counts only nodes the pod's selector/affinity allow."""
    honor_taints: bool
    """nodeTaintsPolicy: Honor counts only nodes whose taints the pod tolerates (default Ignore)."""


@dataclass(frozen=True, slots=True)
class HostPort:
    ip: str
    protocol: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        if self.port != other.port or self.protocol != other.protocol:
            return False
        wild = ("", "0.0.0.0", "::")
        return self.ip in wild or other.ip in wild or self.ip == other.ip


@dataclass(frozen=True, slots=True)
class SchedulingSpec:
    """Everything beyond GPU, CPU and memory that a pod states about its node."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[NodeSelectorTerm, ...] | None = None
    """Required node affinity: ORed terms; None: none stated."""
    preferred_terms: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    resources: tuple[tuple[str, int], ...] = ()
    """Requests of other resources (ephemeral-storage, hugepages-*, extended), in milli-units."""
    claims: tuple[str, ...] = ()
    """PersistentVolumeClaims its volumes name."""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def dynamic(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.spread or self.host_ports
                    or self.resources)

    def matches_node_selection(self, name: str, labels: Mapping[str, str]) -> bool:
        """nodeSelector and required node affinity (both must hold)."""
        for k, v in self.node_selector:
            if labels.get(k) != v:
                return False
        if self.required_terms is not None:
            return any(t.matches(name, labels) for t in self.required_terms)
        return True

    def tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)


# ---- quantities ---------------------------------------------------------------------------------

_QTY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\Z")
_MULT = {None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
         "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
         "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
         "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}


def quantity_milli(value: object, field: str) -> int:
    """A Kubernetes quantity in thousandths (``500m`` -> 500, ``2Gi`` -> 2*2^30*1000)."""
    check_number_size(str(value).strip(), field, value)
    m = _QTY.match(str(value).strip())
    if m is None:
        raise InvalidRequest(field, "must be a Kubernetes quantity such as 2, 500m or 1Gi", value)
    try:
        amount = Decimal(m.group(1)) * _MULT[m.group(2)] * 1000
    except InvalidOperation:
        raise InvalidRequest(field, "must be a Kubernetes quantity", value) from None
    if amount < 0:
        raise InvalidRequest(field, "must not be negative", value)
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


# ---- parsing ------------------------------------------------------------------------------------

def _tolerations(raw: Any) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(raw or ()):
        field = f"spec.tolerations[{i}]"
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise InvalidRequest(f"{field}.operator", "must be Equal or Exists", op)
        effect = t.get("effect") or ""
        if effect and effect not in _EFFECTS:
            raise InvalidRequest(f"{field}.effect", f"must be one of {', '.join(_EFFECTS)}", effect)
        key = t.get("key") or ""
        if op == "Equal" and not key and t.get("value"):
            raise InvalidRequest(f"{field}.key", "must be given with operator Equal")
        seconds = t.get("tolerationSeconds")
        out.append(Toleration(key, op, "" if op == "Exists" else str(t.get("value") or ""), effect,
                              None if seconds is None else int(seconds)))
    return tuple(out)


def _term_keys(raw: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[Requirement, ...]:
    """matchLabelKeys (key In pod's value) and mismatchLabelKeys (key NotIn pod's value), for
    keys the pod carries (others are ignored, as Kubernetes does)."""
    extra = [Requirement(k, "In", (labels[k],)) for k in raw.get("matchLabelKeys") or () if k in labels]
    extra += [Requirement(k, "NotIn", (labels[k],)) for k in raw.get("mismatchLabelKeys") or ()
              if k in labels]
    return tuple(extra)


def _pod_term(raw: Any, field: str, namespace: str, labels: Mapping[str, str]) -> PodAffinityTerm:
    if not isinstance(raw, Mapping):
        raise InvalidRequest(field, "must be a pod affinity term", raw)
    key = raw.get("topologyKey")
    if not key:
        raise InvalidRequest(f"{field}.topologyKey", "must be a node label key")
    sel = label_selector(raw.get("labelSelector"), f"{field}.labelSelector")
    if sel is not None:
        sel = sel.with_requirements(_term_keys(raw, labels))
    nss = frozenset(str(n) for n in raw.get("namespaces") or ())
    nsel = label_selector(raw.get("namespaceSelector"), f"{field}.namespaceSelector")
    if not nss and nsel is None:
        nss = frozenset({namespace})
    return PodAffinityTerm(sel, nss, nsel, str(key))


def _weighted(raw: Any, field: str, inner: str, parse: Any) -> tuple[tuple[int, Any], ...]:
    out = []
    for i, w in enumerate(raw or ()):
        weight = int(w.get("weight", 0))
        if not 1 <= weight <= 100:
            raise InvalidRequest(f"{field}[{i}].weight", "must be 1 to 100", weight)
        out.append((weight, parse(w.get(inner), f"{field}[{i}].{inner}")))
    return tuple(out)


def _spread(raw: Any, namespace: str, labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    out = []
    for i, c in enumerate(raw or ()):
        field = f"spec.topologySpreadConstraints[{i}]"
        skew = int(c.get("maxSkew", 0))
        if skew < 1:
            raise InvalidRequest(f"{field}.maxSkew", "must be 1 or more", skew)
        when = c.get("whenUnsatisfiable")
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise InvalidRequest(f"{field}.whenUnsatisfiable", "must be DoNotSchedule or ScheduleAnyway", when)
        key = c.get("topologyKey")
        if not key:
            raise InvalidRequest(f"{field}.topologyKey", "must be a node label key")
        sel = label_selector(c.get("labelSelector"), f"{field}.labelSelector")
        keys = tuple(Requirement(k, "In", (labels[k],)) for k in c.get("matchLabelKeys") or () if k in labels)
        if sel is not None:
            sel = sel.with_requirements(keys)
        md = c.get("minDomains")
        if md is not None and (int(md) < 1 or when != "DoNotSchedule"):
            raise InvalidRequest(f"{field}.minDomains", "must be 1 or more, with DoNotSchedule", md)
        aff = c.get("nodeAffinityPolicy") or "Honor"
        taints = c.get("nodeTaintsPolicy") or "Ignore"
        for name, v in (("nodeAffinityPolicy", aff), ("nodeTaintsPolicy", taints)):
            if v not in ("Honor", "Ignore"):
                raise InvalidRequest(f"{field}.{name}", "must be Honor or Ignore", v)
        out.append(SpreadConstraint(skew, str(key), when == "DoNotSchedule", sel,
                                    None if md is None else int(md), aff == "Honor", taints == "Honor"))
    return tuple(out)


def _containers_resources(spec: Mapping[str, Any]) -> tuple[tuple[HostPort, ...], tuple[tuple[str, int], ...]]:
    ports: list[HostPort] = []
    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for p in c.get("ports") or ():
            hp = p.get("hostPort")
            if hp:
                ports.append(HostPort(p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(hp)))
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            if k not in HANDLED_BY_CORE:
                total[k] = total.get(k, 0) + quantity_milli(v, f"containers[{c.get('name')}].resources.requests.{k}")
        for k, v in ((c.get("resources") or {}).get("limits") or {}).items():
            reqs = (c.get("resources") or {}).get("requests") or {}
            if k not in HANDLED_BY_CORE and k not in reqs:
                # A limit without a request: the request defaults to the limit.
                total[k] = total.get(k, 0) + quantity_milli(v, f"containers[{c.get('name')}].resources.limits.{k}")
    for c in spec.get("initContainers") or ():
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in merged.items():
            if k not in HANDLED_BY_CORE:
                amount = quantity_milli(v, f"initContainers[{c.get('name')}].resources.requests.{k}")
                total[k] = max(total.get(k, 0), amount)
    for k, v in (spec.get("overhead") or {}).items():
        if k not in HANDLED_BY_CORE:
            total[k] = total.get(k, 0) + quantity_milli(v, f"spec.overhead.{k}")
    return tuple(ports), tuple(sorted((k, v) for k, v in total.items() if v > 0))


def scheduling_spec(namespace: str, labels: Mapping[str, str], spec: Mapping[str, Any]) -> SchedulingSpec | None:
    """The pod's constraints, or None if it states none (the common case: no work per node)."""
    lab = tuple(sorted(labels.items()))
    node_selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    affinity = spec.get("affinity") or {}
    na = affinity.get("nodeAffinity") or {}
    required = None
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        f = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        required = tuple(node_selector_term(t, f"{f}[{i}]")
                         for i, t in enumerate(req.get("nodeSelectorTerms") or ()))
    preferred = _weighted(na.get("preferredDuringSchedulingIgnoredDuringExecution"),
                          "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
                          "preference", node_selector_term)
    preferred = tuple((w, t) for w, t in preferred if t.expressions or t.fields)

    def terms(kind: str) -> tuple[tuple[PodAffinityTerm, ...], tuple[tuple[int, PodAffinityTerm], ...]]:
        block = affinity.get(kind) or {}
        base = f"spec.affinity.{kind}"
        hard = tuple(_pod_term(t, f"{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]",
                               namespace, labels)
                     for i, t in enumerate(block.get("requiredDuringSchedulingIgnoredDuringExecution") or ()))
        soft = _weighted(block.get("preferredDuringSchedulingIgnoredDuringExecution"),
                         f"{base}.preferredDuringSchedulingIgnoredDuringExecution", "podAffinityTerm",
                         lambda raw, field: _pod_term(raw, field, namespace, labels))
        return hard, soft

    pa, ppa = terms("podAffinity")
    anti, panti = terms("podAntiAffinity")
    ports, resources = _containers_resources(spec)
    claims = tuple(sorted({str(v["persistentVolumeClaim"].get("claimName"))
                           for v in spec.get("volumes") or ()
                           if isinstance(v, Mapping) and v.get("persistentVolumeClaim")}))
    out = SchedulingSpec(
        namespace=namespace, labels=lab, node_selector=node_selector, required_terms=required,
        preferred_terms=preferred, tolerations=_tolerations(spec.get("tolerations")),
        affinity=pa, anti_affinity=anti, preferred_affinity=ppa, preferred_anti_affinity=panti,
        spread=_spread(spec.get("topologySpreadConstraints"), namespace, labels),
        host_ports=ports, resources=resources, claims=claims,
    )
    if out == SchedulingSpec(namespace, lab, tolerations=out.tolerations) and not _matters(out.tolerations):
        return None
    return out


def _matters(tolerations: tuple[Toleration, ...]) -> bool:
    """Tolerations change nothing when no node is tainted, but a pod that tolerates taints must
    keep them: they are part of its constraint whenever any node is tainted."""
    return bool(tolerations)


def taints_of(raw: Any) -> tuple[Taint, ...]:
    out = []
    for t in raw or ():
        effect = t.get("effect") or ""
        if effect in _EFFECTS and t.get("key"):
            out.append(Taint(str(t["key"]), str(t.get("value") or ""), effect))
    return tuple(out)


def resources_of(allocatable: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """A node's allocatable resources that the core does not account, in milli-units."""
    out = []
    for k, v in allocatable.items():
        if k in HANDLED_BY_CORE:
            continue
        try:
            out.append((k, quantity_milli(v, f"status.allocatable.{k}")))
        except InvalidRequest:
            continue
    return tuple(sorted(out))
