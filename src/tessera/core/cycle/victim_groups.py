"""Reclaim's victims per node for one index, each node's group made when a search first reads
it (``NodeIndex.of_entries``).

An action's victims are in one workload order (``VictimOrder``); each set of ancestors ranks
their projects, and its index groups the victims per node in (project rank, workload order),
nodes in the order of their first victim. Making every group eagerly cost a pass over every
victim per set of ancestors (5 at 5,000 nodes, ~23,000 victims each), while a warm cycle's
searches read a few hundred nodes' groups. Here the node order is made from the sorted entries
in one C-level pass, and a node's group when it is first read, from the node's entries in
workload order (``EntriesByNode``, made once per action) sorted by the index's project rank:
the same groups, in the same order, with the same victims (those evicted when the index was
made left out, as before).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import WorkloadState

    Entry = tuple[WorkloadState, float, tuple[str, ...]]


class EntriesByNode:
    """Per node, the positions of the entries (victims in workload order) running there."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = entries
        self.victims = [e[0] for e in entries]
        self.nodes = [e[2] for e in entries]
        by_node: dict[str, list[int]] = {}
        get = by_node.get
        for k, (_, _, where) in enumerate(entries):
            for node in where:
                found = get(node)
                if found is None:
                    by_node[node] = [k]
                else:
                    found.append(k)
        self.by_node = by_node


class LazyGroups(Mapping[str, list["WorkloadState"]]):
    """One index's victims per node, in the index's node order; a group made on first read."""

    def __init__(self, base: EntriesByNode, order: Sequence[int], rank: Sequence[int]) -> None:
        """``order``: the entry positions in the index's preference order; ``rank[k]``: entry
        ``k``'s project rank in this index (its order is by (rank, k))."""
        self._base = base
        self._rank = rank
        flags = list(map(attrgetter("evicted"), base.victims))
        self._gone = {k for k, evicted in enumerate(flags) if evicted} if any(flags) else set()
        """Entries evicted when the index was made: not in its groups (as ``of_entries``)."""
        live = order if not self._gone else [k for k in order if k not in self._gone]
        self._order = dict.fromkeys(chain.from_iterable(map(base.nodes.__getitem__, live)))
        self._groups: dict[str, list[WorkloadState]] = {}
        self.gpus: dict[str, list[float]] = {}
        """Per node whose group was made: the GPUs each victim there counts."""

    def __getitem__(self, node: str) -> list[WorkloadState]:
        group = self._groups.get(node)
        if group is None:
            if node not in self._order:
                raise KeyError(node)
            rank, gone, entries = self._rank, self._gone, self._base.entries
            # Ascending positions (``EntriesByNode``): a stable sort by rank gives (rank, k).
            ks = [k for k in self._base.by_node[node] if k not in gone] if gone else list(self._base.by_node[node])
            ks.sort(key=rank.__getitem__)
            group = self._groups[node] = [entries[k][0] for k in ks]
            self.gpus[node] = [entries[k][1] for k in ks]
        return group

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, node: object) -> bool:
        return node in self._order
