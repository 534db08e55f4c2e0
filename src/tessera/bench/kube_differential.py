"""The differential check of tessera's Kubernetes predicates against kube-scheduler, full size.

    python -m tessera.bench.kube_differential [--worlds 50] [--cases-per-world 10] [--seed 7]

Starts a private test cluster and kube-scheduler v1.36.3 (tessera.testing.kube_differential),
runs the cases, prints each disagreement, and as the last line one JSON object: cases, bound,
unschedulable, disagreements, seconds. Exit status 1 if any case disagrees.
"""

from __future__ import annotations

import argparse
import json
import sys

from tessera.testing import kube_differential as kd
from tessera.testing.cluster import TestCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.kube_differential")
    parser.add_argument("--worlds", type=int, default=50)
    parser.add_argument("--cases-per-world", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=6, help="nodes per world")
    args = parser.parse_args(argv)
    cluster = TestCluster()
    cluster.start()
    proc = kd.start_kube_scheduler(cluster)
    try:
        result = kd.run(cluster, worlds=args.worlds, cases_per_world=args.cases_per_world,
                        seed=args.seed, nodes=args.nodes,
                        report=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        proc.terminate()
        proc.wait(10)
        cluster.stop()
    print(json.dumps({"bench": "kube_differential", "kube_scheduler": "v1.36.3", "cases": result.cases,
                      "bound": result.bound, "unschedulable": result.unschedulable,
                      "disagreements": len(result.disagreements), "seconds": round(result.seconds, 1)}))
    return 1 if result.disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
