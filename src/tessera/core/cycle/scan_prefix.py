"""What reclaim's node scan did at each of one (request, choice of candidate lists)'s candidate
nodes, kept for the searches after it (``tessera.core.cycle.victims.cheapest_node``).

At 5,000 nodes successive searches for the same request shape and the same victim sizes pass
the same nodes in the preference order: nodes with nothing they may take, with no room even
with every victim gone, or (counted towards ``max_victim_nodes``) with no room with only the
victims they may take gone. Nine in ten node visits were such passes. A ``ScanPrefix`` records,
for the candidates from the first as far as a scan went, each node's state (its signature
object, renewed on every change) and what the scan did there: passed it (``SKIPPED``), counted
it (``COUNTED``) or looked at it fully (``LOOKED``, taking victims by the rules). A later search
walks the entries whose node state is the same object, passing and counting as recorded and
looking fully at the ``LOOKED`` nodes without the room tests; from the first entry that does
not stand it works the nodes out as before, recording them anew.

Why a standing entry gives the same outcome: which of the three the scan does at a node is a
function of the node's state, the request (its key) and the chosen lists (the scope), besides
the no-room marks and pruning (``NodeIndex.room_verdict``, the models test). The marks only
grow, and a node marked since that was not passed then is worked out again; pruning only
happens in preempt's and consolidate's scans, which keep no record (nor does a search with a
node constraint). The candidate union of a scope only loses nodes (``takeable.LazyUnion``), and
a node it lost has nothing to take: it was passed then as it would be now, or its state changed
since. What the scan does with the outcomes (the count, the limit, the feasible nodes, the best
victim set) is the same code either way. (``tests/core/cycle/test_reclaim_fast_path.py`` runs
each search with and without the records and compares the victims chosen.)
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence

from tessera.core.state import NodeState

from .takeable import LazyUnion

SKIPPED, COUNTED, LOOKED = 0, 1, 2
"""What the scan did with a node: passed it uncounted, counted it (no room with the victims it
may take gone), looked at it fully (``room_verdict``'s ``SCAN``)."""


class ScanPrefix:
    """(node position, node, its state object, the state's signature then, ``SKIPPED``/
    ``COUNTED``/``LOOKED``), in candidate order from the first, as far as a scan went."""

    __slots__ = ("drops", "entries")

    def __init__(self) -> None:
        self.entries: list[tuple[int, str, NodeState, object, int]] = []
        self.drops = 0
        """How many of the union's ``dropped`` the entries have forgotten."""

    def note(self, entry: tuple[int, str, NodeState, object, int]) -> None:
        self.entries.append(entry)

    def walk(self, skip: Container[str], union: LazyUnion, names: Sequence[str],
             ) -> Iterator[tuple[int, str, int | None]]:
        """The candidates in order (position, node), each with what the scan did there before
        if that stands (its node state the same object and, unless skipped, not in ``skip``
        now), else None: the standing entries from the first, then, from the first that does
        not stand (dropped with all after it: the scan records them again), the union's nodes
        from its position on. Entries of nodes that left the union (nothing of the chosen
        sizes left to take there, for the rest of the action) are forgotten first."""
        if self.drops != len(union.dropped):
            gone = set(union.dropped[self.drops:])
            self.entries = [e for e in self.entries if e[0] not in gone]
            self.drops = len(union.dropped)
        entries = self.entries
        start = entries[-1][0] + 1 if entries else 0
        for k, (position, node, ns, sig, did) in enumerate(entries):
            if ns.sig is not sig or (did != SKIPPED and node in skip):
                del entries[k:]
                start = position
                break
            yield position, node, did
        for position in union.from_position(start):
            yield position, names[position], None
