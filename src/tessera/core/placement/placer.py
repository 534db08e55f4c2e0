"""Choosing a node and devices for one request, fast enough for large clusters.

A node's score for a request changes only when that node changes. So for each distinct request
the placer keeps a heap of node scores and a set of nodes changed since it last looked
(``ClusterState.subscribe``); a decision rescores only those nodes, and scores are memoised per
(node state, request), so nodes in the same state are scored once. Ties go to the node that
came first, so placement is deterministic; the ``random`` policy draws from a seeded generator.

A request placed with a ``NodeConstraint`` (``tessera.core.constraints``) gets its own ranking,
shared by every pod with an equal constraint: nodes the constraint's static filter refuses are
never entered, and each node's key is the policy's score plus ``PREFERENCE_WEIGHT`` × the
constraint's preference. A dynamic constraint is asked at decision time, best node first.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.core import nvlink
from tessera.core.constraints import PREFERENCE_WEIGHT, NodeConstraint, PlacedPods, static_token
from tessera.core.model import ResourceRequest
from tessera.core.placement.devices import could_ever_fit, make_placement
from tessera.core.placement.explain import explain_no_fit
from tessera.core.placement.policies import DEFAULT_POLICY, Choice, Policy, make_policy
from tessera.core.state import ClusterState, Placement

NVLINK_SPAN_PENALTY = 2.0
"""Subtracted from a node's score when the devices a multi-GPU request would get there span
NVLink islands (known topology only). Policy scores are in GPUs (fragmentation, free GPUs left)
or fractions of a node, so a node where the set stays on NVLink ranks first unless the policy
prefers the other by more than two GPUs' worth; it never makes a node infeasible."""


_UNKNOWN = object()


@dataclass(frozen=True, slots=True)
class NoFit:
    """Nothing fits now; ``reason`` says why in words a person can act on."""

    reason: str


class _Ranking:
    """Feasible nodes of one request, best first, refreshed lazily from a dirty set."""

    __slots__ = ("choices", "dirty", "heap", "members", "sids", "stamps")

    def __init__(self, dirty: set[int]) -> None:
        self.dirty = dirty
        self.heap: list[tuple[float, int, int]] = []
        self.stamps: dict[int, int] = {}
        self.sids: dict[int, int] = {}
        """Node index -> signature id it was last scored at: a node changed and changed back
        (a discarded statement, a warm session's cycle) keeps its heap entry."""
        self.choices: dict[int, Choice] = {}
        self.members: list[int] = []


