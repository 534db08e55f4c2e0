"""Time full scheduling cycles on a synthetic cluster.

The default is 1,000 nodes × 8 GPUs (80 GiB each), 50 projects in 5 departments, 10,000
running and 2,000 pending workloads: GPU portions, memory requests, dynamic fractions, whole
GPUs and gangs. Half the projects run over their deserved quota and the other half under it,
and most pending work belongs to the latter, so reclaim, preemption and consolidation all have
work to do. Running placements are made with the placer (binpack, and spread for a fifth of
them so some fractions are scattered). Everything is seeded.

    python -m tessera.bench.cycle [--repeat 5] [--policy fgd] [--profile]

    python -m tessera.bench.cycle --nodes 5000 --running 50000 --pending 10000

The last line printed is one JSON object: nodes, pending, running, cycle_seconds_median,
cycle_cpu_seconds_median (CPU time of this process: steadier than wall time on a shared
machine), bound, evicted (and more), and rss_bytes (peak resident memory of the whole run,
snapshot included). These are *cold* cycles: each builds its session from scratch
(``run_cycle``), as the first cycle after a start does.

Then ``--warm`` cycles (default 3) run as a scheduler runs them, with the session kept between
cycles (``core.cycle.warm.WarmCycle``): before each, the last plan is applied to the snapshot
(its bindings start, its evictions go back to pending), 1% of running workloads finish and
``--arrive`` new ones arrive (``bench.changes``). ``warm_cycle_cpu_seconds_median`` is their
CPU time (the untimed first cycle of the chain builds the session); ``warm_equals_cold`` says
each warm plan equalled a cold ``run_cycle`` of the same snapshot (checked, not timed).

Cycles run with tessera-scheduler's garbage-collector thresholds (``--gc scheduler``, the
default: ``kube/gc_tuning.py``), as the process that runs cycles at this size does; ``--gc
python`` keeps the interpreter's defaults. The JSON says which.

``warm_gc_collections`` (young, middle, full) and ``warm_gc_seconds``: the garbage collections
that ran inside the timed warm cycles (``gc.callbacks``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from functools import partial

from tessera.bench.changes import advance
from tessera.core.cycle import CycleConfig, Plan, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.cycle.warm import WarmCycle
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import NoFit, Placer
from tessera.core.state import ClusterState, Placement
from tessera.core.units import GiB
from tessera.kube import gc_tuning

NOW = 100_000.0



def place_all(placer: Placer, state: ClusterState, wid: str, request: ResourceRequest,
              pods: int) -> list[Placement] | None:
    """Place and assign ``pods`` pods ``wid#0…`` of ``request``, all or none: the placements,
    or None with the state as it was (a running workload of a synthetic cluster)."""
    placed: list[Placement] = []
    for j in range(pods):
        found = placer.place(request, explain=False)
        if isinstance(found, NoFit):
            for k in range(j):
                state.release(f"{wid}#{k}")
            return None
        state.assign(f"{wid}#{j}", found)
        placed.append(found)
    return placed

def make_nodes(count: int, gpus: int) -> list[Node]:
    return [
        Node(
            f"node-{k:04d}",
            tuple(GpuDevice(f"GPU-{k:04d}-{i}", i, 80 * GiB, "H100-80GB") for i in range(gpus)),
            cpu_milli=224_000,
            memory=2048 * GiB,
        )
        for k in range(count)
    ]


def make_projects(count: int, departments: int, capacity: float, rng: random.Random) -> list[Project]:
    per_dept = max(1, count // departments)
    projects = []
    deserved = capacity / count
    for d in range(departments):
        projects.append(Project(f"dept-{d}", Quota(deserved * per_dept)))
    for i in range(count):
        dept = f"dept-{min(i // per_dept, departments - 1)}"
        limit = deserved * 3 if i % 7 == 0 else None
        projects.append(
            Project(
                f"team-{i:02d}",
                Quota(deserved, limit, rng.choice([1.0, 1.0, 2.0, 3.0])),
                priority=200 if i % 10 == 0 else 100,
                parent=dept,
            )
        )
    return projects


def fraction(rng: random.Random) -> ResourceRequest:
    pick = rng.random()
    if pick < 0.5:
        gpu = GpuRequest.fraction(rng.choice(["0.25", "0.5", "0.5", "0.75"]))
    elif pick < 0.75:
        gpu = GpuRequest.of_memory(rng.choice([10, 20, 40]) * GiB)
    elif pick < 0.9:
        gpu = GpuRequest.fraction(Decimal("0.25"), limit=Decimal("1"))
    else:
        gpu = GpuRequest.fraction(Decimal("0.5"), devices=2)
    return ResourceRequest(gpu, cpu_milli=4000, memory=16 * GiB)


def shape(rng: random.Random, pending: bool) -> tuple[ResourceRequest, int]:
    pick = rng.random()
    if pick < 0.65:
        return fraction(rng), 1
    if pick < 0.94:
        return ResourceRequest(GpuRequest.whole(1), 8000, 64 * GiB), 1
    if pending and pick > 0.98:
        return ResourceRequest(GpuRequest.whole(8), 64000, 512 * GiB), 2
    return ResourceRequest(GpuRequest.whole(1), 8000, 64 * GiB), rng.choice([2, 2, 4])


def build(
    nodes: int = 1000,
    gpus: int = 8,
    projects: int = 50,
    running: int = 10_000,
    pending: int = 2_000,
    seed: int = 7,
    spread: float = 0.2,
) -> Snapshot:
    """``spread``: share of running workloads placed with the spread policy (fragmenting)."""
    rng = random.Random(seed)
    node_list = make_nodes(nodes, gpus)
    project_list = make_projects(projects, 5, float(nodes * gpus), rng)
    leaves = [p.name for p in project_list if p.parent is not None]
    heavy, light = leaves[::2], leaves[1::2]
    state = ClusterState(node_list)
    placers = [Placer(state, policy="binpack"), Placer(state, policy="spread")]
    workloads: list[Workload] = []
    attempts = 0
    while len(workloads) < running and attempts < running * 3:
        attempts += 1
        request, pods = shape(rng, pending=False)
        placer = placers[1] if rng.random() < spread else placers[0]
        wid = f"run-{len(workloads):05d}"
        placed = place_all(placer, state, wid, request, pods)
        if placed is None:
            continue
        cls = rng.choices(["train", "build", "inference"], [0.85, 0.08, 0.07])[0]
        workloads.append(
            Workload(
                wid,
                rng.choice(heavy) if rng.random() < 0.7 else rng.choice(light),
                (request,) * pods,
                priority_class=cls,
                created_at=NOW - 5000 - rng.random() * 50_000,
                started_at=NOW - rng.random() * 5000,
                placements=tuple(placed),
            )
        )
    for p in placers:
        p.close()
    for i in range(pending):
        request, pods = shape(rng, pending=True)
        cls = rng.choices(["train", "build", "inference"], [0.8, 0.1, 0.1])[0]
        workloads.append(
            Workload(
                f"pend-{i:05d}",
                rng.choice(light) if rng.random() < 0.75 else rng.choice(heavy),
                (request,) * pods,
                priority_class=cls,
                created_at=NOW - rng.random() * 5000,
            )
        )
    return Snapshot(tuple(node_list), tuple(project_list), tuple(workloads), NOW)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--projects", type=int, default=50)
    parser.add_argument("--running", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policy", default=CycleConfig().policy)
    parser.add_argument(
        "--spread", type=float, default=0.2, help="share of running workloads placed by spread (fragmentation)"
    )
    parser.add_argument("--actions", default=",".join(CycleConfig().actions))
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one cold cycle")
    parser.add_argument("--warm", type=int, default=3, help="warm cycles (session kept, changes applied)")
    parser.add_argument("--arrive", type=int, default=None,
                        help="new pending workloads before each warm cycle (default: pending / 20)")
    parser.add_argument("--profile-warm", action="store_true", help="print a cProfile of one warm cycle")
    parser.add_argument("--gc", choices=("scheduler", "python"), default="scheduler",
                        help="garbage-collector thresholds: tessera-scheduler's (kube/gc_tuning.py, "
                             "the process that runs these cycles at this size) or Python's defaults")
    args = parser.parse_args(argv)
    if args.gc == "scheduler":
        gc_tuning.tune()

    t0 = time.perf_counter()
    snap = build(args.nodes, args.gpus, args.projects, args.running, args.pending, args.seed, args.spread)
    built = time.perf_counter() - t0
    running = sum(1 for w in snap.workloads if w.running)
    used = sum(
        (len(p.devices) if p.exclusive else sum(p.request_bytes) / (80 * GiB))
        for w in snap.workloads
        for p in w.placements
        if p is not None
    )
    print(
        f"snapshot: {len(snap.nodes)} nodes, {args.nodes * args.gpus} GPUs ({used:.0f} allocated), "
        f"{running} running, {len(snap.workloads) - running} pending; built in {built:.1f}s",
        file=sys.stderr,
    )
    config = CycleConfig(
        policy=args.policy,
        actions=tuple(a for a in args.actions.split(",") if a),
        reclaim_min_runtime=60.0,
        preempt_min_runtime=60.0,
    )
    if args.profile:
        _profile(lambda: run_cycle(snap, config))
    times: list[float] = []
    cpu: list[float] = []
    plans: list[Plan] = []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        plans.append(run_cycle(snap, config))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    plan = plans[-1]
    same = all(p == plan for p in plans)
    per_action = {
        name: round(statistics.median(p.timings.get(name, 0.0) for p in plans), 4) for name in plan.timings
    }
    actions = Counter(b.action for b in plan.bindings)
    kinds = Counter(w.kind for w in plan.waiting)
    print(f"per action (median s): {per_action}", file=sys.stderr)
    print(f"bindings by action: {dict(actions)}; waiting by kind: {dict(kinds)}", file=sys.stderr)
    result = {
        "nodes": len(snap.nodes),
        "gpus": args.nodes * args.gpus,
        "projects": args.projects,
        "pending": len(snap.workloads) - running,
        "running": running,
        "cycle_seconds_median": round(statistics.median(times), 4),
        "cycle_seconds_min": round(min(times), 4),
        "cycle_seconds_max": round(max(times), 4),
        "cycle_cpu_seconds_median": round(statistics.median(cpu), 4),
        "bound": len(plan.bindings),
        "evicted": len(plan.evictions),
        "moved": len(plan.moves),
        "waiting": len(plan.waiting),
        "same_plan_every_cycle": same,
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "policy": args.policy,
        "repeat": args.repeat,
        "gc": args.gc,
    }
    result.update(_warm(snap, config, args))
    result["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(result))
    return 0


def _profile(cycle: Callable[[], Plan]) -> Plan:
    profiler = cProfile.Profile()
    profiler.enable()
    plan = cycle()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
    print(out.getvalue(), file=sys.stderr)
    return plan


class _GcWatch:
    """Garbage collections that run while ``on`` (``gc.callbacks``): count per generation and
    wall seconds, so a report says whether full collections land inside the timed cycles."""

    def __init__(self) -> None:
        self.on = False
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._started


def _warm(snap: Snapshot, config: CycleConfig, args: argparse.Namespace) -> dict[str, object]:
    """Warm cycles, each after the last plan and some finishes and arrivals are applied."""
    if args.warm <= 0:
        return {}
    rng = random.Random(args.seed)
    arrive = args.arrive if args.arrive is not None else args.pending // 20
    warm = WarmCycle(config)
    plan = warm.run(snap)
    watch = _GcWatch()
    gc.callbacks.append(watch)
    times: list[float] = []
    cpu: list[float] = []
    plans: list[Plan] = []
    same = True
    for k in range(args.warm):
        snap = advance(snap, plan, rng, finish=0.01, arrive=arrive, prefix=f"arrival{k}")
        if args.profile_warm and k == 0:  # profiled, not timed
            print("warm cycle:", file=sys.stderr)
            plan = _profile(partial(warm.run, snap))
        else:
            t, c = time.perf_counter(), time.process_time()
            watch.on = True
            plan = warm.run(snap)
            watch.on = False
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        same = same and warm.warm and plan == run_cycle(snap, config)
        plans.append(plan)
    gc.callbacks.remove(watch)
    per_action = {
        name: round(statistics.median(p.timings.get(name, 0.0) for p in plans), 4) for name in plan.timings
    }
    print(f"warm per action (median s): {per_action}", file=sys.stderr)
    return {
        "warm_cycles": args.warm,
        "warm_cycle_seconds_median": round(statistics.median(times), 4) if times else None,
        "warm_cycle_cpu_seconds_median": round(statistics.median(cpu), 4) if cpu else None,
        "warm_bound_last": len(plan.bindings),
        "warm_evicted_last": len(plan.evictions),
        "warm_equals_cold": same,
        "warm_gc_collections": watch.counts,
        "warm_gc_seconds": round(watch.seconds, 4),
    }


if __name__ == "__main__":
    raise SystemExit(main())
