"""Choosing a node and devices for one request, fast enough for large clusters.

A node's score for a request changes only when that node changes. So for each distinct request
the placer keeps a heap of node scores and a set of nodes changed since it last looked
(``ClusterState.subscribe``); a decision rescores only those nodes, and scores are memoised per
(node state, request), so nodes in the same state are scored once. Ties go to the node that
came first, so placement is deterministic; the ``random`` policy draws from a seeded generator.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.core.model import ResourceRequest
from tessera.core.placement.devices import make_placement
from tessera.core.placement.explain import explain_no_fit
from tessera.core.placement.policies import DEFAULT_POLICY, Choice, Policy, make_policy
from tessera.core.state import ClusterState, Placement


@dataclass(frozen=True, slots=True)
class NoFit:
    """Nothing fits now; ``reason`` says why in words a person can act on."""

    reason: str


class _Ranking:
    """Feasible nodes of one request, best first, refreshed lazily from a dirty set."""

    __slots__ = ("choices", "dirty", "heap", "members", "stamps")

    def __init__(self, dirty: set[int]) -> None:
        self.dirty = dirty
        self.heap: list[tuple[float, int, int]] = []
        self.stamps: dict[int, int] = {}
        self.choices: dict[int, Choice] = {}
        self.members: list[int] = []


class Placer:
    MAX_RANKINGS = 256
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
        self._rankings: OrderedDict[ResourceRequest, _Ranking] = OrderedDict()
        self._memo: dict[tuple[object, int], Choice | None] = {}
        self._request_ids: dict[ResourceRequest, int] = {}
        self._next_request_id = 0
        self._stamp = 0

    def place(self, request: ResourceRequest, *, explain: bool = True) -> Placement | NoFit:
        """Choose where ``request`` runs now. Does not change the state: ``assign`` does."""
        found = self._random_pick(request) if self.policy.randomised else self._best(request)
        if found is None:
            return NoFit(explain_no_fit(self.state, request) if explain else "does not fit")
        index, devices = found
        return make_placement(self.state.nodes[index], request, devices)

    def close(self) -> None:
        for ranking in self._rankings.values():
            self.state.unsubscribe(ranking.dirty)
        self._rankings.clear()

    def _ranking(self, request: ResourceRequest) -> _Ranking:
        ranking = self._rankings.get(request)
        if ranking is None:
            if len(self._rankings) >= self.MAX_RANKINGS:
                _, old = self._rankings.popitem(last=False)
                self.state.unsubscribe(old.dirty)
            ranking = _Ranking(self.state.subscribe())
            self._rankings[request] = ranking
        else:
            self._rankings.move_to_end(request)
        return ranking

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
        ns = self.state.nodes[index]
        key = (ns.signature(), rid)
        if key in self._memo:
            return self._memo[key]
        if len(self._memo) > self.MAX_MEMO:
            self._memo.clear()
            self._request_ids.clear()
        choice = self.policy.evaluate(ns, request)
        self._memo[key] = choice
        return choice

    def _best(self, request: ResourceRequest) -> tuple[int, tuple[int, ...]] | None:
        r = self._ranking(request)
        if r.dirty:
            rid = self._request_id(request)
            for index in r.dirty:
                choice = self._evaluate(index, request, rid)
                if choice is None:
                    r.stamps.pop(index, None)
                    continue
                self._stamp += 1
                r.stamps[index] = self._stamp
                r.choices[index] = choice
                heapq.heappush(r.heap, (-choice[0], index, self._stamp))
            r.dirty.clear()
            if len(r.heap) > 4 * len(r.stamps) + 64:
                r.heap = [e for e in r.heap if r.stamps.get(e[1]) == e[2]]
                heapq.heapify(r.heap)
        heap = r.heap
        while heap:
            _, index, stamp = heap[0]
            if r.stamps.get(index) == stamp:
                return index, r.choices[index][1]
            heapq.heappop(heap)
        return None

    def _random_pick(self, request: ResourceRequest) -> tuple[int, tuple[int, ...]] | None:
        r = self._ranking(request)
        if r.dirty:
            for index in sorted(r.dirty):
                feasible = self.policy.evaluate(self.state.nodes[index], request) is not None
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
        if not r.members:
            return None
        index = r.members[self.rng.randrange(len(r.members))]
        choice = self.policy.evaluate(self.state.nodes[index], request)
        assert choice is not None
        return index, choice[1]