class Placer:
    MAX_RANKINGS = 1024
    MAX_MEMO = 500_000

    def __init__(
        self,
        state: ClusterState,
        policy: str = DEFAULT_POLICY,
        seed: int = 0,
        workload: Sequence[tuple[ResourceRequest, float]] | None = None,
    ) -> None:
        self.state = state
        self.rng = random.Random(seed)
        self.policy: Policy = make_policy(policy, self.rng, workload)
        observe = getattr(self.policy, "observe_cluster", None)
        if observe is not None:
            capacity: dict[str, int] = {}
            for ns in state.nodes:
                for model in ns.dev_models:
                    capacity[model] = capacity.get(model, 0) + 1
            observe(capacity)
        self._rankings: OrderedDict[object, _Ranking] = OrderedDict()
        self._static: dict[NodeConstraint, tuple[bytearray, list[float], object | None]] = {}
        """Constraint -> (allowed, preference per node index, its ``static_token`` then)."""
        self._static_used: set[NodeConstraint] = set()
        self._possible: dict[ResourceRequest, bytearray] = {}
        self._memo: dict[tuple[int, int], Choice | None] = {}
        self._request_ids: dict[ResourceRequest, int] = {}
        self._next_request_id = 0
        self._stamp = 0

    def place(
        self,
        request: ResourceRequest,
        *,
        explain: bool = True,
        constraint: NodeConstraint | None = None,
        placed: PlacedPods | None = None,
    ) -> Placement | NoFit:
        """Choose where ``request`` runs now. Does not change the state: ``assign`` does.

        ``constraint``: only nodes it allows (and, if dynamic, admits given ``placed``)."""
        if self.policy.randomised:
            found = self._random_pick(request, constraint, placed)
        else:
            found = self._best(request, constraint, placed)
        if found is None:
            return NoFit(explain_no_fit(self.state, request) if explain else "does not fit")
        index, devices = found
        return make_placement(self.state.nodes[index], request, devices)

    def close(self) -> None:
        for ranking in self._rankings.values():
            self.state.unsubscribe(ranking.dirty)
        self._rankings.clear()

    def forget_constraints(self) -> None:
        """Drop what was learnt per ``NodeConstraint`` (static filters, preferences, rankings):
        a kept placer's next cycle may bring constraints that compare equal to the last ones
        but answer from that cycle's view of the cluster (a cordoned node, a new taint). Kept:
        those asked since the last call whose ``static_token`` is still the one they were
        computed at (the same nodes and node facts), with their rankings."""
        kept = {}
        for c in self._static_used:
            found = self._static.get(c)
            if found is not None and found[2] is not None and static_token(c) == found[2]:
                kept[c] = found
        self._static = kept
        self._static_used = set()
        for key in [k for k in self._rankings if isinstance(k, tuple) and k[1] not in kept]:
            self.state.unsubscribe(self._rankings.pop(key).dirty)

    def _ranking(self, key: object) -> _Ranking:
        ranking = self._rankings.get(key)
        if ranking is None:
            if len(self._rankings) >= self.MAX_RANKINGS:
                _, old = self._rankings.popitem(last=False)
                self.state.unsubscribe(old.dirty)
            ranking = _Ranking(self.state.subscribe())
            self._rankings[key] = ranking
        else:
            self._rankings.move_to_end(key)
        return ranking

    def static(self, constraint: NodeConstraint) -> tuple[bytearray, list[float]]:
        """Per node index: does the constraint allow it, and its preference (asked once)."""
        found = self._static.get(constraint)
        nodes = self.state.nodes
        if found is None or len(found[0]) != len(nodes):
            allowed = bytearray(len(nodes))
            prefs = [0.0] * len(nodes)
            for ns in nodes:
                if constraint.allows(ns.node):
                    allowed[ns.index] = 1
                    prefs[ns.index] = PREFERENCE_WEIGHT * constraint.score(ns.node)
            found = self._static[constraint] = (allowed, prefs, static_token(constraint))
        self._static_used.add(constraint)
        return found[0], found[1]

    def _possible_nodes(self, request: ResourceRequest) -> bytearray:
        """Per node index: could the request run there if the node were empty (capacity, GPU
        model, device count and size)? Nodes where it never could are never scored for it."""
        found = self._possible.get(request)
        nodes = self.state.nodes
        if found is None or len(found) != len(nodes):
            if len(self._possible) >= 4 * self.MAX_RANKINGS:
                self._possible.clear()
            by_static: dict[int, int] = {}
            found = bytearray(len(nodes))
            for ns in nodes:
                ok = by_static.get(ns.static_id)
                if ok is None:
                    ok = by_static[ns.static_id] = int(could_ever_fit(ns, request))
                found[ns.index] = ok
            self._possible[request] = found
        return found

    def _request_id(self, request: ResourceRequest) -> int:
        """A small id per distinct request, so memo keys do not rehash the request every time.

        Ids are never reused, not even after the memo is cleared: a decision in progress keeps
        using its id after a clear, so a reused id would hand one request another's cached
        placement (a model-constrained pod on a GPU model it does not allow).
        """
        rid = self._request_ids.get(request)
        if rid is None:
            rid = self._request_ids[request] = self._next_request_id
            self._next_request_id += 1
        return rid

    def _evaluate(self, index: int, request: ResourceRequest, rid: int) -> Choice | None:
        state = self.state
        ns = state.nodes[index]
        sid = ns.sid
        key = (state.signature_id(ns) if sid is None else sid, rid)
        found = self._memo.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
        if len(self._memo) > self.MAX_MEMO:
            self._memo.clear()
            self._request_ids.clear()
        choice = self.policy.evaluate(ns, request)
        if (choice is not None and len(choice[1]) > 1 and ns.node.nvlink is not None
                and not nvlink.one_island(ns.node.nvlink, choice[1])):
            choice = (choice[0] - NVLINK_SPAN_PENALTY, choice[1])
        self._memo[key] = choice
        return choice

    def _best(
        self,
        request: ResourceRequest,
        constraint: NodeConstraint | None = None,
        placed: PlacedPods | None = None,
    ) -> tuple[int, tuple[int, ...]] | None:
        if constraint is None:
            r = self._ranking(request)
            allowed: bytearray | None = None
            prefs: list[float] | None = None
        else:
            r = self._ranking((request, constraint))
            allowed, prefs = self.static(constraint)
        if r.dirty:
            rid = self._request_id(request)
            possible = self._possible_nodes(request)
            state = self.state
            nodes = state.nodes
            sids, stamps, choices = r.sids, r.stamps, r.choices
            memo = self._memo
            stamp = self._stamp
            fresh: list[tuple[float, int, int]] = []
            for index in r.dirty:
                if not possible[index] or (allowed is not None and not allowed[index]):
                    continue
                ns = nodes[index]
                sid = ns.sid
                if sid is None:
                    sid = state.signature_id(ns)
                if sids.get(index) == sid:
                    continue  # scored in this very state: its entry (or absence) stands
                sids[index] = sid
                choice = memo.get((sid, rid), _UNKNOWN)
                if choice is _UNKNOWN:
                    choice = self._evaluate(index, request, rid)
                    memo = self._memo  # (cleared when full)
                if choice is None:
                    stamps.pop(index, None)
                    continue
                stamp += 1
                stamps[index] = stamp
                choices[index] = choice  # type: ignore[assignment]
                key = -choice[0] if prefs is None else -(choice[0] + prefs[index])  # type: ignore[index]
                fresh.append((key, index, stamp))
            self._stamp = stamp
            r.dirty.clear()
            # The best valid entry is the least of them however the heap is laid out, so
            # many new entries are added by one linear heapify instead of a push each.
            if len(fresh) > len(r.heap):
                r.heap.extend(fresh)
                heapq.heapify(r.heap)
            else:
                for entry in fresh:
                    heapq.heappush(r.heap, entry)
            if len(r.heap) > 4 * len(r.stamps) + 64:
                r.heap = [e for e in r.heap if r.stamps.get(e[1]) == e[2]]
                heapq.heapify(r.heap)
        heap = r.heap
        if constraint is not None and constraint.dynamic:
            return self._best_admitted(r, constraint, placed)
        while heap:
            _, index, stamp = heap[0]
            if r.stamps.get(index) == stamp:
                return index, r.choices[index][1]
            heapq.heappop(heap)
        return None

    def _best_admitted(
        self, r: _Ranking, constraint: NodeConstraint, placed: PlacedPods | None
    ) -> tuple[int, tuple[int, ...]] | None:
        """The best node the dynamic filter admits now (refused entries are put back)."""
        heap = r.heap
        refused: list[tuple[float, int, int]] = []
        found: tuple[int, tuple[int, ...]] | None = None
        nodes = self.state.nodes
        view = placed if placed is not None else _NOTHING_PLACED
        while heap:
            entry = heap[0]
            index, stamp = entry[1], entry[2]
            if r.stamps.get(index) != stamp:
                heapq.heappop(heap)
                continue
            if constraint.admits(nodes[index].node, view):
                found = (index, r.choices[index][1])
                break
            refused.append(heapq.heappop(heap))
        for entry in refused:
            heapq.heappush(heap, entry)
        return found

    def _random_pick(
        self,
        request: ResourceRequest,
        constraint: NodeConstraint | None = None,
        placed: PlacedPods | None = None,
    ) -> tuple[int, tuple[int, ...]] | None:
        if constraint is None:
            r = self._ranking(request)
            allowed: bytearray | None = None
        else:
            r = self._ranking((request, constraint))
            allowed = self.static(constraint)[0]
        if r.dirty:
            possible = self._possible_nodes(request)
            for index in sorted(r.dirty):
                feasible = possible[index] and (allowed is None or bool(allowed[index])) and self.policy.evaluate(
                    self.state.nodes[index], request
                ) is not None
                if feasible and index not in r.stamps:
                    r.stamps[index] = len(r.members)
                    r.members.append(index)
                elif not feasible and index in r.stamps:
                    pos = r.stamps.pop(index)
                    last = r.members.pop()
                    if last != index:
                        r.members[pos] = last
                        r.stamps[last] = pos
            r.dirty.clear()
        members = r.members
        if constraint is not None and constraint.dynamic:
            view = placed if placed is not None else _NOTHING_PLACED
            members = [i for i in members if constraint.admits(self.state.nodes[i].node, view)]
        if not members:
            return None
        index = members[self.rng.randrange(len(members))]
        choice = self.policy.evaluate(self.state.nodes[index], request)
        assert choice is not None
        return index, choice[1]


class _NothingPlaced:
    def node_of(self, workload_id: str, pod: int) -> str | None:
        return None


_NOTHING_PLACED = _NothingPlaced()
