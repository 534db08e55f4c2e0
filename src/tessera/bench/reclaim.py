"""How many workloads reclaim evicts, against the fewest that could have made the same room.

On the synthetic clusters of ``bench.cycle`` (1,000 and 5,000 nodes by default), one cycle runs
allocate then reclaim. The plan is replayed in decision order; for every reclaim binding of one
pod, ``ideal`` is the fewest running workloads whose eviction would let that pod fit somewhere
in the cluster as it was just before (``fewest_victims``). ``ideal`` ignores the quota rules
(which only forbid victims), the pod's CPU and memory, and for a pod on several GPUs counts the
d-th smallest per-GPU count (a lower bound on their union), so it is never above the true
optimum and ``evicted_over_ideal`` (Σ evicted ÷ Σ ideal) never flatters reclaim.

    python -m tessera.bench.reclaim [--sizes 1000,5000] [--seed 7] [--projects 50]

The last line printed is one JSON object; ``evicted_over_ideal`` is the worse of the sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping

from tessera.bench.cycle import build
from tessera.core.cycle import CycleConfig, Plan, Snapshot, run_cycle
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.state import ClusterState, Placement

MIN_RUNTIME = 60.0


def device_cost(gpu: GpuRequest, memory: int, used: int, tenants: Mapping[str, int], fixed: bool) -> float:
    """Fewest of ``tenants`` (workload -> bytes on this GPU) to evict for ``gpu`` to fit on one
    GPU of ``memory`` bytes with ``used`` held; ``fixed``: a tenant that may not be evicted."""
    if gpu.kind is GpuKind.WHOLE:
        return float("inf") if fixed else float(len(tenants))
    need = gpu.bytes_on(memory) - (memory - used)
    if need <= 0:
        return 0.0
    for count, nbytes in enumerate(sorted(tenants.values(), reverse=True), 1):
        need -= nbytes  # largest first: the fewest that free `need`
        if need <= 0:
            return float(count)
    return float("inf")


def node_cost(state: ClusterState, index: int, gpu: GpuRequest,
              tenants: Mapping[tuple[int, int], dict[str, int]], fixed: set[tuple[int, int]]) -> float:
    """The lower bound on one node: the d-th smallest per-GPU count for a pod on d GPUs."""
    ns = state.nodes[index]
    costs = []
    for i, (memory, used, model, whole) in enumerate(
            zip(ns.dev_memory, ns.dev_used, ns.dev_models, ns.dev_whole, strict=True)):
        if not gpu.allows(model):
            continue
        key = (index, i)
        here = tenants.get(key, {})
        if whole and not here:
            continue
        costs.append(device_cost(gpu, memory, used, here, key in fixed))
    d = max(gpu.devices, 1)
    if len(costs) < d:
        return float("inf")
    costs.sort()
    return costs[d - 1]


def fewest_victims(state: ClusterState, gpu: GpuRequest, tenants: Mapping[tuple[int, int], dict[str, int]],
                   fixed: set[tuple[int, int]], cache: dict[GpuRequest, dict[int, float]] | None = None) -> float:
    """The lower bound on the workloads to evict for one pod asking ``gpu`` (see module text),
    the minimum over nodes; ``cache`` keeps per-node values (the caller drops changed nodes)."""
    known = {} if cache is None else cache.setdefault(gpu, {})
    for ns in state.nodes:
        if ns.index not in known:
            known[ns.index] = node_cost(state, ns.index, gpu, tenants, fixed)
    return min(known.values(), default=float("inf"))


def measure(snap: Snapshot, plan: Plan) -> dict[str, float]:
    state = ClusterState(snap.nodes)
    tenants: dict[tuple[int, int], dict[str, int]] = {}
    fixed: set[tuple[int, int]] = set()
    placed: dict[str, list[tuple[int, Placement]]] = {}
    specs = {w.id: w for w in snap.workloads}

    cache: dict[GpuRequest, dict[int, float]] = {}

    def hold(wid: str, p: Placement, evictable: bool, sign: int) -> None:
        ns = state.by_name[p.node]
        for known in cache.values():
            known.pop(ns.index, None)
        for d, nbytes in zip(p.devices, p.request_bytes, strict=True):
            key = (ns.index, d)
            if not evictable:
                if sign > 0:
                    fixed.add(key)
                continue
            group = tenants.setdefault(key, {})
            if sign > 0:
                group[wid] = group.get(wid, 0) + nbytes
            else:
                group.pop(wid, None)

    for w in snap.workloads:
        for i, p in enumerate(w.placements):
            if p is None:
                continue
            state.assign(f"{w.id}#{i}", p)
            ok = w.is_preemptible and w.started_at is not None and snap.now - w.started_at >= MIN_RUNTIME
            hold(w.id, p, ok, +1)
            placed.setdefault(w.id, []).append((i, p))
    evicted = ideal = 0.0
    counted = multi = worst_n = 0
    worst = 0.0
    for b in plan.bindings:
        if b.action == "reclaim" and len(b.pods) == 1 and b.after_evictions:
            best = fewest_victims(state, specs[b.workload_id].pods[b.pods[0].pod].gpu, tenants, fixed, cache)
            kept = len(b.after_evictions)
            if 0 < best < float("inf"):
                counted += 1
                evicted += kept
                ideal += best
                if kept / best > worst:
                    worst, worst_n = kept / best, kept
        elif b.action == "reclaim" and b.after_evictions:
            multi += 1
        for victim in b.after_evictions:
            for i, p in placed.pop(victim, []):
                hold(victim, p, True, -1)
                state.release(f"{victim}#{i}")
        for pb in b.pods:
            state.assign(f"{b.workload_id}#{pb.pod}", pb.placement)
            hold(b.workload_id, pb.placement, False, +1)  # bound in this plan: not a victim
    return {
        "reclaim_bindings_measured": counted,
        "reclaim_bindings_multi_pod": multi,
        "evicted": evicted,
        "ideal": ideal,
        "evicted_over_ideal": round(evicted / ideal, 4) if ideal else 1.0,
        "worst_binding_ratio": round(worst, 3),
        "worst_binding_evicted": worst_n,
    }


def run(sizes: Iterable[int], seed: int, projects: int = 50) -> dict[str, object]:
    out: dict[str, object] = {}
    worst = 0.0
    for n in sizes:
        t0 = time.perf_counter()
        snap = build(n, 8, projects, n * 10, n * 2, seed, 0.2)
        config = CycleConfig(actions=("allocate", "reclaim"), reclaim_min_runtime=MIN_RUNTIME,
                             preempt_min_runtime=MIN_RUNTIME)
        plan = run_cycle(snap, config)
        result = measure(snap, plan)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{n} nodes: {result}", file=sys.stderr)
        out[str(n)] = result
        worst = max(worst, float(result["evicted_over_ideal"]))
    out["evicted_over_ideal"] = worst
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000", help="node counts, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--projects", type=int, default=50)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(json.dumps({"benchmark": "reclaim", **run(sizes, args.seed, args.projects)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
