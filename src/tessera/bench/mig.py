"""MIG placement benchmark: a mixed stream of MIG and shared-GPU requests on simulated A100 nodes.

    python -m tessera.bench.mig [--nodes 100] [--events 20000] [--seed 1] [--json]

Each node has 8 A100-40GB: ``--mig-gpus`` of them (default 4) in MIG mode, the rest shared
through the ordinary placer (fgd). Events arrive at random: a MIG request (profile mix favouring
small ones, as inference fleets do), a shared request (0.25/0.5 GPU or 10 GB), or the end of a
running one; a partition whose workload ended stays, idle, until a request needs it or its room
(lazy removal, as tessera-node does it). The same stream runs twice on the MIG side: tessera's
choice (:func:`tessera.core.mig.choose`) and a first-fit baseline (reuse the first idle partition
of the profile, else the first GPU and first start that fit, else remove the idle partitions of
the first GPU where that makes room). Reported: MIG placements per second of the chooser, how
many MIG requests each refused, idle partitions removed, and the share of free memory slots no
profile could use at the end (fragmentation). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tessera.core import mig
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import Placement, Placer
from tessera.core.requests import parse_gpu_request
from tessera.core.state import ClusterState
from tessera.core.units import GiB

MODEL = "A100-40GB"
MIX = [("1g.5gb", 35), ("1g.10gb", 10), ("2g.10gb", 20), ("3g.20gb", 15), ("4g.20gb", 8),
       ("7g.40gb", 12)]
SHARED: list[GpuRequest] = [parse_gpu_request(gpu="0.25"), parse_gpu_request(gpu="0.5"),
                            parse_gpu_request(gpu_memory="10G")]

Chooser = Callable[[Sequence[mig.MigGpu], str], "mig.MigChoice | None"]


def first_fit(gpus: Sequence[mig.MigGpu], name: str) -> mig.MigChoice | None:
    for gpu in gpus:
        for p in gpu.partitions:
            if p.profile == name and not p.busy:
                return mig.MigChoice(gpu.key, p.start, reuse=p)
    profile = mig.PROFILES[MODEL][name]
    for gpu in gpus:
        starts = mig.free_placements(MODEL, gpu.partitions, profile)
        if starts:
            return mig.MigChoice(gpu.key, starts[0])
    for gpu in gpus:
        busy = tuple(p for p in gpu.partitions if p.busy)
        starts = mig.free_placements(MODEL, busy, profile)
        if starts:
            return mig.MigChoice(gpu.key, starts[0],
                                 destroy=tuple(p for p in gpu.partitions if not p.busy))
    return None


@dataclass
class MigSide:
    choose: Chooser
    gpus: dict[str, list[mig.Partition]]
    placed: int = 0
    refused: int = 0
    removed: int = 0
    seconds: float = 0.0
    running: list[tuple[str, mig.Partition]] = field(default_factory=list)

    def request(self, name: str) -> None:
        view = [mig.MigGpu(k, MODEL, tuple(v)) for k, v in self.gpus.items()]
        t0 = time.perf_counter()
        choice = self.choose(view, name)
        self.seconds += time.perf_counter() - t0
        if choice is None:
            self.refused += 1
            return
        parts = self.gpus[choice.gpu]
        for p in choice.destroy:
            parts.remove(p)
        self.removed += len(choice.destroy)
        if choice.reuse is not None:
            parts.remove(choice.reuse)
        new = mig.Partition(name, choice.start, True)
        parts.append(new)
        self.running.append((choice.gpu, new))
        self.placed += 1

    def end(self, pick: float) -> None:
        """One running partition's workload ends; the partition stays, idle."""
        if not self.running:
            return
        key, p = self.running.pop(int(pick * len(self.running)))
        self.gpus[key].remove(p)
        self.gpus[key].append(mig.Partition(p.profile, p.start, False))

    def unusable_share(self) -> float:
        free = unusable = 0
        for parts in self.gpus.values():
            busy = [p for p in parts if p.busy]
            taken = sum(mig.PROFILES[MODEL][p.profile].slots for p in busy)
            free += mig.SLOTS - taken
            unusable += mig.unusable_slots(MODEL, busy)
        return round(unusable / free, 4) if free else 0.0


def run(nodes: int, mig_gpus: int, events: int, seed: int) -> dict[str, object]:
    keys = [f"node-{n}/{i}" for n in range(nodes) for i in range(mig_gpus)]
    sides = {"tessera": MigSide(mig.choose, {k: [] for k in keys}),
             "first_fit": MigSide(first_fit, {k: [] for k in keys})}
    shared_nodes = [Node(f"node-{n}", tuple(GpuDevice(f"GPU-{n}-{i}", i, 40 * GiB, MODEL)
                                            for i in range(8 - mig_gpus)), 96_000, 512 * GiB)
                    for n in range(nodes)]
    state = ClusterState(shared_nodes)
    placer = Placer(state, "fgd")
    shared_running: list[str] = []
    shared_placed = shared_refused = 0
    shared_seconds = 0.0
    rng = random.Random(seed)
    names = [n for n, _ in MIX]
    weights = [w for _, w in MIX]
    for event in range(events):
        r = rng.random()
        if r < 0.35:
            name = rng.choices(names, weights)[0]
            for side in sides.values():
                side.request(name)
        elif r < 0.6:
            pick = rng.random()  # the same draw for both sides
            for side in sides.values():
                side.end(pick)
        elif r < 0.85:
            t0 = time.perf_counter()
            where = placer.place(ResourceRequest(rng.choice(SHARED)), explain=False)
            shared_seconds += time.perf_counter() - t0
            if isinstance(where, Placement):
                state.assign(f"s{event}", where)
                shared_running.append(f"s{event}")
                shared_placed += 1
            else:
                shared_refused += 1
        elif shared_running:
            state.release(shared_running.pop(rng.randrange(len(shared_running))))
    out: dict[str, object] = {"nodes": nodes, "mig_gpus": nodes * mig_gpus,
                              "shared_gpus": nodes * (8 - mig_gpus), "events": events, "seed": seed}
    for label, side in sides.items():
        out[label] = {"placed": side.placed, "refused": side.refused,
                      "idle_removed": side.removed,
                      "unusable_free_slots": side.unusable_share(),
                      "decisions_per_second": round((side.placed + side.refused) / side.seconds, 1)
                      if side.seconds else 0.0}
    out["shared"] = {"placed": shared_placed, "refused": shared_refused,
                     "decisions_per_second": round((shared_placed + shared_refused) / shared_seconds, 1)
                     if shared_seconds else 0.0}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.mig", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--mig-gpus", type=int, default=4, help="GPUs per node in MIG mode (0-8)")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if not 0 <= args.mig_gpus <= 8:
        parser.error("--mig-gpus: must be 0 to 8")
    if args.nodes < 1 or args.events < 1:
        parser.error("--nodes and --events: must be at least 1")
    result = run(args.nodes, args.mig_gpus, args.events, args.seed)
    if not args.json:
        for label in ("tessera", "first_fit"):
            print(f"{label}: {result[label]}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

