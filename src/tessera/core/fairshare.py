"""Fair share: how much of each resource every project should have this cycle.

Per resource (GPU always; CPU and memory where projects give quotas), starting with the whole
cluster at the top of the tree and recursing into each project's children with the parent's
fair share as their capacity:

1. **Deserved first.** Each sibling gets ``min(deserved, requestable)``, where requestable is
   what it asks for (running + pending, summed over its subtree) capped by its ``limit``. If
   the deserved quotas of the siblings together exceed the capacity (an over-subscribed
   parent), each is scaled down in proportion, so shares never sum above capacity.
2. **Then by priority tier.** What is left goes to the highest ``priority`` tier first; a lower
   tier only sees what the higher one could not use.
3. **Within a tier, by weight.** The remainder is water-filled in proportion to
   ``over_quota_weight``: each sibling gets ``remaining × weight / Σweight`` but never more than
   it can still use (requestable − share); what a capped sibling cannot take is offered again to
   the others. A weight of 0 gets nothing above its deserved quota.

Unlike KAI, shares are not rounded to whole GPUs: fractions are first-class here. Ties cannot
arise (the division is exact arithmetic over the siblings), so the result depends only on the
input and is the same every cycle.

**Usage history** (time-based fair share, optional): given each project's decayed GPU-seconds
(``tessera.core.usage``), step 3 for the GPU uses ``w' = max(0, n + k (n - u))`` in place of
the weight, ``n`` being the weight's share and ``u`` the usage's share among the competing
siblings; what siblings with ``w' = 0`` did not get in that pass, if any is left because the
others are capped, is then water-filled by plain weight, so no capacity is left unshared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tessera.core.projects import RESOURCES, ProjectTree, Resource
from tessera.core.usage import adjusted_weights

EPS = 1e-9

Vector = tuple[float, float, float]
"""Amounts per resource, indexed by ``Resource``: (GPUs, CPU millicores, memory bytes)."""

ZERO: Vector = (0.0, 0.0, 0.0)


def vadd(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def vsub(a: Vector, b: Vector) -> Vector:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


@dataclass(frozen=True, slots=True)
class Claim:
    """One sibling in a division."""

    name: str
    deserved: float
    """``inf`` for unlimited."""
    limit: float
    """``inf`` for none."""
    weight: float
    priority: int
    requested: float


def divide(
    capacity: float,
    claims: Sequence[Claim],
    usage: Mapping[str, float] | None = None,
    k: float = 0.0,
) -> dict[str, float]:
    """Split ``capacity`` of one resource between siblings (steps 1–3 above); ``usage``:
    decayed usage per sibling, weighted by ``k`` (time-based fair share)."""
    capacity = max(capacity, 0.0)
    room = {c.name: max(0.0, min(c.requested, c.limit)) for c in claims}
    first = {c.name: min(c.deserved, room[c.name]) for c in claims}
    total = sum(first.values())
    if total > capacity:
        scale = capacity / total if total > 0 else 0.0
        return {c.name: first[c.name] * scale for c in claims}
    share = dict(first)
    remaining = capacity - total
    for priority in sorted({c.priority for c in claims}, reverse=True):
        if remaining <= EPS:
            break
        tier = [c for c in claims if c.priority == priority]
        if usage and k > 0:
            active = {c.name: c.weight for c in tier if c.weight > 0 and room[c.name] - share[c.name] > EPS}
            adjusted = adjusted_weights(active, usage, k)
            history = [replace(c, weight=adjusted[c.name]) for c in tier if c.name in adjusted]
            remaining = _water_fill(remaining, history, share, room)
            if remaining <= EPS:
                continue
        remaining = _water_fill(remaining, tier, share, room)
    return share


def _water_fill(amount: float, tier: Sequence[Claim], share: dict[str, float], room: Mapping[str, float]) -> float:
    """Give ``amount`` to ``tier`` in proportion to weight, capped by room; return what is left."""
    active = [
        (room[c.name] - share[c.name], c.weight, c.name)
        for c in tier
        if c.weight > 0 and room[c.name] - share[c.name] > EPS
    ]
    active.sort(key=lambda a: (a[0] / a[1], a[2]))
    weights = sum(a[1] for a in active)
    for k, (free, weight, name) in enumerate(active):
        level = amount / weights
        if free <= level * weight:
            share[name] += free
            amount -= free
            weights -= weight
            continue
        for _, w, other in active[k:]:
            share[other] += level * w
        return 0.0
    return amount


@dataclass(frozen=True, slots=True)
class FairShares:
    """Fair share and what was counted as requested, per project (every level of the tree)."""

    share: Mapping[str, Vector]
    requested: Mapping[str, Vector]
    capacity: Vector

    def gpu(self, project: str) -> float:
        return self.share[project][Resource.GPU]


def compute_fair_shares(
    tree: ProjectTree,
    capacity: Vector,
    leaf_requested: Mapping[str, Vector],
    leaf_usage: Mapping[str, float] | None = None,
    k: float = 0.0,
    unusable: float = 0.0,
) -> FairShares:
    """Fair shares for every project. ``leaf_requested`` is running + pending per leaf project;
    ``leaf_usage`` decayed GPU-seconds per leaf project (time-based fair share, GPU only),
    weighted by ``k``. ``unusable``: GPUs of free fragments no pending request can use
    (``tessera.core.cycle.usable``), taken out of the GPU capacity divided above deserved quota
    only: what the top-level projects are owed as deserved quota is still divided in full."""
    usage: dict[str, float] = {}
    if leaf_usage and k > 0:
        for leaf, amount in leaf_usage.items():
            if leaf in tree:
                for name in tree.chain(leaf):
                    usage[name] = usage.get(name, 0.0) + amount
    requested: dict[str, Vector] = {}
    for name in reversed(tree.depth_first()):
        kids = tree.children.get(name, ())
        if kids:
            total = ZERO
            for kid in kids:
                capped = tuple(
                    min(requested[kid][r], tree[kid].quota(r).limit_amount) for r in RESOURCES
                )
                total = vadd(total, capped)  # type: ignore[arg-type]
            requested[name] = total
        else:
            requested[name] = leaf_requested.get(name, ZERO)
    share: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in tree.order}
    for resource in RESOURCES:
        if resource not in tree.governed:
            for name in tree.order:
                share[name][resource] = math.inf
            continue
        frontier: list[tuple[str | None, float]] = [(None, capacity[resource])]
        while frontier:
            parent, amount = frontier.pop()
            kids = tree.children.get(parent, ())
            if not kids:
                continue
            claims = []
            for kid in kids:
                q = tree[kid].quota(resource)
                claims.append(
                    Claim(
                        kid,
                        q.deserved_amount,
                        q.limit_amount,
                        q.over_quota_weight,
                        tree[kid].priority,
                        requested[kid][resource],
                    )
                )
            history = usage if resource is Resource.GPU else None
            if parent is None and resource is Resource.GPU and unusable > 0:
                owed = sum(min(c.deserved, max(0.0, min(c.requested, c.limit))) for c in claims)
                amount = max(amount - unusable, min(amount, owed))
            for kid, value in divide(amount, claims, history, k).items():
                share[kid][resource] = value
                frontier.append((kid, value))
    return FairShares(
        {name: (v[0], v[1], v[2]) for name, v in share.items()},
        requested,
        capacity,
    )
