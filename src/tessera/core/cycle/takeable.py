"""Reclaim's candidate nodes: only the nodes holding a victim that one search may take, in the
victim index's order, without visiting the others.

A reclaim search may take a victim holding ``g`` GPUs, with nothing taken yet, iff ``g`` is at
most a bound of its project (``ReclaimSearch.takes_up_to``: what every project on the victim's
side of the tree can still give). So the nodes worth visiting are, per project, those where it
has a victim at most that large: each project's nodes are kept once per distinct victim size
(sorted by the index's order), and a search merges the lists of the sizes within each
project's bound. The lists are a superset (a victim evicted since, a node pruned): the scan
checks each node it is given exactly, as before (``tessera.core.cycle.victims``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol


class _Victim(Protocol):
    @property
    def project(self) -> str: ...

    @property
    def evicted(self) -> bool: ...


class TakeableNodes:
    """Per project and victim size (GPUs), the positions of the nodes holding such a victim."""

    def __init__(self, by_node: Mapping[str, Sequence[_Victim]],
                 gpus: Callable[[str], tuple[float, ...]]) -> None:
        """``by_node``: victims per node, nodes in preference order; ``gpus(node)``: the GPUs
        each of them counts, in the same order."""
        self.names = list(by_node)
        self.position = {node: k for k, node in enumerate(self.names)}
        self._by_node = by_node
        self._gpus = gpus
        sizes: dict[str, dict[float, list[int]]] = {}
        self._nodes_of: dict[int, list[str]] = {}
        """Per victim (``id``), the nodes it runs on."""
        for position, node in enumerate(self.names):
            for v, g in zip(by_node[node], gpus(node), strict=True):
                self._nodes_of.setdefault(id(v), []).append(node)
                of_project = sizes.get(v.project)
                if of_project is None:
                    of_project = sizes[v.project] = {}
                entries = of_project.get(g)
                if entries is None:
                    of_project[g] = [position]
                elif entries[-1] != position:
                    entries.append(position)
        self.sizes = sizes
        self.by_project: dict[str, list[tuple[float, list[int]]]] = {
            project: sorted(of_project.items()) for project, of_project in sizes.items()}
        """Per project, (victim size, node positions ascending), sizes ascending (the lists
        of ``sizes``)."""

    def evicted_for_good(self, v: _Victim) -> None:
        """``v`` is evicted and stays so for the rest of the action: its nodes leave its
        project's list of its size unless another such victim is left there."""
        for node in self._nodes_of.get(id(v), ()):
            group, gpus = self._by_node[node], self._gpus(node)
            size = next(g for w, g in zip(group, gpus, strict=True) if w is v)
            if any(w is not v and not w.evicted and w.project == v.project and g == size
                   for w, g in zip(group, gpus, strict=True)):
                continue
            entries = self.sizes[v.project][size]
            position = self.position[node]
            k = bisect_left(entries, position)
            if k < len(entries) and entries[k] == position:
                del entries[k]

    def candidates(self, bound: Callable[[str], float]) -> Iterator[str]:
        """The nodes holding a victim of some project of at most ``bound(project)`` GPUs (a
        victim holding none counts when the bound is above minus infinity), each once, in the
        index's order."""
        chosen: list[list[int]] = []
        for project, sizes in self.by_project.items():
            top = bound(project)
            if top == float("-inf"):
                continue
            top = max(top, 0.0)
            for size, entries in sizes:
                if size > top:
                    break
                chosen.append(entries)
        names = self.names
        if len(chosen) == 1:
            for position in chosen[0]:
                yield names[position]
            return
        last = -1
        for position in heapq.merge(*chosen):
            if position != last:
                last = position
                yield names[position]
