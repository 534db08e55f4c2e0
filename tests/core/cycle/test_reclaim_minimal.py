"""Minimal-disruption reclaim against exhaustive search on small clusters.

One pending pod of project ``b`` (which owns the whole cluster as deserved quota), a handful of
running workloads of project ``a`` (deserved 0). Exhaustive search tries every set of a's
workloads, smallest first, for the fewest whose eviction lets the pod fit within reclaim's rules
(a keeps its fair share; no more GPUs evicted than b is owed); reclaim must find a solution
and evict no more workloads than that; where it finds none although one exists, it is the
known gap of a GPU budget the node search does not see (asserted to be that and nothing else). The same
search checks ``bench.reclaim``'s lower bound (``fewest_victims``) is never above the optimum.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.bench.reclaim import fewest_victims
from tessera.core.cycle import CycleConfig, Snapshot, Workload, run_cycle
from tessera.core.placement import NoFit, Placer
from tessera.core.state import ClusterState

from .scenario import nodes, placement, project, request

SHAPES = ["0.25", "0.5", "0.75", 1]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list, list[Workload], Workload]:
    ns = nodes(draw(st.integers(1, 3)), gpus=draw(st.integers(1, 3)))
    state = ClusterState(ns)
    running: list[Workload] = []
    for k in range(draw(st.integers(1, 8))):
        r = request(draw(st.sampled_from(SHAPES)))
        node = draw(st.sampled_from(ns))
        gpu = draw(st.integers(0, len(node.gpus) - 1))
        p = placement(ns, r, f"{node.name}:{gpu}")
        if state.fits(p) is not None:
            continue
        state.assign(f"a{k}", p)
        running.append(Workload(f"a{k}", "a", (r,), created_at=0.0, started_at=float(k), placements=(p,)))
    want = request(draw(st.sampled_from(SHAPES)))
    return ns, running, Workload("want", "b", (want,), created_at=0.0)


def exhaustive(ns: list, running: list[Workload], want: Workload, room: float) -> int | None:
    """The fewest of ``running`` to evict so that ``want`` fits, freeing at most ``room`` GPUs."""
    for size in range(len(running) + 1):
        for gone in combinations(running, size):
            if sum(gpus(w) for w in gone) > room + 1e-9:
                continue
            state = ClusterState(ns)
            for w in running:
                if w not in gone:
                    state.assign(w.id, w.placements[0])  # type: ignore[arg-type]
            if not isinstance(Placer(state).place(want.pods[0], explain=False), NoFit):
                return size
    return None


def gpus(w: Workload) -> float:
    p = w.placements[0]
    assert p is not None
    return float(len(p.devices)) if p.exclusive else sum(p.request_bytes) / (16 << 30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_reclaim_evicts_no_more_than_the_fewest_possible(case: tuple[list, list[Workload], Workload]) -> None:
    ns, running, want = case
    total = float(sum(len(n.gpus) for n in ns))
    snap = Snapshot(tuple(ns), (project("a", 0), project("b", total)), (*running, want), 100.0)
    plan = run_cycle(snap, CycleConfig(actions=("allocate", "reclaim")))
    # The rules reclaim keeps: a stays at or above its fair share, and no more GPUs are evicted
    # than b is owed (its pod: b has nothing else).
    held = sum(gpus(w) for w in running)
    room = min(held - plan.projects["a"].fair_share[0], plan.projects["b"].fair_share[0])
    best = exhaustive(ns, running, want, room)
    if best is None:
        assert plan.binding("want") is None
        return
    if plan.binding("want") is None:
        # Known gap (docs/scheduling.md): the node search minimises workloads, then GPUs, but
        # does not know how many GPUs the reclaimer is owed, so it can settle on fewer, larger
        # victims that free more than that (refused afterwards) where more, smaller ones fit.
        assert any(e.kind == "placement" and "more than project b is owed" in e.reason
                   for e in plan.waiting), plan.waiting
        return
    assert len(plan.evictions) <= best, (
        best, [e.workload_id for e in plan.evictions], want.pods[0].gpu.describe(),
        [(w.id, w.pods[0].gpu.describe(), w.placements[0]) for w in running], plan.bindings)

    # bench.reclaim's ideal is a lower bound on the optimum.
    state = ClusterState(ns)
    tenants: dict[tuple[int, int], dict[str, int]] = {}
    for w in running:
        p = w.placements[0]
        assert p is not None
        state.assign(w.id, p)
        for d, nbytes in zip(p.devices, p.request_bytes, strict=True):
            tenants.setdefault((state.by_name[p.node].index, d), {})[w.id] = nbytes
    assert fewest_victims(state, want.pods[0].gpu, tenants, set()) <= best
