"""Consolidate's node index over the movable workloads it keeps (``kept_running``), each
node's group made when a search first reads it.

``NodeIndex(victims)`` groups the victims per node they run on, nodes in the order of their
first victim, victims in list order: a pass over every movable workload's pods (27,000 at
5,000 nodes) each time consolidate needs it (once per cycle), while a cycle's searches read a
few nodes. The kept index holds, per movable workload, the nodes its spec's placements use
(in pod order, each once) and, per node, the movable entries with a pod there, in the kept
order. For a list ``found`` in the kept order whose workloads run where their specs put them,
the node order is ``dict.fromkeys`` over their node tuples (one pass in C) and a node's group
is its kept entries that are in ``found``, in that order: exactly ``NodeIndex(found)``'s.
(``consolidate._index`` falls back to ``NodeIndex`` when a workload of ``found`` was shrunk,
or when ``found`` is re-sorted.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kept_running import MovableEntry
    from .session import WorkloadState


class KeptGroups(Mapping[str, list["WorkloadState"]]):
    """``found``'s workloads per node, in ``NodeIndex(found)``'s node order and group order."""

    def __init__(self, found: Sequence[WorkloadState], nodes: Mapping[str, tuple[str, ...]],
                 on_node: Mapping[str, list[MovableEntry]]) -> None:
        """``nodes``: per workload id, the nodes it runs on; ``on_node``: per node, the kept
        entries with a pod there, in the kept order (of which ``found`` is a subsequence)."""
        self._member = set(found)  # by identity (states do not define equality)
        self._on_node = on_node
        self._order = dict.fromkeys(chain.from_iterable(nodes[v.id] for v in found))
        self._groups: dict[str, list[WorkloadState]] = {}

    def __getitem__(self, node: str) -> list[WorkloadState]:
        group = self._groups.get(node)
        if group is None:
            if node not in self._order:
                raise KeyError(node)
            member = self._member
            group = self._groups[node] = [e[2] for e in self._on_node[node] if e[2] in member]
        return group

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, node: object) -> bool:
        return node in self._order
