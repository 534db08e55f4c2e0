"""A node index (``NodeIndex``'s ``by_node``) read from per-node lists kept between cycles
(``kept_running``): the node order made as far as a search reads it, each node's group made
when first read. Consolidate's index over its movable workloads and preempt's over a
(project, priority)'s victims.

``NodeIndex(victims)`` groups the victims per node they run on, nodes in the order of their
first victim, victims in list order: a pass over every victim's pods each time an action needs
an index (27,000 movable workloads once per cycle in consolidate; about 1,000 victims 33 times
per warm cycle in preempt, 53 times in the cold one, at 5,000 nodes), while a search reads a
few nodes (at most ``4 × max_victim_nodes``, most stop after four feasible ones). The kept
index holds, per workload, the nodes its spec's placements use (in pod order, each once) and,
per node, the kept entries with a pod there, in the kept order. For a list ``found`` in the
kept order whose workloads run where their specs put them, the node order is the nodes of
``found``'s node tuples, each at its first appearance (made here a victim at a time, only as
far as the order is read) and a node's group is its kept entries that are in ``found``, in
that order: exactly ``NodeIndex(found)``'s when it is made. It stays so while the searches
evict and put back: the node tuples are the spec's, fixed, as ``NodeIndex``'s groups are once
built (reading the placements later would lose the nodes of a victim evicted meanwhile). The
workloads both actions take (not evicted, bound or moved in this plan; a shrunk workload is
recorded as moved, ``shrink._keep``) run where their specs put them when the index is made: a
pod's placement changes only by a binding or a move, by ``restore`` (the spec's placements
again), by a release (an eviction, a shrink, a move), or by undoing one. (Consolidate still
falls back to ``NodeIndex`` where a workload of its list has an eviction record, re-sorted.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import WorkloadState


class KeptGroups(Mapping[str, list["WorkloadState"]]):
    """``found``'s workloads per node, in ``NodeIndex(found)``'s node order and group order."""

    def __init__(self, found: Sequence[WorkloadState], nodes: Mapping[str, tuple[str, ...]],
                 on_node: Mapping[str, list[Any]], at: int) -> None:
        """``nodes``: per workload id, the nodes it runs on; ``on_node``: per node, the kept
        entries with a pod there, in the kept order (of which ``found`` is a subsequence);
        ``at``: where an entry holds the workload state."""
        self._found = found
        self._nodes = nodes
        self._on_node = on_node
        self._at = at
        self._member: set[WorkloadState] | None = None
        self._order: list[str] = []
        self._seen: set[str] = set()
        self._read = 0
        """Workloads of ``found`` whose nodes are in ``_order``."""
        self._groups: dict[str, list[WorkloadState]] = {}

    def _extend(self) -> bool:
        """Put the next workload's new nodes in the order (False: every workload was read)."""
        found, nodes, seen, order = self._found, self._nodes, self._seen, self._order
        k = self._read
        while k < len(found):
            before = len(order)
            for node in nodes[found[k].id]:
                if node not in seen:
                    seen.add(node)
                    order.append(node)
            k += 1
            if len(order) > before:
                self._read = k
                return True
        self._read = k
        return False

    def __iter__(self) -> Iterator[str]:
        order = self._order
        i = 0
        while True:
            if i < len(order):
                yield order[i]
                i += 1
            elif not self._extend():
                return

    def __len__(self) -> int:
        while self._extend():
            pass
        return len(self._order)

    def __contains__(self, node: object) -> bool:
        if node in self._seen:
            return True
        while self._extend():
            if node in self._seen:
                return True
        return False

    def __getitem__(self, node: str) -> list[WorkloadState]:
        group = self._groups.get(node)
        if group is None:
            if node not in self:
                raise KeyError(node)
            member = self._member
            if member is None:  # by identity (states do not define equality)
                member = self._member = set(self._found)
            at = self._at
            group = self._groups[node] = [e[at] for e in self._on_node[node] if e[at] in member]
        return group
