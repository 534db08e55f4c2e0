"""Reclaim's candidate nodes, made a window of positions at a time
(``takeable.union_in_windows``), are exactly the sorted union of the chosen lists, however far
a reader goes: random lists (empty, single, overlapping, sparse and dense, positions at the
window edges) compared with ``sorted(set().union(*lists))``."""

from __future__ import annotations

import random
from itertools import islice

from tessera.core.cycle import takeable
from tessera.core.cycle.takeable import union_in_windows


def test_windowed_union_is_the_sorted_union() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        end = rng.choice((1, 5, 255, 256, 257, 769, 3000))
        lists = []
        for _ in range(rng.randint(1, 12)):
            density = rng.choice((0.0, 0.001, 0.05, 0.5, 1.0))
            lists.append(sorted(k for k in range(end) if rng.random() < density))
        if rng.random() < 0.3:  # positions on the windows' edges
            lists.append([k for k in (0, 255, 256, 767, 768, end - 1) if k < end])
        expected = sorted(set().union(*lists))
        assert list(union_in_windows(lists, end)) == expected, seed
        stop = rng.randint(0, len(expected))  # a reader that stops early reads a prefix
        assert list(islice(union_in_windows(lists, end), stop)) == expected[:stop], seed


def test_a_small_first_window_gives_the_same_union(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(takeable, "FIRST_WINDOW", 1)
    rng = random.Random(5)
    for _ in range(50):
        lists = [sorted(rng.sample(range(500), rng.randint(0, 80))) for _ in range(rng.randint(2, 6))]
        assert list(union_in_windows(lists, 500)) == sorted(set().union(*lists))
