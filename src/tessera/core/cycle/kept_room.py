"""What each node would have free with every reclaim victim on it gone, kept between the cycles
of a warm session (``cycle.warm``) instead of worked out again for every node each cycle.

Reclaim's scan asks, per node it reaches, whether the request would fit with every victim
there gone (``NodeIndex.no_room_even_empty``): at 5,000 nodes a warm cycle's searches reach
nearly every node once, and freeing the victims' pods node by node was the largest part of a
warm cycle's reclaim. What that test works out (``RoomSeen``: free bytes, tenants and compute
per device, CPU and memory, and each request's answer) is a function of the node's contents
(its static facts and the pods on it) and of which of those pods are the victims'. So an entry
is kept per node with the ids of the victims it freed, and it stands while

- the node has not changed since: ``ClusterState.subscribe`` gives a set that receives every
  node any assign, release or rollback touches (a cycle's outer statement discarded touches
  every node the cycle changed, though they end as they were: those are worked out again), and
- the victims there are the same workloads (by id: a workload changed between cycles left its
  nodes and entered them again, which touched them).

Within one action the index's own memo (by node state object) answers first; this store
answers when that one misses (a new action, a new cycle). ``stale`` lists the entries that do
not equal a fresh computation (the warm property test calls it after every cycle:
``tests/core/cycle/test_warm.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.model import ResourceRequest
from tessera.core.state import NodeState

from .kept_with import KeptWith
from .room_fit import fits_after, free_all_on
from .room_seen import RoomSeen
from .session import Session, WorkloadState


class KeptRoom:
    """Per node: its contents and the victims freed when the entry was made, and what the node
    had free with them gone."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[tuple[object, ...], tuple[int, ...], frozenset[WorkloadState],
                                   RoomSeen]] = {}

    def room(self, ns: NodeState, victims: Sequence[WorkloadState]) -> RoomSeen:
        """What ``ns`` has free with the pods of ``victims`` on it gone (``sig``: the node's
        signature object now; ``answers`` shared with the entry kept)."""
        key = frozenset(victims)
        found = self.lookup(ns, key)
        if found is not None:
            return found
        sig = ns.signature()
        seen = fresh_room(ns, victims, sig)
        self.seen[ns.node.name] = (sig, tuple(ns.dev_tenants), key, seen)
        return seen

    def lookup(self, ns: NodeState, key: frozenset[WorkloadState]) -> RoomSeen | None:
        """The entry kept for ``ns`` if it stands: the node's contents as then (signature
        value, tenants per device) and the same victim states."""
        found = self.seen.get(ns.node.name)
        if found is None or found[2] != key:
            return None
        sig = ns.signature()
        if found[0] != sig or found[1] != tuple(ns.dev_tenants):
            return None
        seen = found[3]
        return RoomSeen(sig, seen.free, seen.tenants, seen.cpu, seen.mem, seen.compute, seen.answers)

    def stale(self, session: Session) -> list[str]:
        """The nodes whose entry ``lookup`` would give now (for the victims it was made for)
        but differs from what freeing those victims afresh gives, answers included (empty
        when right)."""
        wrong = []
        for node, (_, _, victims, _) in self.seen.items():
            ns = session.state.by_name[node]
            seen = self.lookup(ns, victims)
            if seen is None:
                continue
            fresh = fresh_room(ns, list(victims), None)
            if fresh[1:6] != seen[1:6] or any(fresh_answer(ns, fresh, request) != fits
                                             for request, fits in seen.answers.items()):
                wrong.append(node)
        return wrong


def fresh_room(ns: NodeState, victims: Sequence[WorkloadState], sig: object) -> RoomSeen:
    free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
    tenants = list(ns.dev_tenants)
    compute = list(ns.dev_compute)
    cpu, mem = free_all_on(ns.node.name, victims, free, tenants, compute)
    return RoomSeen(sig, free, tenants, ns.free_cpu + cpu, ns.free_mem + mem, compute, {})


def fresh_answer(ns: NodeState, seen: RoomSeen, request: ResourceRequest) -> bool:
    return fits_after(ns, request, seen.free, seen.tenants, seen.cpu, seen.mem, seen.compute)


kept_room: KeptWith[Session, KeptRoom] = KeptWith(lambda _session: KeptRoom())
"""This session's store (made on first use; a warm session keeps it between cycles)."""
