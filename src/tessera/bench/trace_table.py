"""Every placement policy on every trace file, averaged over seeds, as a Markdown table.

    python -m tessera.bench.trace_table --data ../shared/data/alibaba-gpu-v2023 --seeds 42-51

Prints the table of allocated GPU % at the end (``--arrive``, default 130% arrived), the
unallocated GPU % at 100% arrived (the FGD paper's metric), decisions per second, then, per
trace, the first policy's allocation curve against the paper's published FGD and best-fit curves
(``--reference``, default ``DATA/../../reference/fgd-expected-allocation-shared.csv``) with every
level from 50% on where it is behind flagged, and, last, one JSON object with every mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tessera.bench.fgd_reference import PAPER_POLICIES, compare, load_reference, render
from tessera.bench.trace import TraceResult, load_nodes, load_pods, run_trace
from tessera.core.placement import POLICIES


def _one(args: tuple[Path, Path, str, int, float]) -> tuple[str, str, TraceResult]:
    nodes_csv, pods_csv, policy, seed, arrive = args
    result = run_trace(load_nodes(nodes_csv), load_pods(pods_csv), policy, seed, arrive)
    return pods_csv.stem.removeprefix("openb_pod_list_"), policy, result


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.trace_table")
    parser.add_argument("--data", type=Path, required=True, help="folder with the openb_*.csv files")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    parser.add_argument("--arrive", type=float, default=1.3)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--traces", default="", help="comma-separated trace names (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reference", type=Path, default=None,
                        help="the FGD artifact's per-seed curves (fgd-expected-allocation-shared.csv)")
    parser.add_argument("--from-level", type=int, default=50, help="first arrival level compared with the paper")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data: {args.data} is not a folder")
    reference_path = args.reference or args.data.parent.parent / "reference" / "fgd-expected-allocation-shared.csv"
    if args.reference is not None and not reference_path.is_file():
        parser.error(f"--reference: {reference_path}: no such file")
    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    traces = sorted(args.data.glob("openb_pod_list_*.csv"))
    if args.traces:
        wanted = set(args.traces.split(","))
        traces = [t for t in traces if t.stem.removeprefix("openb_pod_list_") in wanted]
    policies = args.policies.split(",")
    jobs = [(nodes_csv, t, p, s, args.arrive) for t in traces for p in policies for s in parse_seeds(args.seeds)]
    results: dict[tuple[str, str], list[TraceResult]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for trace, policy, result in pool.map(_one, jobs):
            results.setdefault((trace, policy), []).append(result)

    names = [t.stem.removeprefix("openb_pod_list_") for t in traces]
    summary: dict[str, dict[str, dict[str, object]]] = {}
    print(f"Allocated GPU % at {100 * args.arrive:.0f}% arrived (mean of seeds {args.seeds}); "
          "in brackets: unallocated GPU % at 100% arrived\n")
    print("| trace | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for name in names:
        cells = []
        for policy in policies:
            rs = results[(name, policy)]
            alloc = statistics.fmean(100 * r.allocation_ratio for r in rs)
            unalloc = statistics.fmean(r.unallocated_gpu_percent_at_100 for r in rs)
            speed = statistics.fmean(r.decisions_per_second for r in rs)
            cpu_speed = statistics.fmean(r.decisions_per_cpu_second for r in rs)
            summary.setdefault(name, {})[policy] = {
                "allocated_percent": round(alloc, 3),
                "allocated_percent_stdev": round(statistics.pstdev(100 * r.allocation_ratio for r in rs), 3),
                "unallocated_percent_at_100": round(unalloc, 3),
                "decisions_per_second": round(speed, 1),
                "decisions_per_cpu_second": round(cpu_speed, 1),
            }
            cells.append(f"{alloc:.2f} ({unalloc:.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nDecisions per second (mean; wall time / CPU time of the process):\n")
    print("| trace | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{summary[name][p]['decisions_per_second']:.0f} / {summary[name][p]['decisions_per_cpu_second']:.0f}"
                                                   for p in policies) + " |")
    curves: dict[str, dict[str, list[float]]] = {}
    reference = load_reference(reference_path) if reference_path.is_file() else {}
    top = int(100 * args.arrive + 1e-9)
    levels = list(range(args.from_level, top + 1))
    for name in names:
        for policy in policies:
            rs = results[(name, policy)]
            length = min(len(r.allocation_curve) for r in rs)
            curves.setdefault(name, {})[policy] = [
                round(statistics.fmean(r.allocation_curve[i] for r in rs), 3) for i in range(length)
            ]
        policy = policies[0]
        fgd = reference.get((name, PAPER_POLICIES["fgd"]))
        if not fgd:
            print(f"\n{name}: no published curve in {reference_path}")
            continue
        rows = compare([r.allocation_curve for r in results[(name, policy)]], fgd,
                       reference.get((name, PAPER_POLICIES["best-fit"])), levels,
                       [r.arrived_curve for r in results[(name, policy)]])
        print()
        print("\n".join(render(f"{name} ({policy})", rows)))
        summary[name][policy]["levels_behind_fgd_beyond_sd"] = [r.level for r in rows if r.behind_beyond_tolerance]
        summary[name][policy]["levels_behind_fgd"] = [r.level for r in rows if r.behind]
        summary[name][policy]["levels_not_above_best_fit"] = [r.level for r in rows if r.not_above_best_fit]
        summary[name][policy]["levels_dropping_more_than_fgd"] = [r.level for r in rows if r.loses_more_than_fgd]
    print(json.dumps({"seeds": args.seeds, "arrive": args.arrive, "results": summary, "curves": curves}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
