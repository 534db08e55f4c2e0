"""Reclaim's candidate nodes: only the nodes holding a victim that one search may take, in the
victim index's order, without visiting the others.

A reclaim search may take a victim holding ``g`` GPUs, with nothing taken yet, iff ``g`` is at
most a bound of its project (``ReclaimSearch.takes_up_to``: what every project on the victim's
side of the tree can still give). So the nodes worth visiting are, per project, those where it
has a victim at most that large: each project's nodes are kept once per distinct victim size
(``VictimSizes``, shared by the indexes of one action over the same victims, built once), and
a search merges the lists of the sizes within each project's bound, each list put in the
index's node order the first time a search of that index needs it (``TakeableNodes``). The
lists are a superset (a victim evicted since, a node pruned): the scan checks each node it is
given exactly, as before (``tessera.core.cycle.victims``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol


class _Victim(Protocol):
    @property
    def project(self) -> str: ...

    @property
    def evicted(self) -> bool: ...


class VictimSizes:
    """Per project and victim size (GPUs), the nodes holding such a victim (no order), kept
    up to date as victims are evicted for good."""

    def __init__(self, entries: Iterable[tuple[_Victim, float, Sequence[str]]]) -> None:
        """``entries``: (victim, the GPUs it counts, the nodes it runs on)."""
        sizes: dict[str, dict[float, dict[str, int]]] = {}
        for v, g, where in entries:
            of_project = sizes.get(v.project)
            if of_project is None:
                of_project = sizes[v.project] = {}
            nodes = of_project.get(g)
            if nodes is None:
                nodes = of_project[g] = {}
            for node in where:
                nodes[node] = nodes.get(node, 0) + 1
        self._sizes = sizes
        self.by_project: dict[str, list[tuple[float, dict[str, int]]]] = {
            project: sorted(of_project.items()) for project, of_project in sizes.items()}
        """Per project, (victim size, its nodes with how many such victims each), sizes
        ascending."""

    def nodes_of(self, project: str, size: float) -> dict[str, int]:
        """The nodes holding a victim of ``project`` of ``size`` GPUs (with how many each)."""
        return self._sizes[project][size]

    def evicted_for_good(self, v: _Victim, size: float, nodes: Iterable[str]) -> None:
        """``v`` (``size`` GPUs, on ``nodes``) stays evicted: a node with no other victim of
        its project and size leaves that list."""
        of_size = self._sizes.get(v.project, {}).get(size)
        if of_size is None:
            return
        for node in nodes:
            left = of_size.get(node, 0) - 1
            if left > 0:
                of_size[node] = left
            else:
                of_size.pop(node, None)

    @classmethod
    def of_index(cls, by_node: Mapping[str, Sequence[_Victim]],
                 gpus: Callable[[str], Sequence[float]]) -> VictimSizes:
        """From an index's groups (an index not built by ``VictimOrder``)."""
        return cls((v, g, (node,)) for node, group in by_node.items()
                   for v, g in zip(group, gpus(node), strict=True))


