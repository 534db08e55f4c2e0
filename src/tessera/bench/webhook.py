"""Admission latency at a steady rate of GPU-pod creations on the real test cluster.

``python -m tessera.bench.webhook [--rate 200] [--seconds 20] [--warmup 2]``

A TestCluster (etcd + kube-apiserver + kwok, 2 nodes × 8 H100-80GB) with tessera's CRDs and one
Project; ``tessera-webhook`` runs as a real process on loopback, registered with the chart's own
webhook configurations (mutating + validating, TLS). Pods are created open-loop at ``--rate``
per second (a POST is sent on schedule whether or not earlier ones returned), in a mix of
spellings: 40% Run:ai ``gpu-fraction``, 20% Run:ai ``gpu-memory``, 20% cGPU (4 × 2 GiB) and
20% ``tessera.io/gpu-portion``. No scheduler runs, so every pod stays Pending.

Three numbers, all over the pods sent after ``--warmup`` seconds:

- ``webhook_p99_ms``: each review's handling time inside the webhook (request read to response
  sent), per webhook, as the webhook records it;
- ``apiserver_webhook_le_25ms``: from the API server's own histogram
  ``apiserver_admission_webhook_admission_duration_seconds`` (TLS and loopback included; its
  buckets are 5, 25, 100 ms...), the share of calls under 5 and 25 ms per webhook, whole run;
- ``create_p99_ms``: the client's POST round trip (API server, both webhook calls, etcd).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import statistics
import sys
import time
from typing import Any

import httpx

from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape

NAMESPACE = "bench-team-a"


def pod_manifest(i: int) -> dict[str, Any]:
    kind = i % 5
    meta: dict[str, Any] = {"name": f"p{i:06d}"}
    container: dict[str, Any] = {"name": "main", "image": "runai.jfrog.io/demo/quickstart"}
    if kind in (0, 1):
        meta["annotations"] = {"gpu-fraction": "0.5"}
    elif kind == 2:
        meta["annotations"] = {"gpu-memory": "5000"}
    elif kind == 3:
        meta["labels"] = {"aliyun.com/gpu-count": "4"}
        container["resources"] = {"limits": {"aliyun.com/gpu-mem": 8}}
    else:
        meta["annotations"] = {"tessera.io/gpu-portion": "0.25"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container, {"name": "sidecar", "image": "busybox"}]}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(cluster: TestCluster, rate: float, seconds: float
                ) -> tuple[list[tuple[float, float, int]], float]:
    """Create rate × seconds pods on schedule; (sent_offset, latency, status) per pod."""
    assert cluster.pki is not None
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    ctx.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    url = f"{cluster.server}/api/v1/namespaces/{NAMESPACE}/pods"
    results: list[tuple[float, float, int]] = []
    async with httpx.AsyncClient(verify=ctx, limits=limits, timeout=30, http2=True) as client:
        bodies = [json.dumps(pod_manifest(i)).encode() for i in range(int(rate * seconds))]
        headers = {"content-type": "application/json"}

        async def one(i: int, offset: float) -> None:
            t = time.perf_counter()
            r = await client.post(url, content=bodies[i], headers=headers)
            results.append((offset, time.perf_counter() - t, r.status_code))
            if r.status_code != 201 and len([x for x in results if x[2] != 201]) <= 3:
                print(f"pod {i}: {r.status_code} {r.text[:300]}", file=sys.stderr)

        start = time.perf_counter()
        tasks = []
        for i in range(len(bodies)):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i, i / rate)))
        await asyncio.gather(*tasks)
        achieved = len(bodies) / (time.perf_counter() - start)
    return results, achieved


_BUCKET = re.compile(
    r'apiserver_admission_webhook_admission_duration_seconds_bucket\{(?P<labels>[^}]*)\} (?P<v>\S+)')


def apiserver_histogram(cluster: TestCluster) -> dict[str, dict[str, float]]:
    """Cumulative bucket counts per webhook name from the API server's /metrics."""
    assert cluster.pki is not None
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    ctx.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
    text = httpx.get(f"{cluster.server}/metrics", verify=ctx, timeout=10).text
    out: dict[str, dict[str, float]] = {}
    for m in _BUCKET.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("operation") != "CREATE":
            continue
        per = out.setdefault(labels["name"], {})
        per[labels["le"]] = per.get(labels["le"], 0.0) + float(m.group("v"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.bench.webhook", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=200.0, help="pod creations per second")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the percentiles")
    p.add_argument("--no-webhook", action="store_true",
                   help="baseline: the same load with no webhook registered")
    p.add_argument("--rewrite-to-claims", action="store_true",
                   help="the webhook rewrites the requests into ResourceClaims (a template per "
                        "shape, checked or created at each review; docs/dra.md)")
    args = p.parse_args(argv)

    with TestCluster(report=lambda m: print(m, file=sys.stderr)) as cluster:
        cluster.create_gpu_nodes(2, NodeShape(gpus=8, model="H100-80GB"))
        docs = local.helm_template(include_crds=True)
        local.apply(cluster, [d for d in docs if d["kind"] == "CustomResourceDefinition"])
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io")
        cluster.kubectl("create", "namespace", NAMESPACE)
        project = {"apiVersion": "tessera.io/v1alpha1", "kind": "Project",
                   "metadata": {"name": "team-a"},
                   "spec": {"namespace": NAMESPACE, "resources": {"gpu": {"deserved": 16}}}}
        local.apply(cluster, [project])
        assert cluster.workdir is not None
        lat_file = cluster.workdir / "webhook-latencies.json"
        hook = None
        if not args.no_webhook:
            rewrite = ["--rewrite-to-claims"] if args.rewrite_to_claims else []
            hook = local.start_webhook(cluster, extra_args=[f"--record-latencies={lat_file}",
                                                            "--log-level=WARNING", *rewrite])
            local.register(cluster, hook,
                           *(["dra.rewriteRequests=true"] if args.rewrite_to_claims else []))
            time.sleep(1.0)  # the project reaches the webhook's informer
        results, achieved = asyncio.run(drive(cluster, args.rate, args.seconds))
        hist = apiserver_histogram(cluster)
        recorded = []
        if hook is not None:
            hook.stop()
            recorded = json.loads(lat_file.read_text())

    ok = [r for r in results if r[2] == 201]
    measured = [lat for off, lat, code in results if code == 201 and off >= args.warmup]
    n_total = len(recorded)
    skip = int(n_total * args.warmup / args.seconds)  # recorded in arrival order
    per_hook: dict[str, list[float]] = {}
    for path, seconds in recorded[skip:]:
        per_hook.setdefault(path, []).append(seconds)
    le5 = {name: round(b.get("0.005", 0) / b["+Inf"], 4) for name, b in hist.items()
           if b.get("+Inf")}
    le25 = {name: round(b.get("0.025", 0) / b["+Inf"], 4) for name, b in hist.items()
            if b.get("+Inf")}
    summary = {
        "webhook": not args.no_webhook,
        "rewrite_to_claims": args.rewrite_to_claims,
        "rate_target": args.rate,
        "rate_achieved": round(achieved, 1),
        "pods": len(results),
        "pods_created": len(ok),
        "webhook_p50_ms": {k.strip("/"): round(statistics.median(v) * 1000, 2)
                           for k, v in per_hook.items()},
        "webhook_p99_ms": {k.strip("/"): round(percentile(v, 0.99) * 1000, 2)
                           for k, v in per_hook.items()},
        "webhook_max_ms": {k.strip("/"): round(max(v) * 1000, 2) for k, v in per_hook.items()},
        "apiserver_webhook_le_5ms": le5,
        "apiserver_webhook_le_25ms": le25,
        "create_p50_ms": round(statistics.median(measured) * 1000, 1) if measured else None,
        "create_p99_ms": round(percentile(measured, 0.99) * 1000, 1) if measured else None,
    }
    print(json.dumps(summary))
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
