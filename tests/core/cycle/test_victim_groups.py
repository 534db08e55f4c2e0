"""Reclaim's lazy per-node victim groups (``victim_groups.LazyGroups``) equal the eager grouping
``NodeIndex.of_entries`` made before: walk the entries in the index's order (project rank, then
workload order), leave out those evicted when the index is made, group per node, nodes in the
order of their first victim. Victims evicted after the index was made stay in its groups (the
scan skips them), as in an eager build."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tessera.core.cycle.victim_groups import EntriesByNode, LazyGroups


@dataclass(eq=False)
class _Victim:
    project: str
    evicted: bool = False


def _eager(entries, order):  # type: ignore[no-untyped-def]
    by_node: dict[str, list[_Victim]] = {}
    gpus: dict[str, list[float]] = {}
    for k in order:
        v, g, where = entries[k]
        if v.evicted:
            continue
        for node in where:
            by_node.setdefault(node, []).append(v)
            gpus.setdefault(node, []).append(g)
    return by_node, gpus


def test_lazy_groups_equal_the_eager_grouping() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        nodes = [f"n{i}" for i in range(rng.randint(1, 12))]
        projects = [f"p{i}" for i in range(rng.randint(1, 5))]
        entries = []
        for _ in range(rng.randint(1, 40)):
            v = _Victim(rng.choice(projects), evicted=rng.random() < 0.2)
            where = tuple(dict.fromkeys(rng.choice(nodes) for _ in range(rng.randint(1, 3))))
            entries.append((v, float(rng.choice((0, 0.5, 1, 2, 4))), where))
        # Ties between projects' ranks are kept in workload order (a stable sort).
        part = {p: rng.randint(0, 2) for p in projects}
        rank = [part[v.project] for v, _, _ in entries]
        order = sorted(range(len(entries)), key=rank.__getitem__)
        expected, expected_gpus = _eager(entries, order)
        lazy = LazyGroups(EntriesByNode(entries), order, rank)  # type: ignore[arg-type]
        assert list(lazy) == list(expected), seed
        assert len(lazy) == len(expected)
        # Evicted after the index was made: still in its groups, as in an eager build.
        for v, _, _ in entries:
            if rng.random() < 0.3:
                v.evicted = True
        for node in rng.sample(list(expected), len(expected)):
            assert lazy[node] == expected[node], (seed, node)
            assert lazy.gpus[node] == expected_gpus[node], (seed, node)
        assert "nowhere" not in lazy and lazy.get("nowhere") is None
