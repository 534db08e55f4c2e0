"""Kubernetes selectors with their documented semantics, as frozen (hashable) values.

- ``LabelSelector`` (metav1.LabelSelector): ``matchLabels`` and ``matchExpressions`` (``In``,
  ``NotIn``, ``Exists``, ``DoesNotExist``) all ANDed; an empty selector matches everything, an
  absent one (``None`` where a selector is optional) matches nothing.
- ``NodeSelectorTerm``: ``matchExpressions`` over node labels (``In``, ``NotIn``, ``Exists``,
  ``DoesNotExist``, ``Gt``, ``Lt``) and ``matchFields`` (only ``metadata.name``, ``In``/``NotIn``),
  ANDed; a term with neither matches no node. Terms of one ``nodeSelectorTerms`` list are ORed.
  ``NotIn`` and ``DoesNotExist`` match a node without the label; ``Gt``/``Lt`` compare the label
  as an integer and do not match a label that is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.core.errors import InvalidRequest

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Labels) -> bool:
        op = self.operator
        if op == "In":
            return labels.get(self.key) in self.values
        if op == "NotIn":
            return labels.get(self.key) not in self.values
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        if op in ("Gt", "Lt"):
            value = labels.get(self.key)
            if value is None or not self.values:
                return False
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if op == "Gt" else have < want
        return False

    def text(self) -> str:
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        if self.operator in ("Gt", "Lt"):
            return f"{self.key}{'>' if self.operator == 'Gt' else '<'}{self.values[0] if self.values else ''}"
        vals = ",".join(self.values)
        return f"{self.key} {'in' if self.operator == 'In' else 'notin'} ({vals})"


_LABEL_OPS = ("In", "NotIn", "Exists", "DoesNotExist")
_NODE_OPS = (*_LABEL_OPS, "Gt", "Lt")


def _requirement(raw: Any, field: str, ops: tuple[str, ...]) -> Requirement:
    if not isinstance(raw, Mapping):
        raise InvalidRequest(field, "must be an object with key, operator, values", raw)
    key = raw.get("key")
    op = raw.get("operator")
    if not isinstance(key, str) or not key:
        raise InvalidRequest(f"{field}.key", "must be a non-empty label key", key)
    if op not in ops:
        raise InvalidRequest(f"{field}.operator", f"must be one of {', '.join(ops)}", op)
    values = tuple(str(v) for v in (raw.get("values") or ()))
    if op in ("In", "NotIn") and not values:
        raise InvalidRequest(f"{field}.values", f"must not be empty for operator {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise InvalidRequest(f"{field}.values", f"must be empty for operator {op}", list(values))
    if op in ("Gt", "Lt") and len(values) != 1:
        raise InvalidRequest(f"{field}.values", f"must hold exactly one integer for operator {op}")
    return Requirement(key, op, values)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Labels) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def text(self) -> str:
        return ",".join(r.text() for r in self.requirements) or "(everything)"

    def with_requirements(self, extra: tuple[Requirement, ...]) -> LabelSelector:
        return LabelSelector(self.requirements + extra) if extra else self


def label_selector(raw: Any, field: str) -> LabelSelector | None:
    """None for an absent selector (which matches nothing where one is optional)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidRequest(field, "must be a label selector (matchLabels, matchExpressions)", raw)
    reqs = [Requirement(str(k), "In", (str(v),)) for k, v in sorted((raw.get("matchLabels") or {}).items())]
    for i, e in enumerate(raw.get("matchExpressions") or ()):
        reqs.append(_requirement(e, f"{field}.matchExpressions[{i}]", _LABEL_OPS))
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()
    """Over ``metadata.name`` only (the one field Kubernetes supports)."""

    def matches(self, name: str, labels: Labels) -> bool:
        if not self.expressions and not self.fields:
            return False
        if not all(r.matches(labels) for r in self.expressions):
            return False
        named = {"metadata.name": name}
        return all(r.matches(named) for r in self.fields)

    def text(self) -> str:
        return ",".join(r.text() for r in self.expressions + self.fields)


def node_selector_term(raw: Any, field: str) -> NodeSelectorTerm:
    if not isinstance(raw, Mapping):
        raise InvalidRequest(field, "must be a node selector term (matchExpressions, matchFields)", raw)
    exprs = tuple(_requirement(e, f"{field}.matchExpressions[{i}]", _NODE_OPS)
                  for i, e in enumerate(raw.get("matchExpressions") or ()))
    fields = []
    for i, e in enumerate(raw.get("matchFields") or ()):
        r = _requirement(e, f"{field}.matchFields[{i}]", ("In", "NotIn"))
        if r.key != "metadata.name":
            raise InvalidRequest(f"{field}.matchFields[{i}].key", "must be metadata.name", r.key)
        fields.append(r)
    return NodeSelectorTerm(exprs, tuple(fields))
