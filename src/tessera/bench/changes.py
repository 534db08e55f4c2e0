"""The next snapshot after a plan: what a cluster looks like one cycle later.

The plan's bindings start (their pods take the placements the plan gave), its moves land, its
evictions end (a whole workload goes back to pending, a shrunk one loses those pods), some
running workloads finish and some new ones arrive. Workloads nothing happened to stay the same
objects, as an adapter's snapshot cache keeps them. Used by ``bench.cycle`` for its warm
cycles and by the warm session's tests.
"""

from __future__ import annotations

import random
from dataclasses import replace

from tessera.core.cycle import Plan, Snapshot, Workload
from tessera.core.state import Placement


def advance(snap: Snapshot, plan: Plan, rng: random.Random, *, finish: float = 0.01,
            arrive: int = 0, seconds: float = 10.0, prefix: str = "new") -> Snapshot:
    """``finish``: share of running workloads that end; ``arrive``: new pending workloads,
    shaped like pending ones of the snapshot (ids ``{prefix}-{n}``, unique within ``prefix``)."""
    now = snap.now + seconds
    placed: dict[str, dict[int, Placement]] = {}
    for b in plan.bindings:
        placed.setdefault(b.workload_id, {}).update((pb.pod, pb.placement) for pb in b.pods)
    for m in plan.moves:
        placed.setdefault(m.workload_id, {})[m.pod] = m.target
    evicted = {e.workload_id: e.pods for e in plan.evictions}
    workloads: list[Workload] = []
    for w in snap.workloads:
        if w.running and w.id not in placed and w.id not in evicted and rng.random() < finish:
            continue
        if w.id in evicted and not evicted[w.id]:
            workloads.append(replace(w, placements=(), started_at=None))
            continue
        pods = placed.get(w.id, {})
        dropped = evicted.get(w.id, ())
        if not pods and not dropped:
            workloads.append(w)
            continue
        current: list[Placement | None] = list(w.placements) if w.placements else [None] * len(w.pods)
        for i in dropped:
            current[i] = None
        for i, p in pods.items():
            current[i] = p
        started = w.started_at if w.running else now
        workloads.append(replace(w, placements=tuple(current), started_at=started))
    shapes = [w for w in snap.workloads if not w.running]
    taken = {w.id for w in workloads}
    n = 0
    for _ in range(arrive if shapes else 0):
        while f"{prefix}-{n}" in taken:
            n += 1
        like = rng.choice(shapes)
        workloads.append(replace(like, id=f"{prefix}-{n}", placements=(), started_at=None, created_at=now))
        n += 1
    return replace(snap, workloads=tuple(workloads), now=now)
