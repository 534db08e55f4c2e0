"""An upper bound on the GPU any placement could allocate of the pods that arrived in a replay.

    python -m tessera.bench.bound --nodes NODES.csv --pods PODS.csv --seed 42 --arrive 1.3 --json

The same pods arrive as in ``tessera.bench.trace`` (same seed, same stop rule). Any placement,
online or offline, allocates at most the optimum of the offline problem "choose a subset of the
arrived pods and a node/devices for each". That problem is solved

* **exactly** when it is small (``--exact-limit``): one binary variable per pod × node × device,
  the devices' bytes, whole GPUs exclusive, CPU and memory per node, models;
* otherwise **bounded** on an aggregated form: nodes grouped by type (CPU, memory, devices),
  pods by shape; x[s, t] = how many pods of shape s run on nodes of type t. The constraints are
  relaxations of the real ones (a type's GPU, CPU and memory summed over its nodes; per device,
  whole GPUs plus shared pods larger than 1/(k+1) of it at most k; per node, whole-GPU pods
  taking more than 1/(j+1) of its devices at most j), so the optimum is a valid upper bound. It is solved as
  an integer program with a time limit (HiGHS); the bound reported is the solver's proven bound
  (its dual bound, or the LP relaxation if that is lower), never its incumbent.

Needs HiGHS (``pip install 'tessera[bound]'``, the ``highspy`` package).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tessera.bench.trace import TracePod, arrivals, load_nodes, load_pods
from tessera.core.model import GpuKind, Node, ResourceRequest


@dataclass
class BoundResult:
    seed: int
    arrive: float
    nodes: int
    gpus: int
    pods_arrived: int
    arrived_gpu_percent: float
    bound_percent: float
    """Upper bound on the allocated GPU % of any placement of the arrived pods."""
    method: str
    """``exact`` (per-device model solved to optimality) or ``aggregated`` (a valid bound)."""
    lp_percent: float | None
    mip_percent: float | None
    """Best integer solution of the aggregated model (not a placement: shown for the gap)."""
    offline_percent: float | None
    """A real placement of the same pods made offline (largest first, best of fgd and best-fit):
    what is certainly reachable, so the optimum lies between this and the bound."""
    shapes: int
    node_types: int
    seconds: float


def arrived_pods(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int, arrive: float) -> list[TracePod]:
    """The pods ``run_trace`` submits for this seed and arrival level, in order."""
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    out: list[TracePod] = []
    arrived = 0
    for pod in arrivals(pods, random.Random(seed)):
        if arrived >= arrive * capacity:
            break
        arrived += pod.gpu_milli
        out.append(pod)
    return out


def _highs() -> Any:
    try:
        import highspy
    except ImportError:  # pragma: no cover - depends on the environment
        raise SystemExit("tessera.bench.bound needs HiGHS: pip install 'tessera[bound]' (highspy)") from None
    return highspy


class _Model:
    """A small builder over highspy: columns with bounds/costs, rows as sparse lists."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[list[int], list[float], float]] = []

    def var(self, cost: float, upper: float, integer: bool = True) -> int:
        self.cost.append(cost)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, cols: list[int], coefs: list[float], rhs: float) -> None:
        if cols:
            self.rows.append((cols, coefs, rhs))

    def solve(self, integer: bool, time_limit: float) -> tuple[str, float | None, float | None]:
        """(status, objective of the best solution, proven upper bound) of the maximisation."""
        highspy = _highs()
        import numpy as np

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        n = len(self.cost)
        h.addVars(n, np.zeros(n), np.array(self.upper, dtype=float))
        idx = np.arange(n, dtype=np.int32)
        h.changeColsCost(n, idx, np.array(self.cost, dtype=float))
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        starts: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        rhs: list[float] = []
        for c, v, r in self.rows:
            starts.append(len(cols))
            cols.extend(c)
            vals.extend(v)
            rhs.append(r)
        m = len(rhs)
        h.addRows(m, np.full(m, -highspy.kHighsInf), np.array(rhs, dtype=float), len(cols),
                  np.array(starts, dtype=np.int32), np.array(cols, dtype=np.int32), np.array(vals, dtype=float))
        if integer:
            h.changeColsIntegrality(n, idx, np.array(
                [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in self.integer]))
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        solved = status == highspy.HighsModelStatus.kOptimal
        objective = float(info.objective_function_value) if info.primal_solution_status else None
        if not integer:
            return ("optimal" if solved else str(status)), objective, objective if solved else None
        proven = objective if solved else float(info.mip_dual_bound)
        return ("optimal" if solved else str(status)), objective, proven


def _shared_fraction(request: ResourceRequest, size: int) -> float:
    return request.gpu.bytes_on(size) / size


