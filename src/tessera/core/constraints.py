"""Node constraints: which nodes one pod may use and which it prefers, stated by the adapter.

The core knows nodes, GPUs, CPU and memory. Everything else a pod may say about where it runs
(Kubernetes node selectors, affinities, taints and tolerations, spread constraints, cordoned
nodes; or anything an embedded adapter wants) is a ``NodeConstraint`` attached to the pod
(``Workload.constraints``). Placement consults it in every action (allocate, consolidate,
reclaim, preempt, backfill): a node it does not allow is never chosen, and never searched for
victims.

A constraint has a **static** part, which depends only on the node and is asked once per node
per cycle (``allows``, ``score``), and an optional **dynamic** part (``dynamic = True``), which
may depend on where other pods of this cycle's snapshot are placed at that moment
(``admits``), so that two pods placed in one cycle still see each other (pod anti-affinity
inside a gang, host ports, spread). Both are pure: no I/O, same answer for the same input.

``score`` is a preference in [0, 1] (1: the most preferred node). The placer ranks nodes by
the placement policy's GPU score plus ``PREFERENCE_WEIGHT`` × this score, so preferred terms
decide between nodes whose GPU scores are close, and never make a node feasible.

Constraints are compared by value (``__eq__``/``__hash__``): pods whose constraints are equal
share one ranking, so an adapter should hand out one object per distinct constraint.
"""

from __future__ import annotations

from typing import Protocol

from tessera.core.model import Node

PREFERENCE_WEIGHT = 1.0
"""How much a node preference (0..1) weighs against the policy's GPU score."""


class PlacedPods(Protocol):
    """Where the snapshot's pods are at this moment of the cycle."""

    def node_of(self, workload_id: str, pod: int) -> str | None:
        """The node pod ``pod`` of that workload is placed on now, or None."""
        ...


class NodeConstraint(Protocol):
    dynamic: bool
    """True if ``admits`` must be asked (it looks at where other pods are)."""

    def allows(self, node: Node) -> bool:
        """The static filter: may the pod run on this node at all?"""
        ...

    def score(self, node: Node) -> float:
        """Static preference for this node, 0 (none) to 1 (most preferred)."""
        ...

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        """The dynamic filter, asked only for nodes ``allows`` accepted."""
        ...

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        """Which of these nodes the static filter refuses and why, counted per reason (e.g.
        ``480 didn't match nodeSelector disktype=ssd, 20 had untolerated taint ...``); empty
        if it refuses none. The cycle prefixes ``0/N nodes are available: `` when a pod waits."""
        ...


def static_token(constraint: NodeConstraint) -> object | None:
    """What a constraint's static answers (``allows`` and ``score`` for every node) stand on,
    or None. A constraint may offer ``static_token()``: while it returns an equal value and the
    nodes are the same, an equal constraint's answers stand across cycles too, so the placer
    keeps them (``Placer.forget_constraints``) instead of asking every node again. None (or no
    such method): its answers hold for the one cycle."""
    token = getattr(constraint, "static_token", None)
    return None if token is None else token()


def without_room(constraint: NodeConstraint | None) -> NodeConstraint | None:
    """The constraint less a part that only says where there is room *now* (a MIG pod's
    constraint: nodes whose MIG GPUs have room for its profile), for the cycle's search that
    makes MIG room by eviction (``tessera.core.cycle.mig_room``). A constraint with such a part
    offers ``without_room()``; any other is returned as it is."""
    relax = getattr(constraint, "without_room", None)
    return constraint if relax is None else relax()