class TakeableNodes:
    """Per project and victim size, the positions (in one index's node order) of the nodes
    holding such a victim."""

    def __init__(self, sizes: VictimSizes, by_node: Mapping[str, Sequence[_Victim]],
                 gpus: Callable[[str], Sequence[float]]) -> None:
        """``by_node``: victims per node, nodes in preference order; ``gpus(node)``: the GPUs
        each of them counts, in the same order."""
        self.names = list(by_node)
        self.position = {node: k for k, node in enumerate(self.names)}
        self.sizes = sizes
        self._by_node = by_node
        self._gpus = gpus
        self._scopes: dict[tuple[tuple[str, int], ...], int] = {}
        """Per choice of (project, how many of its smallest sizes), its number (``choose``)."""
        self._sizes_of: dict[str, tuple[list[float], list[list[int]]]] = {
            project: ([size for size, _ in sizes], []) for project, sizes in sizes.by_project.items()}
        """Per project: its victim sizes ascending, and the lists of the first ones as made."""
        self._pairs: list[tuple[tuple[str, float], ...]] = []
        """Per scope, its (project, size) pairs."""
        self._unions: dict[int, LazyUnion] = {}
        """Per scope, its lists' union as far as made (``union``)."""
        self._lists: dict[tuple[str, float], list[int]] = {}
        """(project, size): node positions ascending, made on first use."""

    def entries(self, project: str, size: float, nodes: Mapping[str, int]) -> list[int]:
        found = self._lists.get((project, size))
        if found is None:
            position = self.position
            found = self._lists[(project, size)] = sorted(
                position[n] for n in nodes if n in position)
        return found

    def evicted_for_good(self, v: _Victim, nodes: Iterable[str]) -> None:
        """``v`` (running on ``nodes``) is evicted and stays so for the rest of the action: its
        nodes leave its project's list of its size unless another such victim is left there."""
        for node in nodes:
            group = self._by_node.get(node)
            if group is None:
                continue
            gpus = self._gpus(node)
            size = next((g for w, g in zip(group, gpus, strict=True) if w is v), None)
            if size is None:
                continue
            entries = self._lists.get((v.project, size))
            if entries is None:
                continue  # not made yet: made later, it may offer the node (a superset)
            if any(w is not v and not w.evicted and w.project == v.project and g == size
                   for w, g in zip(group, gpus, strict=True)):
                continue
            position = self.position[node]
            k = bisect_left(entries, position)
            if k < len(entries) and entries[k] == position:
                del entries[k]
                pair = (v.project, size)
                for union in self._unions.values():
                    if pair in union.pairs:
                        union.drop(position)

    def candidates(self, bound: Callable[[str], float]) -> Iterator[str]:
        """The nodes holding a victim of some project of at most ``bound(project)`` GPUs (a
        victim holding none counts when the bound is above minus infinity), each once, in the
        index's order (with nodes since left by their last such victim: a superset)."""
        scope, chosen = self.choose(bound)
        return self.nodes_in(self.union(scope, chosen))

    def choose(self, bound: Callable[[str], float]) -> tuple[int, list[list[int]]]:
        """The lists of the (project, size) pairs within ``bound``, and a small int naming that
        choice of pairs (the same pairs, the same int, for the rest of the action: the lists
        may have lost nodes since, as victims were evicted for good). A project's sizes within
        its bound are a prefix of its sizes ascending (found by bisection)."""
        parts: list[tuple[str, int]] = []
        chosen: list[list[int]] = []
        minus_inf = float("-inf")
        for project, (values, made) in self._sizes_of.items():
            top = bound(project)
            if top == minus_inf:
                continue
            n = bisect_right(values, top if top > 0.0 else 0.0)
            if not n:
                continue
            parts.append((project, n))
            if len(made) < n:
                sizes = self.sizes.by_project[project]
                made.extend(self.entries(project, size, nodes) for size, nodes in sizes[len(made):n])
            chosen.extend(made[:n])
        scopes = self._scopes
        key = tuple(parts)
        scope = scopes.get(key)
        if scope is None:
            scope = scopes[key] = len(scopes)
            self._pairs.append(tuple((project, size) for project, n in parts
                                     for size, _ in self.sizes.by_project[project][:n]))
        return scope, chosen

    def union(self, scope: int, chosen: list[list[int]]) -> LazyUnion:
        """The union of ``chosen`` (``choose``'s lists for ``scope``), kept per scope for the
        rest of the action and made as far as searches read it."""
        found = self._unions.get(scope)
        if found is None:
            found = self._unions[scope] = LazyUnion(chosen, len(self.names), self._pairs[scope])
        return found

    def nodes_in(self, union: LazyUnion, start: int = 0) -> Iterator[str]:
        """The union's nodes from position ``start`` on, as names."""
        return map(self.names.__getitem__, union.from_position(start))


FIRST_WINDOW = 256
"""Node positions in the first window of a ``LazyUnion``; each next window is twice as wide."""


class LazyUnion:
    """The union of some candidate lists (each ascending), ascending, each position once, made
    one window of positions ``[low, high)`` at a time (found in each list by bisection), as far
    as a reader goes: a search reads a few dozen nodes of a union of thousands at 5,000 nodes,
    so merging every list whole for each search cost more than the scan itself.

    Kept for the rest of the action (``TakeableNodes.union``): later searches of the same
    choice of lists read what is made. When a list loses a node (its last victim of that
    project and size evicted for good) that no other list of the union holds, the node leaves
    what was made too (``drop``), so what is made is always the lists' exact union in its
    range. The windows cover every position once, from where the last ended
    (``tests/core/cycle/test_takeable.py``)."""

    __slots__ = ("dropped", "end", "lists", "low", "pairs", "positions", "width")

    def __init__(self, lists: Sequence[Sequence[int]], end: int,
                 pairs: Iterable[tuple[str, float]] = ()) -> None:
        self.lists = lists
        self.end = end
        self.pairs = frozenset(pairs)
        """The (project, size) pairs of the lists."""
        self.positions: list[int] = []
        self.low = 0
        self.width = FIRST_WINDOW
        self.dropped: list[int] = []
        """The positions that left what was made, in turn (``ScanPrefix`` forgets them)."""

    def drop(self, position: int) -> None:
        """A list lost ``position``: it leaves the union unless another list holds it."""
        if position >= self.low:
            return  # not made yet: made from the lists as they are then
        for entries in self.lists:
            k = bisect_left(entries, position)
            if k < len(entries) and entries[k] == position:
                return
        positions = self.positions
        k = bisect_left(positions, position)
        if k < len(positions) and positions[k] == position:
            del positions[k]
            self.dropped.append(position)

    def _extend(self) -> bool:
        """The next window with a position in it; False at the end."""
        while self.low < self.end:
            low, high = self.low, self.low + self.width
            window: set[int] = set()
            for entries in self.lists:
                s = bisect_left(entries, low)
                e = bisect_left(entries, high, s)
                if e > s:
                    window.update(entries[s:e])
            self.low, self.width = high, self.width * 2
            if window:
                self.positions.extend(sorted(window))
                return True
        return False

    def from_position(self, start: int) -> Iterator[int]:
        """The positions from ``start`` on (made as they are read)."""
        positions = self.positions
        k = bisect_left(positions, start)
        while True:
            while k < len(positions):
                yield positions[k]
                k += 1
            if not self._extend():
                return
            k = max(k, bisect_left(positions, start))
