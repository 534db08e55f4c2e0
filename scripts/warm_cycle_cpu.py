"""CPU seconds per action of warm cycles, for comparing two versions of the cycle on a busy
machine (issue 33). ``bench.cycle`` times actions by the wall clock, which on a shared 2-core
machine at load 10 mostly measures the other processes; here each action is timed by process
CPU (``time.process_time``) and the medians and minimums over N warm cycles are printed, one
JSON object per run. Same cluster and changes as ``bench.cycle``'s warm cycles (seed 7, 1%
finishing, pending / 20 arriving per cycle), no cold comparison (``bench.cycle`` does that).

Alternate two versions, e.g. an export of main and this tree:

    git archive main src | tar -x -C /tmp/main
    PYTHONPATH=/tmp/main/src .venv/bin/python scripts/warm_cycle_cpu.py --nodes 5000
    .venv/bin/python scripts/warm_cycle_cpu.py --nodes 5000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import types

import tessera.core.cycle.run as run_module
import tessera.core.cycle.warm as warm_module
from tessera.bench.changes import advance
from tessera.bench.cycle import build
from tessera.core.cycle import CycleConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=5, help="warm cycles timed")
    args = parser.parse_args()
    cpu_clock = types.SimpleNamespace(perf_counter=time.process_time)
    run_module.time = cpu_clock  # type: ignore[attr-defined,assignment]  # the plan's timings in CPU seconds
    warm_module.time = cpu_clock  # type: ignore[attr-defined,assignment]
    scale = args.nodes / 1000
    pending = int(2000 * scale)
    snap = build(args.nodes, 8, 50, int(10_000 * scale), pending, 7, 0.2)
    config = CycleConfig(reclaim_min_runtime=60.0, preempt_min_runtime=60.0)
    rng = random.Random(7)
    warm = warm_module.WarmCycle(config)
    plan = warm.run(snap)
    cpus, plans = [], []
    for k in range(args.cycles):
        snap = advance(snap, plan, rng, finish=0.01, arrive=pending // 20, prefix=f"arrival{k}")
        started = time.process_time()
        plan = warm.run(snap)
        cpus.append(time.process_time() - started)
        plans.append(plan)
    names = list(plans[0].timings)
    print(json.dumps({
        "source": run_module.__file__,
        "nodes": args.nodes,
        "warm_cpu": [round(c, 3) for c in cpus],
        "warm_cpu_median": round(statistics.median(cpus), 3),
        "warm_cpu_min": round(min(cpus), 3),
        "per_action_cpu_median": {n: round(statistics.median(p.timings.get(n, 0.0) for p in plans), 3)
                                  for n in names},
        "per_action_cpu_min": {n: round(min(p.timings.get(n, 0.0) for p in plans), 3) for n in names},
        "last_bound_evicted_waiting": [len(plan.bindings), len(plan.evictions), len(plan.waiting)],
    }))


if __name__ == "__main__":
    main()
