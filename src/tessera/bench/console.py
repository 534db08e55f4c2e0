"""The console's server side: what its pages ask of the API, and a ``/metrics`` scrape.

``python -m tessera.bench.console [--workloads 10000] [--nodes 500] [--repeats 20]``

1. Embedded mode with ``--workloads`` workload records (written in bulk as ``bench.api`` does):
   the Workloads page's first data (``GET /api/v1/workloads``: 50 rows, newest first, the
   console's fields), the Overview (``GET /api/v1/overview``) and ``GET /metrics`` — each read
   cold (the shared snapshot expired first) and warm.
2. Kubernetes backend on a test cluster (etcd + kube-apiserver + kwok) with ``--nodes`` nodes of
   8 GPUs: the GPUs page's data (``GET /api/v1/cluster`` plus the workload names it colours by),
   with every node's usage joined in: each Node carries a ``tessera.io/node-agent-url`` and the
   API server polls it as it polls tessera-node. The agents are stand-ins (one HTTP server in a
   child process answering each node's ``/usage`` with a document built by the agent's own
   :func:`tessera.node.report.usage_document`): 500 agent processes do not fit this machine.

Times are round trips over loopback from this process (the server's time plus a few hundred
microseconds). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tessera.bench.agent_stand_ins import AgentStandIns
from tessera.bench.api import fill_store
from tessera.testing.embedded import EmbeddedServer

PAGE: dict[str, str | int] = {"limit": 50, "offset": 0, "sortBy": "createdAt", "sortOrder": "desc", "shape": "rows",
        "fields": "workloadId,name,projectName,type,phase,gpus,nodeName,gpuDevices,createdAt,"
                  "phaseMessage"}


def _timed(get: Any, repeats: int, pause: float = 0.0) -> list[float]:
    times = []
    for _ in range(repeats):
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        r = get()
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
    return times


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def embedded(workloads: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tessera-bench-console-") as tmp:
        server = EmbeddedServer(Path(tmp), simulate=["2xH100-80GB"])
        server.start()
        try:
            server.stop()
            fill_store(server, workloads)
            server.start()
            out: dict[str, Any] = {}
            with server.http() as c:
                c.get("/api/v1/workloads", params=PAGE).raise_for_status()
                page = _timed(lambda: c.get("/api/v1/workloads", params=PAGE), repeats)
                # cold: the snapshot (max age 1 s) has expired before each read
                over_cold = _timed(lambda: c.get("/api/v1/overview"), repeats // 4 or 1, 1.1)
                over_warm = _timed(lambda: c.get("/api/v1/overview"), repeats)
                metrics_cold = _timed(lambda: httpx.get(f"{server.url}/metrics"),
                                      repeats // 4 or 1, 1.1)
                metrics_warm = _timed(lambda: httpx.get(f"{server.url}/metrics"), repeats)
            out.update(workloads_page_p50_ms=_p(page, 0.5), workloads_page_p95_ms=_p(page, 0.95),
                       overview_cold_p50_ms=_p(over_cold, 0.5),
                       overview_warm_p50_ms=_p(over_warm, 0.5),
                       metrics_scrape_cold_p50_ms=_p(metrics_cold, 0.5),
                       metrics_scrape_cold_max_ms=_p(metrics_cold, 1.0),
                       metrics_scrape_warm_p50_ms=_p(metrics_warm, 0.5))
            return out
        finally:
            server.cleanup()


def _merge_cost(cluster: dict[str, Any], docs: dict[str, bytes], repeats: int = 10) -> float:
    """What joining every node's report to the cluster document costs (in this process, so the
    figure is the join alone, not the round trip)."""
    import copy

    from tessera.api.usage import merge, report_of

    reports = {n["name"]: report_of(n["name"], json.loads(docs[f"/{n['name']}/usage"]))
               for n in cluster["nodes"] if f"/{n['name']}/usage" in docs}
    copies = [copy.deepcopy(cluster) for _ in range(repeats)]
    times = []
    for doc in copies:
        t0 = time.perf_counter()
        merge(doc, reports)
        times.append(time.perf_counter() - t0)
    return _p(times, 0.5)


def kubernetes(nodes: int, repeats: int, usage: bool = True) -> dict[str, Any]:
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    from tessera.kube.names import AGENT_URL
    from tessera.testing.cluster import TestCluster
    from tessera.testing.gpu_nodes import GPU_UUIDS_ANNOTATION, NodeShape
    from tessera.testing.kube_api import KubeApiServer

    with TestCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        crds = Path(__file__).resolve().parents[3] / "deploy" / "crds"  # as the chart installs them
        cluster.kubectl("apply", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        names = cluster.create_gpu_nodes(nodes, NodeShape(gpus=8, model="H100-80GB"),
                                         node_agents=False)
        client = cluster.client()
        uuids = {str(n.metadata.name): (n.metadata.annotations or {})[GPU_UUIDS_ANNOTATION]
                 .split(",") for n in client.list(Node)
                 if n.metadata and str(n.metadata.name) in set(names)}
        agents = AgentStandIns(uuids if usage else {}, Path(tmp))
        for name in names if usage else ():
            client.patch(Node, name, {"metadata": {"annotations": {AGENT_URL: f"{agents.url}/{name}"}}},
                         patch_type=PatchType.MERGE)
        server = KubeApiServer(Path(tmp), cluster.kubeconfig, interval=1.0).start()
        try:
            with server.http() as c:
                deadline = time.monotonic() + 120
                while (len(c.get("/api/v1/cluster").json()["nodes"]) < nodes
                       or c.get("/api/v1/workloads").status_code != 200):  # CRD storage ready
                    if time.monotonic() > deadline:
                        raise RuntimeError("the API server did not see every node in 120 s")
                    time.sleep(0.5)

                t0 = time.monotonic()
                while usage and sum((n.get("agent") or {}).get("state") == "ok"
                                    for n in c.get("/api/v1/cluster").json()["nodes"]) < nodes:
                    if time.monotonic() - t0 > 120:
                        raise RuntimeError("the API server had not every node's usage in 120 s")
                    time.sleep(0.2)
                first_round = time.monotonic() - t0

                def gpus_page() -> Any:
                    r = c.get("/api/v1/cluster")
                    c.get("/api/v1/workloads", params={"limit": 10000, "fields": "name,projectName",
                                                       "shape": "rows"}).raise_for_status()
                    return r

                times = _timed(gpus_page, repeats)
                merge_ms = _merge_cost(c.get("/api/v1/cluster").json(), agents.docs)
                final = c.get("/api/v1/cluster").json()["nodes"]
                gpus = sum(len(n["gpus"]) for n in final)
                reporting = sum((n.get("agent") or {}).get("state") == "ok" for n in final)
                with_usage = sum("usedBytes" in g for n in final for g in n["gpus"])
        finally:
            server.stop()
            agents.stop()
    return {"nodes": nodes, "gpus": gpus, "gpus_page_p50_ms": _p(times, 0.5),
            "gpus_page_p95_ms": _p(times, 0.95), "nodes_reporting_usage": reporting,
            "gpus_with_usage": with_usage, "usage_merge_p50_ms": merge_ms,
            "usage_all_nodes_after_s": round(first_round, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.console")
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--page", action="store_true",
                        help="only the GPUs page drawn in Chromium: --nodes nodes x 8 GPUs on the "
                             "Kubernetes backend, --crowded GPUs with 30 shares "
                             "(tessera.bench.console_page)")
    parser.add_argument("--crowded", type=int, default=3,
                        help="--page: GPUs to fill with 30 shares of 0.03 each")
    parser.add_argument("--no-usage", action="store_true",
                        help="Kubernetes part: no node publishes an agent address (nothing polled)")
    args = parser.parse_args(argv)
    if args.workloads < 1 or args.nodes < 0 or args.repeats < 1:
        parser.error("--workloads >= 1, --nodes >= 0 (0: skip Kubernetes), --repeats >= 1")
    result: dict[str, Any] = {"benchmark": "console", "workloads": args.workloads}
    if args.page:
        from tessera.bench.console_page import page

        result.update(page(nodes=args.nodes or 500, crowded=max(1, args.crowded),
                           repeats=max(3, min(args.repeats, 15))))
        print(json.dumps(result), flush=True)
        return 0
    result.update(embedded(args.workloads, args.repeats))
    if args.nodes:
        result.update(kubernetes(args.nodes, max(5, args.repeats // 4), usage=not args.no_usage))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
