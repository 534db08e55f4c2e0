"""Reclaim's candidate nodes, made a window of positions at a time and kept per choice of lists
(``takeable.LazyUnion``), are exactly the sorted union of the chosen lists, however far a reader
goes and from wherever a later reader resumes, also after the lists lose nodes (``drop``).
Random lists (empty, single, overlapping, sparse and dense, positions at the window edges)
compared with ``sorted(set().union(*lists))``."""

from __future__ import annotations

import random
from itertools import islice

import pytest

from tessera.core.cycle import takeable
from tessera.core.cycle.takeable import LazyUnion


def _lists(rng: random.Random, end: int) -> list[list[int]]:
    lists = []
    for _ in range(rng.randint(1, 12)):
        density = rng.choice((0.0, 0.001, 0.05, 0.5, 1.0))
        lists.append(sorted(k for k in range(end) if rng.random() < density))
    if rng.random() < 0.3:  # positions on the windows' edges
        lists.append([k for k in (0, 255, 256, 767, 768, end - 1) if k < end])
    return lists


@pytest.mark.parametrize("first", [256, 1])
def test_lazy_union_is_the_sorted_union(first: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeable, "FIRST_WINDOW", first)
    for seed in range(200):
        rng = random.Random(seed)
        end = rng.choice((1, 5, 255, 256, 257, 769, 3000))
        lists = _lists(rng, end)
        expected = sorted(set().union(*lists))
        union = LazyUnion(lists, end)
        stop = rng.randint(0, len(expected))  # a reader that stops early reads a prefix
        assert list(islice(union.from_position(0), stop)) == expected[:stop], seed
        resume = rng.randint(0, end)  # a later reader resumes from any position
        assert list(union.from_position(resume)) == [p for p in expected if p >= resume], seed
        assert list(union.from_position(0)) == expected, seed


def test_after_the_lists_lose_nodes_the_union_is_still_theirs() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        end = rng.choice((257, 769, 3000))
        lists = _lists(rng, end)
        union = LazyUnion(lists, end)
        before = sorted(set().union(*lists))
        read = list(islice(union.from_position(0), rng.randint(0, len(before))))
        assert read == before[:len(read)], seed
        for entries in lists:  # victims evicted for good: their nodes leave the lists
            for k in sorted(rng.sample(range(len(entries)), len(entries) // 3), reverse=True):
                position = entries.pop(k)
                union.drop(position)
        after = sorted(set().union(*lists))
        assert list(union.from_position(0)) == after, seed
        assert set(union.dropped) <= set(before) - set(after), seed
