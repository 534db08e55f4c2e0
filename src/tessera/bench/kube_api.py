"""The REST API on Kubernetes: submit→Running latency and ``tessera list``.

``python -m tessera.bench.kube_api [--submits 30] [--workloads 500] [--repeats 5]``

A test cluster (etcd + kube-apiserver + kwok, ``--nodes`` nodes of 8 x H100-80GB), the
scheduler (harness hook), tessera-node per node and the API server with the Kubernetes
backend, all real processes on this machine.

1. ``--submits`` workloads of 0.05 GPU are submitted one at a time over HTTP; each is polled
   (every 10 ms) until it is Running: the API creates the PodGroup and pod, tessera-scheduler
   places the pod (reservation pod and ConfigMap for the first share of a device), kwok makes
   it Running.
2. ``--workloads`` workloads (in all) are submitted (8 threads), the benchmark waits until all
   are Running, then times the API's listing (``GET /api/v1/workloads`` with the CLI's rows
   shape) and the real CLI (``tessera list -A``, a fresh process each time).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tessera.testing.cluster import TestCluster, start_scheduler
from tessera.testing.embedded import submit_body
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.kube_api import KubeApiServer

FIELDS = "name,phase,createdAt,nodeName,gpuDevices,type,projectName,priorityClass,gpus,workers,runningPods"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.kube_api")
    parser.add_argument("--submits", type=int, default=30)
    parser.add_argument("--workloads", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with TestCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.create_gpu_nodes(args.nodes, NodeShape(gpus=8, model="H100-80GB"))
        if start_scheduler(cluster) is None:
            print("tessera.kube.scheduler is missing", file=sys.stderr)
            return 1
        server = KubeApiServer(Path(tmp), cluster.kubeconfig, interval=1.0).start()
        try:
            with server.http() as c:
                c.post("/api/v1/org-unit/projects", json={
                    "name": "bench", "resources": {"gpu": {"deserved": 8}}}).raise_for_status()
                latencies = []
                for i in range(args.submits):
                    t0 = time.perf_counter()
                    r = c.post("/api/v1/workloads/trainings",
                               json=submit_body(f"s{i}", "bench", gpuPortionRequest="0.05"))
                    r.raise_for_status()
                    wid = r.json()["workloadId"]
                    while c.get(f"/api/v1/workloads/trainings/{wid}").json()["phase"] != "Running":
                        time.sleep(0.01)
                    latencies.append(time.perf_counter() - t0)

                def submit(i: int) -> None:
                    with server.http() as h:
                        h.post("/api/v1/workloads/trainings", json=submit_body(
                            f"w{i}", "bench", gpuPortionRequest="0.05")).raise_for_status()

                t0 = time.perf_counter()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(submit, range(args.submits, args.workloads)))
                submit_all = time.perf_counter() - t0
                deadline = time.monotonic() + 600
                while True:
                    page = c.get("/api/v1/workloads", params={
                        "filterBy": "phase==Running", "limit": 1}).json()
                    if page["total"] >= args.workloads:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {page['total']} Running after 600 s")
                    time.sleep(0.5)
                all_running = time.perf_counter() - t0
                api_times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    page = c.get("/api/v1/workloads", params={
                        "limit": 10000, "shape": "rows", "fields": FIELDS}).json()
                    api_times.append(time.perf_counter() - t)
                    assert page["total"] == args.workloads
            cli_times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                out = server.cli("list", "-A").stdout
                cli_times.append(time.perf_counter() - t)
                assert out.count("Running") >= args.workloads
        finally:
            server.cleanup()
    result = {
        "benchmark": "kube_api",
        "nodes": args.nodes,
        "submits": args.submits,
        "submit_to_running_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "submit_to_running_p95_ms": round(_percentile(latencies, 0.95) * 1000, 1),
        "workloads": args.workloads,
        "submit_rest_s": round(submit_all, 2),
        "all_running_s": round(all_running, 2),
        "api_list_median_ms": round(statistics.median(api_times) * 1000, 1),
        "cli_list_median_ms": round(statistics.median(cli_times) * 1000, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