def exact_optimum(nodes: Sequence[Node], pods: Sequence[ResourceRequest], time_limit: float = 60.0) -> float | None:
    """The most GPUs (in devices) any placement of a subset of ``pods`` allocates, or None if
    the solver did not prove optimality within ``time_limit``."""
    model = _Model()
    pod_rows: list[tuple[list[int], list[float]]] = [([], []) for _ in pods]
    for node in nodes:
        devices = sorted(node.gpus, key=lambda g: g.index)
        cpu: tuple[list[int], list[float]] = ([], [])
        mem: tuple[list[int], list[float]] = ([], [])
        dev_rows: list[tuple[list[int], list[float]]] = [([], []) for _ in devices]
        for p, request in enumerate(pods):
            gpu = request.gpu
            if request.cpu_milli > node.cpu_milli or request.memory > node.memory:
                continue
            usable = [d for d in devices if gpu.allows(d.model) and gpu.bytes_on(d.schedulable) <= d.schedulable]
            if gpu.kind is not GpuKind.NONE and len(usable) < gpu.devices:
                continue
            a = model.var(0.0, 1.0)
            pod_rows[p][0].append(a)
            pod_rows[p][1].append(1.0)
            cpu[0].append(a)
            cpu[1].append(float(request.cpu_milli))
            mem[0].append(a)
            mem[1].append(float(request.memory))
            if gpu.kind is GpuKind.NONE:
                continue
            link_cols, link_coefs = [a], [-float(gpu.devices)]
            for d in usable:
                size = d.schedulable
                if gpu.kind is GpuKind.WHOLE:
                    y = model.var(1.0, 1.0)
                    dev_rows[d.index][0].append(y)
                    dev_rows[d.index][1].append(float(size))
                else:
                    take = gpu.bytes_on(size)
                    y = model.var(take / size, 1.0)
                    dev_rows[d.index][0].append(y)
                    dev_rows[d.index][1].append(float(take))
                link_cols.append(y)
                link_coefs.append(1.0)
            # exactly gpu.devices distinct devices when placed, none otherwise
            model.row(link_cols, link_coefs, 0.0)
            model.row(link_cols, [-c for c in link_coefs], 0.0)
        model.row(*cpu, float(node.cpu_milli))
        model.row(*mem, float(node.memory))
        for d, (cols, coefs) in zip(devices, dev_rows, strict=True):
            model.row(cols, coefs, float(d.schedulable))
    for cols, coefs in pod_rows:
        model.row(cols, coefs, 1.0)
    if not model.cost:
        return 0.0
    status, objective, _ = model.solve(True, time_limit)
    return objective if status == "optimal" else None


def aggregated_bound(
    nodes: Sequence[Node], pods: Sequence[ResourceRequest], time_limit: float = 60.0
) -> tuple[float, float | None, float | None]:
    """(valid upper bound, LP relaxation, best integer solution) of the aggregated model, in GPUs."""
    types: Counter[tuple[int, int, tuple[tuple[int, str], ...]]] = Counter(
        (n.cpu_milli, n.memory, tuple((g.schedulable, g.model) for g in sorted(n.gpus, key=lambda g: g.index)))
        for n in nodes
    )
    shapes = Counter(pods)
    model = _Model()
    per_shape: dict[ResourceRequest, tuple[list[int], list[float]]] = {s: ([], []) for s in shapes}
    for (cpu, mem, devices), count in types.items():
        n_dev = len(devices)
        gpu_row: tuple[list[int], list[float]] = ([], [])
        cpu_row: tuple[list[int], list[float]] = ([], [])
        mem_row: tuple[list[int], list[float]] = ([], [])
        device_cuts: dict[int, tuple[list[int], list[float]]] = {k: ([], []) for k in (1, 2, 3)}
        node_cuts: dict[int, tuple[list[int], list[float]]] = {j: ([], []) for j in (1, 2, 3)}
        for shape, available in shapes.items():
            gpu = shape.gpu
            if shape.cpu_milli > cpu or shape.memory > mem:
                continue
            usable = [(size, model_name) for size, model_name in devices
                      if gpu.allows(model_name) and gpu.bytes_on(size) <= size]
            if gpu.kind is not GpuKind.NONE and len(usable) < gpu.devices:
                continue
            if gpu.kind is GpuKind.NONE:
                low = high = 0.0
            elif gpu.kind is GpuKind.WHOLE:
                low = high = float(gpu.devices)
            else:
                fractions = [_shared_fraction(shape, size) for size, _ in usable]
                low, high = gpu.devices * min(fractions), gpu.devices * max(fractions)
            x = model.var(high, float(available))
            per_shape[shape][0].append(x)
            per_shape[shape][1].append(1.0)
            if high:
                gpu_row[0].append(x)
                gpu_row[1].append(low)
            cpu_row[0].append(x)
            cpu_row[1].append(float(shape.cpu_milli))
            mem_row[0].append(x)
            mem_row[1].append(float(shape.memory))
            for k, (cols, coefs) in device_cuts.items():
                if gpu.kind is GpuKind.WHOLE:
                    cols.append(x)
                    coefs.append(float(gpu.devices))
                elif gpu.shared and all((k + 1) * gpu.bytes_on(size) > size for size, _ in usable):
                    cols.append(x)
                    coefs.append(gpu.devices / k)
            for j, (cols, coefs) in node_cuts.items():
                if gpu.kind is GpuKind.WHOLE and gpu.devices * (j + 1) > n_dev:
                    cols.append(x)
                    coefs.append(1.0)
        model.row(*gpu_row, float(n_dev * count))
        model.row(*cpu_row, float(cpu * count))
        model.row(*mem_row, float(mem * count))
        for cols, coefs in device_cuts.values():
            model.row(cols, coefs, float(n_dev * count))
        for j, (cols, coefs) in node_cuts.items():
            model.row(cols, coefs, float(j * count))
    for shape, (cols, coefs) in per_shape.items():
        model.row(cols, coefs, float(shapes[shape]))
    if not model.cost:
        return 0.0, 0.0, 0.0
    _, lp, lp_bound = model.solve(False, time_limit)
    _, mip, mip_bound = model.solve(True, time_limit)
    candidates = [b for b in (lp_bound, mip_bound) if b is not None]
    if not candidates:
        raise RuntimeError("the solver proved no bound within the time limit")
    return min(candidates), lp, mip


