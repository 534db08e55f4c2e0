"""What reclaim's node scan found at the front of one (request, choice of candidate lists)'s
candidates, kept for the searches after it (``tessera.core.cycle.victims.cheapest_node``).

At 5,000 nodes successive searches for the same request shape and the same victim sizes pass
the same nodes at the front of the preference order: nodes with nothing they may take, with
no room even with every victim gone, or (counted towards ``max_victim_nodes``) with no room
with only the victims they may take gone. Nine in ten node visits were such passes. A
``ScanPrefix`` records, for the candidates from the first up to the first node the scan had to
look at fully, each node's state (its signature object, renewed on every change) and whether
it counted; a later search replays the entries whose node state is the same object, and
resumes the scan at the first that is not (or after the last).

Why a standing entry gives the same outcome: everything the scan decides on such a node is a
function of the node's state, the request (its key) and the chosen lists (the scope), besides
the no-room marks and pruning. The marks only grow, and a node marked since that counted then
is not replayed (it is looked at again); pruning only happens in preempt's and consolidate's
scans, which keep no prefix. The candidate union of a scope only loses nodes
(``takeable.LazyUnion``), and a node it lost has nothing to take, so it is skipped uncounted,
whatever the record says of it only if it was skipped then too: a node that counted had a
victim to take, and that victim keeps it in the lists while its state stands. Before the
first fully looked-at node nothing was feasible and no best was found, so the scan's only
stop there is the count reaching the limit; the replay stops there too.
(``tests/core/cycle/test_reclaim_fast_path.py`` runs each search with and without the replay
and compares the victims chosen.)
"""

from __future__ import annotations

from collections.abc import Container

from tessera.core.state import NodeState


class ScanPrefix:
    """(node, its state object, the state's signature then, whether it counted), in candidate
    order from the first."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[str, NodeState, object, bool]] = []

    def replay(self, skip: Container[str], budget: int) -> tuple[int, int, bool]:
        """(how many entries stand, how many of those counted, whether the count reached
        ``budget``, where the scan stops): the entries from the first whose node state is the
        same object and, if it counted, is not in ``skip`` now. Entries from the first that does
        not stand are dropped (the scan records them again as it goes on)."""
        examined = 0
        entries = self.entries
        for k, (node, ns, sig, counts) in enumerate(entries):
            if ns.sig is not sig or (counts and node in skip):
                del entries[k:]
                return k, examined, False
            if counts:
                examined += 1
                if examined >= budget:
                    return k + 1, examined, True
        return len(entries), examined, False
