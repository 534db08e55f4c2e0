"""Reclaim's, preempt's and consolidate's victims grouped by node (``NodeIndex``), with the
room tests their node scan asks per node (``tessera.core.cycle.victims.cheapest_node``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

from tessera.core.model import ResourceRequest

from .kept_room import KeptRoom, fresh_room
from .room_fit import fits_after, free_all_on
from .room_seen import RoomSeen
from .scan_prefix import ScanPrefix
from .session import Session, WorkloadState
from .takeable import TakeableNodes, VictimSizes
from .victim_groups import EntriesByNode, LazyGroups

Entry = tuple[WorkloadState, float, tuple[str, ...]]
"""A victim, the GPUs it counts and the nodes it runs on (``NodeIndex.of_order``)."""

LISTS_AFTER = 0
"""Node scans of one index (reclaim) before it builds its candidate lists (``TakeableNodes``).
Zero since the lists are made per (project, victim size) on first use from ``VictimSizes``
(shared by an action's indexes): a scan of every node of the index costs more than the lists a
first search needs (it visited up to 5,000 nodes at 5,000 nodes, most with nothing to take)."""


NO_ROOM, NO_ROOM_TAKING, SCAN, NOTHING_TAKEABLE = 0, 1, 2, 3
"""``NodeIndex.room_verdict``'s outcomes."""


class NodeIndex:
    """Eligible victims grouped by the nodes their pods run on, in preference order."""

    def __init__(self, victims: Iterable[WorkloadState], like: NodeIndex | None = None) -> None:
        """``like``: another index over the same victims (in another order) whose pruning
        this one shares, since what is pruned does not depend on the order."""
        by_node: dict[str, list[WorkloadState]] = {}
        get = by_node.get
        for v in victims:
            for p in v.placements:
                if p is None:
                    continue
                group = get(p.node)
                if group is None:
                    by_node[p.node] = [v]
                elif group[-1] is not v:
                    group.append(v)
        self._setup(by_node, {}, like, None)

    @classmethod
    def of_order(cls, base: EntriesByNode, order: Sequence[int], rank: Sequence[int],
                 like: NodeIndex | None, sizes: VictimSizes) -> NodeIndex:
        """The index of the victims of ``base``'s entries that are not evicted, in ``order``
        (entry positions; as ``NodeIndex(victims)`` groups them), each node's group made when
        first read (``LazyGroups``); ``rank[k]``: entry ``k``'s project rank, the order being
        (rank, k). Each victim's GPUs and nodes are worked out once for every index of an
        action (``VictimOrder``), and their sizes' node lists (``sizes``)."""
        groups = LazyGroups(base, order, rank)
        index = cls.__new__(cls)
        index._setup(groups, groups.gpus, like, sizes)
        return index

    @classmethod
    def of_groups(cls, by_node: Mapping[str, list[WorkloadState]]) -> NodeIndex:
        """The index of groups made elsewhere, in the node order and with the victims
        ``__init__`` would give (consolidate: ``kept_groups``)."""
        index = cls.__new__(cls)
        index._setup(by_node, {}, None, None)
        return index

    def _setup(self, by_node: Mapping[str, list[WorkloadState]], gpus: dict[str, list[float]],
               like: NodeIndex | None, sizes: VictimSizes | None) -> None:
        self.by_node = by_node
        self._gpus: dict[str, Sequence[float]] = cast(dict[str, Sequence[float]], gpus)
        self._sizes = sizes
        self._takeable: TakeableNodes | None = None
        self._scans = 0
        self.pruned: set[str] = set() if like is None else like.pruned
        self.no_room: dict[ResourceRequest, set[str]] = {} if like is None else like.no_room
        """Nodes where even every victim gone would not make room for that request (for the
        rest of the action: ``no_room_even_empty``)."""
        self.room_seen: dict[str, RoomSeen] = {} if like is None else like.room_seen
        self.kept: KeptRoom | None = None if like is None else like.kept
        """What nodes have free with every victim gone, kept between cycles (reclaim's indexes:
        ``VictimOrder`` sets it)."""
        self.room_taking: dict[str, tuple[object, dict[int, RoomSeen]]] = {}
        """Per node: its state's signature, and per mask of victims what it would have free
        with them gone (``no_room_taking``)."""
        self.verdicts: dict[str, tuple[object, dict[tuple[int, ...], int]]] = {}
        """Per node: its state's signature, and per (request key, scope) what a scan does there
        (``room_verdict``)."""
        self.prefixes: dict[tuple[int, int], ScanPrefix] = {}
        """Per (request key, scope): the front of the reclaim scan as last found
        (``ScanPrefix``)."""
        self.request_keys: dict[ResourceRequest, int] = {}
        """A small int per distinct request (``room_verdict``'s memo key: hashing a request
        costs more than hashing an int)."""

    def takeable(self) -> TakeableNodes | None:
        """The nodes per project and victim size (reclaim's searches), built once the index
        has served ``LISTS_AFTER`` searches."""
        if self._takeable is None:
            self._scans += 1
            if self._scans <= LISTS_AFTER:
                return None
            sizes = self._sizes if self._sizes is not None else VictimSizes.of_index(self.by_node, self.gpus)
            self._takeable = TakeableNodes(sizes, self.by_node, self.gpus)
        return self._takeable

    def evicted_for_good(self, v: WorkloadState, nodes: Iterable[str]) -> None:
        """``v`` (which ran on ``nodes``) stays evicted for the rest of the action (its
        statement was committed): the candidate lists need not offer its nodes for it any more."""
        if self._takeable is not None:
            self._takeable.evicted_for_good(v, nodes)

    def gpus(self, node: str) -> Sequence[float]:
        """The GPUs each victim on ``node`` counts (its ``vector()[0]``, which stays as it is
        while it is a victim: it runs where it ran, or is evicted and put back there)."""
        found = self._gpus.get(node)
        if found is None:
            group = self.by_node[node]  # a lazy group records its GPUs as it is made
            found = self._gpus.get(node)
            if found is None:
                found = self._gpus[node] = tuple(v.vector()[0] for v in group)
        return found

    def prune(self, session: Session, node: str) -> None:
        """Skip a node whose victims are all gone; a discarded statement brings it back."""
        self.pruned.add(node)

        def undo() -> None:
            self.pruned.discard(node)

        session.on_undo(undo)

    def request_key(self, request: ResourceRequest) -> int:
        keys = self.request_keys
        found = keys.get(request)
        if found is None:
            found = keys[request] = len(keys)
        return found

    def room_verdict(self, session: Session, request: ResourceRequest, key: int, node: str,
                     scope: int | None, mask_of: Callable[[], int]) -> int:
        """What a reclaim scan does with ``node`` for ``request`` (``key``:
        ``request_key(request)``), given ``mask_of()``, the victims there this search may take
        each alone (a bit mask over ``by_node[node]``; -1: not known, all of them):
        ``NOTHING_TAKEABLE`` when the mask is 0; ``NO_ROOM`` when the request would not fit even
        with every victim gone (``no_room_even_empty``); ``NO_ROOM_TAKING`` when the mask is
        positive and it would not fit with only those victims gone (``no_room_taking``); else
        ``SCAN``.

        Memoised per node state (its signature object, renewed on every change: a victim
        evicted or put back changes it) and (key, ``scope``). ``scope`` names the candidate
        lists the search chose (``TakeableNodes.choose``: the (project, victim size) pairs
        within the search's bounds): a victim is in the mask iff it is not evicted and its
        (project, size) is chosen, so the node state and the scope fix the mask, and a memo hit
        needs neither the mask nor the room tests (at 5,000 nodes nine in ten visits are hits:
        successive searches pass the same nodes at the front of the preference order). With
        ``scope`` None the mask itself is in the key. The first answer made the same marks as
        the tests alone do (``tests/core/cycle/test_reclaim_fast_path.py`` checks every answer
        against freeing the victims afresh)."""
        sig = session.state.by_name[node].signature()
        memo = self.verdicts.get(node)
        if memo is None or memo[0] is not sig:
            memo = self.verdicts[node] = (sig, {})
        mask = -2
        at: tuple[int, ...]
        if scope is None:
            mask = mask_of()
            at = (key, -1, mask)
        else:
            at = (key, scope)
        verdict = memo[1].get(at)
        if verdict is None:
            if mask == -2:
                mask = mask_of()
            if not mask:
                verdict = NOTHING_TAKEABLE
            elif self.no_room_even_empty(session, request, node):
                verdict = NO_ROOM
            elif mask > 0 and self.no_room_taking(session, request, node, mask):
                verdict = NO_ROOM_TAKING
            else:
                verdict = SCAN
            memo[1][at] = verdict
        return verdict

    def no_room_even_empty(self, session: Session, request: ResourceRequest, node: str) -> bool:
        """Would ``request`` not fit on ``node`` even with every victim of the index gone
        (evicted or not, takeable by this search or not)? If so, the node is marked for the
        request (``no_room``): within one action only bindings change the answer, and they only
        take room, so a mark stays true. What the node would have free is memoised per node
        state (``RoomSeen``), with each request's answer, and between actions and cycles by
        ``kept`` where given (``KeptRoom``: while the node is unchanged, its victims the same)."""
        ns = session.state.by_name[node]
        sig = ns.signature()
        seen = self.room_seen.get(node)
        if seen is None or seen.sig is not sig:
            victims = [v for v in self.by_node[node] if not v.evicted]
            seen = self.room_seen[node] = (fresh_room(ns, victims, sig) if self.kept is None
                                           else self.kept.room(ns, victims))
        fits = seen.answers.get(request)
        if fits is None:
            fits = seen.answers[request] = fits_after(ns, request, seen.free, seen.tenants,
                                                      seen.cpu, seen.mem, seen.compute)
        if not fits:
            self.no_room.setdefault(request, set()).add(node)
        return not fits

    def no_room_taking(self, session: Session, request: ResourceRequest, node: str, mask: int) -> bool:
        """Would ``request`` not fit on ``node`` with only the victims of ``mask`` (bits over
        ``by_node[node]``) gone? Taking fewer frees less, so then no subset of them makes room.
        Memoised per node state and mask (this index's: the bits follow its order)."""
        ns = session.state.by_name[node]
        sig = ns.signature()
        seen = self.room_taking.get(node)
        if seen is None or seen[0] is not sig:
            seen = self.room_taking[node] = (sig, {})
        room = seen[1].get(mask)
        if room is None:
            free = [m - u for m, u in zip(ns.dev_memory, ns.dev_used, strict=True)]
            tenants = list(ns.dev_tenants)
            compute = list(ns.dev_compute)
            group = self.by_node[node]
            cpu, mem = free_all_on(node, [v for k, v in enumerate(group) if mask >> k & 1],
                                   free, tenants, compute)
            room = seen[1][mask] = RoomSeen(sig, free, tenants, ns.free_cpu + cpu,
                                            ns.free_mem + mem, compute, {})
        fits = room.answers.get(request)
        if fits is None:
            fits = room.answers[request] = fits_after(ns, request, room.free, room.tenants,
                                                      room.cpu, room.mem, room.compute)
        return not fits