def offline_placement(nodes: Sequence[Node], pods: Sequence[ResourceRequest]) -> float:
    """GPUs allocated by placing the pods largest first (GPU, then CPU), best of two policies."""
    from tessera.core.placement import Placement, Placer
    from tessera.core.placement.fragmentation import typical_workload
    from tessera.core.state import ClusterState

    order = sorted(pods, key=lambda r: (-r.gpu.devices * (1000 if r.gpu.kind is GpuKind.WHOLE else 0)
                                        - float(r.gpu.portion or 0) * 1000, -r.cpu_milli, -r.memory))
    best = 0.0
    for policy in ("fgd", "best-fit"):
        state = ClusterState(nodes)
        placer = Placer(state, policy, workload=typical_workload(pods))
        for i, request in enumerate(order):
            where = placer.place(request, explain=False)
            if isinstance(where, Placement):
                state.assign(f"p{i}", where)
        best = max(best, state.gpus_allocated())
    return best


def compute_bound(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    seed: int = 42,
    arrive: float = 1.3,
    time_limit: float = 60.0,
    exact_limit: int = 4000,
    offline_heuristic: bool = True,
) -> BoundResult:
    start = time.perf_counter()
    arrived = arrived_pods(nodes, pods, seed, arrive)
    requests = [p.request for p in arrived]
    gpus = sum(len(n.gpus) for n in nodes)
    per_device = sum(len(n.gpus) for n in nodes) * len(requests)
    lp = mip = offline = None
    value: float | None = None
    method = "exact"
    if per_device <= exact_limit:
        value = exact_optimum(nodes, requests, time_limit)
    if value is None:
        method = "aggregated"
        value, lp, mip = aggregated_bound(nodes, requests, time_limit)
        if offline_heuristic:
            offline = offline_placement(nodes, requests)
    arrived_gpus = sum(p.gpu_milli for p in arrived) / 1000
    pct = 100 / gpus if gpus else 0.0
    return BoundResult(
        seed=seed,
        arrive=arrive,
        nodes=len(nodes),
        gpus=gpus,
        pods_arrived=len(arrived),
        arrived_gpu_percent=round(arrived_gpus * pct, 3),
        bound_percent=math.ceil(1000 * min(value * pct, 100.0, arrived_gpus * pct) - 1e-6) / 1000,
        method=method,
        lp_percent=None if lp is None else round(lp * pct, 3),
        mip_percent=None if mip is None else round(mip * pct, 3),
        offline_percent=None if offline is None else round(offline * pct, 3),
        shapes=len(set(requests)),
        node_types=len({(n.cpu_milli, n.memory, tuple((g.schedulable, g.model) for g in sorted(n.gpus, key=lambda g: g.index)))
                        for n in nodes}),
        seconds=round(time.perf_counter() - start, 2),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.bound", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (the openb_pod_list_*.csv format)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrive", type=float, default=1.3, help="arrived GPU demand as a multiple of capacity")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver run")
    parser.add_argument("--exact-limit", type=int, default=4000,
                        help="solve exactly when GPUs × arrived pods is at most this")
    parser.add_argument("--no-offline", action="store_true",
                        help="skip the offline placement (the reachable side of the bracket)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)
    if args.arrive <= 0:
        parser.error("--arrive: must be greater than 0")
    if args.time_limit <= 0:
        parser.error("--time-limit: must be greater than 0")
    for path in (args.nodes, args.pods):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    result = compute_bound(load_nodes(args.nodes), load_pods(args.pods), args.seed, args.arrive,
                           args.time_limit, args.exact_limit, not args.no_offline)
    if not args.json:
        print(f"seed {result.seed}: {result.pods_arrived} pods ({result.arrived_gpu_percent:.2f}% of GPU) arrived; "
              f"no placement allocates more than {result.bound_percent:.2f}% ({result.method})", file=sys.stderr)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
