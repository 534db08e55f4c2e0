"""Replay the Alibaba GPU-sharing trace (openb, 2023) the way the FGD paper does.

Pods are drawn from the trace at random (seeded): the whole list shuffled, then resampled with
replacement, submitted one at a time until the GPU requests that arrived reach ``--arrive`` ×
cluster GPU capacity. Each pod is placed once or dropped. Reported: allocation ratio (allocated
GPU milli / total) at 100% arrived and at the end, the allocation curve (allocated % at each
integer arrival level, binned as the FGD artifact bins it) and placement decisions per second.

    python -m tessera.bench.trace --nodes NODES.csv --pods PODS.csv --policy fgd --seed 42 --json
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from tessera.bench.replay_moves import Mover
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import POLICIES, NoFit, Placement, Placer
from tessera.core.placement.fragmentation import typical_workload
from tessera.core.requests import parse_models
from tessera.core.state import ClusterState
from tessera.core.units import GiB, MiB

GPU_MEMORY_GIB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24}
"""Device sizes of the trace's models; the undisclosed G1/G2/G3 are taken as 32 GiB.
Sizes only set the byte granularity: the trace asks for portions, not bytes."""


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    request: ResourceRequest
    gpu_milli: int
    """Total GPU demand in thousandths of a GPU (num_gpu × 1000 for whole GPUs)."""


def load_nodes(path: Path) -> list[Node]:
    nodes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"]
            size = GPU_MEMORY_GIB.get(model, 32) * GiB
            gpus = tuple(
                GpuDevice(f"GPU-{row['sn']}-{i}", i, size, model) for i in range(int(row["gpu"]))
            )
            nodes.append(
                Node(row["sn"], gpus, int(row["cpu_milli"]), int(row["memory_mib"]) * MiB)
            )
    return nodes


def synthetic_nodes(count: int, gpus_per_node: int = 8) -> list[Node]:
    """A uniform cluster of 80 GB H100 nodes (128 CPUs, 1 TiB) for speed runs at scale."""
    size = 80 * 10**9
    return [
        Node(
            f"node-{n:05d}",
            tuple(GpuDevice(f"GPU-{n:05d}-{i}", i, size, "H100-80GB") for i in range(gpus_per_node)),
            128_000,
            1024 * GiB,
        )
        for n in range(count)
    ]


def pod_request(row: dict[str, str]) -> TracePod:
    num_gpu = int(row["num_gpu"])
    milli = int(row["gpu_milli"])
    models = parse_models(row.get("gpu_spec") or None)
    if num_gpu == 0:
        gpu, demand = GpuRequest.none(), 0
    elif num_gpu == 1 and milli < 1000:
        gpu, demand = GpuRequest.fraction(Decimal(milli) / 1000, models=models), milli
    else:
        gpu, demand = GpuRequest.whole(num_gpu, models), num_gpu * 1000
    request = ResourceRequest(gpu, int(row["cpu_milli"]), int(row["memory_mib"]) * MiB)
    return TracePod(row["name"], request, demand)


def load_pods(path: Path) -> list[TracePod]:
    with path.open(newline="") as f:
        return [pod_request(row) for row in csv.DictReader(f)]


def arrivals(pods: Sequence[TracePod], rng: random.Random) -> Iterator[TracePod]:
    order = list(pods)
    rng.shuffle(order)
    yield from order
    while True:
        yield pods[rng.randrange(len(pods))]


@dataclass
class TraceResult:
    policy: str
    seed: int
    arrive: float
    nodes: int
    gpus: int
    gpu_milli_total: int
    gpu_milli_allocated: int
    allocation_ratio: float
    allocation_ratio_at_100: float
    unallocated_gpu_percent_at_100: float
    pods_arrived: int
    pods_placed: int
    decisions_per_second: float
    decisions_per_cpu_second: float
    """Decisions per second of this process's CPU time: the one-core speed, much less disturbed
    than wall time when the machine is shared (``decisions_per_second`` is wall time)."""
    unallocated_at_100: float
    """100 − allocated GPU % at the moment the arrived GPU demand reached 100% of capacity."""
    allocation_curve: list[float]
    """Allocated GPU % at arrival level 0, 1, … %: the mean over the pods whose arrival put the
    arrived demand at that level when rounded (as the FGD artifact's expected-results curves)."""
    arrived_curve: list[float]
    """Arrived GPU demand % averaged over the same pods as ``allocation_curve``: the difference
    is the demand dropped by then, free of the noise of which pods happened to arrive."""
    max_moves: int = 0
    """``--moves``: fractional pods that may move to make room for one arriving pod (0: none)."""
    moves: int = 0
    """Pods moved in all (:mod:`tessera.bench.replay_moves`)."""
    placed_by_moves: int = 0
    """Pods placed only because others moved."""
    moves_at_100: int = 0
    """Pods moved by the time the arrived GPU demand reached 100% of capacity."""


def run_trace(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str,
    seed: int = 42,
    arrive: float = 1.3,
    max_moves: int = 0,
) -> TraceResult:
    state = ClusterState(nodes)
    placer = Placer(state, policy, seed=seed, workload=typical_workload(p.request for p in pods))
    mover = Mover(state, placer, max_moves)
    moves_at_100: int | None = None
    capacity = state.gpus_total() * 1000
    rng = random.Random(seed)
    arrived_milli = arrived = placed = placed_milli = 0
    at_100: float | None = None
    elapsed = cpu = 0.0
    sums: list[float] = []
    arrived_sums: list[float] = []
    counts: list[int] = []
    for pod in arrivals(pods, rng):
        if arrived_milli >= arrive * capacity:
            break
        if at_100 is None and arrived_milli >= capacity:
            at_100 = state.gpus_allocated() * 1000 / capacity
            moves_at_100 = mover.moves
        arrived += 1
        arrived_milli += pod.gpu_milli
        start = time.perf_counter()
        start_cpu = time.process_time()
        where: Placement | NoFit | None = placer.place(pod.request, explain=False)
        alloc_id = f"{pod.name}#{arrived}"
        if isinstance(where, Placement):
            state.assign(alloc_id, where)
        elif max_moves:
            where = mover.make_room(alloc_id, pod.request)  # assigned there when it succeeds
        if isinstance(where, Placement):
            if max_moves:
                mover.placed(alloc_id, pod.request, where)
            placed += 1
            placed_milli += pod.gpu_milli
        cpu += time.process_time() - start_cpu
        elapsed += time.perf_counter() - start
        level = int(100 * arrived_milli / capacity + 0.5)
        while len(sums) <= level:
            sums.append(0.0)
            arrived_sums.append(0.0)
            counts.append(0)
        sums[level] += 100 * placed_milli / capacity
        arrived_sums[level] += 100 * arrived_milli / capacity
        counts[level] += 1
    allocated = round(state.gpus_allocated() * 1000)
    ratio = allocated / capacity
    at_100 = ratio if at_100 is None else at_100
    return TraceResult(
        policy=policy,
        seed=seed,
        arrive=arrive,
        nodes=len(state.nodes),
        gpus=state.gpus_total(),
        gpu_milli_total=capacity,
        gpu_milli_allocated=allocated,
        allocation_ratio=round(ratio, 5),
        allocation_ratio_at_100=round(at_100, 5),
        unallocated_gpu_percent_at_100=round(100 * (1 - at_100), 3),
        pods_arrived=arrived,
        pods_placed=placed,
        decisions_per_second=round(arrived / elapsed, 1) if elapsed else 0.0,
        decisions_per_cpu_second=round(arrived / cpu, 1) if cpu else 0.0,
        unallocated_at_100=round(100 * (1 - at_100), 3),
        allocation_curve=_curve(sums, counts),
        arrived_curve=_curve(arrived_sums, counts),
        max_moves=max_moves,
        moves=mover.moves,
        placed_by_moves=mover.rescued,
        moves_at_100=mover.moves if moves_at_100 is None else moves_at_100,
    )


def _curve(sums: Sequence[float], counts: Sequence[int]) -> list[float]:
    """Mean per level; a level no pod landed on (a large pod jumped over it) repeats the last."""
    curve: list[float] = []
    for total, count in zip(sums, counts, strict=True):
        curve.append(round(total / count, 3) if count else (curve[-1] if curve else 0.0))
    return curve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.trace", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--nodes", type=Path, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    where.add_argument("--synthetic-nodes", type=int, metavar="N", help="N uniform 8×H100-80GB nodes instead of a CSV")
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (the openb_pod_list_*.csv format)")
    parser.add_argument("--policy", default="fgd", choices=POLICIES)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrive", type=float, default=1.3, help="stop when arrived GPU demand reaches this × capacity")
    parser.add_argument("--moves", type=int, default=0, metavar="N",
                        help="consolidation in the replay: move up to N placed fractional pods "
                             "to make room for a pod that finds none (default 0: never)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)
    if args.arrive <= 0:
        parser.error("--arrive: must be greater than 0")
    for path in (args.nodes, args.pods):
        if path is not None and not path.is_file():
            parser.error(f"{path}: no such file")
    if not 0 <= args.moves <= 64:
        parser.error("--moves: must be 0 to 64")
    if args.synthetic_nodes is not None and args.synthetic_nodes < 1:
        parser.error("--synthetic-nodes: must be 1 or more")
    nodes = load_nodes(args.nodes) if args.nodes else synthetic_nodes(args.synthetic_nodes)
    result = run_trace(nodes, load_pods(args.pods), args.policy, args.seed, args.arrive, args.moves)
    if not args.json:
        print(
            f"{result.policy} seed {result.seed}: {result.pods_placed}/{result.pods_arrived} pods placed on "
            f"{result.nodes} nodes / {result.gpus} GPUs; allocated {100 * result.allocation_ratio:.2f}% of GPU "
            f"at {100 * result.arrive:.0f}% arrived ({100 * result.allocation_ratio_at_100:.2f}% at 100%); "
            f"{result.decisions_per_second:.0f} decisions/s ({result.decisions_per_cpu_second:.0f} per CPU second)",
            file=sys.stderr,
        )
    print(json.dumps(result.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
