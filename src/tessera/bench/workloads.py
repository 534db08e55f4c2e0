"""Workload types at scale (issue 32 targets; docs/benchmarks.md).

``sweep``: embedded mode, ``tessera submit --parallelism 8 --completions 100 -g 0.25`` on four
simulated GPUs (room for 16 at once); samples the trials running every 50 ms; target: never more than 8.

``inference``: embedded mode, an inference of min 1 / max N replicas on concurrency 1 per replica;
N connections held open; seconds until N replicas run; then, from when the last connection
closed, until the scale-down to 1 was decided (``scale_down_decided_seconds``, from the service's
history) and until the other replicas' processes were gone (``scale_down_gone_seconds``);
targets: up within 30 s, decided within the scale-down delay + 1 s (docs/workloads.md).

``gang``: the kwok cluster with kube-controller-manager and the JobSet controller, tessera's
webhook and scheduler; a JobSet of 64 pods (16 Jobs x 4) with a GPU share each; seconds from the
last pod's creation to the last pod's binding; target: 2 s.

Each prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SLEEPER = "import sys, time; time.sleep(float(sys.argv[1]))"
SERVER = r'''
import os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(self.path.strip("/") or 0))
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''


def machine() -> str:
    import os
    return f"{platform.machine()} {os.cpu_count()} cpus, CPython {platform.python_version()}"


def _running(server: Any, prefix: str) -> list[str]:
    with server.http() as c:
        rows = c.get("/api/v1/workloads", params={"limit": 500}).json()["workloads"]
    return [w["name"] for w in rows if w["name"].startswith(prefix) and w["phase"] == "Running"]


def _phases(server: Any, prefix: str) -> dict[str, str]:
    with server.http() as c:
        rows = c.get("/api/v1/workloads", params={"limit": 500}).json()["workloads"]
    return {w["name"]: w["phase"] for w in rows if w["name"].startswith(prefix)}


def sweep(trials: int, parallelism: int, seconds: float) -> dict[str, Any]:
    from tessera.testing.embedded import EmbeddedServer

    with tempfile.TemporaryDirectory() as tmp:
        # 4 GPUs: room for 16 trials of 0.25 at once, so only the sweep holds them to 8.
        server = EmbeddedServer(Path(tmp), simulate=["4xV100-16GB"])
        with server.serving("bench", gpu="4"):
            t0 = time.monotonic()
            server.cli("submit", "hpo", "-p", "bench", "-g", "0.25", "--parallelism",
                       str(parallelism), "--completions", str(trials), "--", sys.executable,
                       "-c", SLEEPER, str(seconds))
            peak, samples = 0, 0
            while True:
                phases = _phases(server, "hpo-")
                running = sum(1 for p in phases.values() if p == "Running")
                peak, samples = max(peak, running), samples + 1
                done = sum(1 for p in phases.values() if p == "Completed")
                if done >= trials:
                    break
                if time.monotonic() - t0 > 900:
                    raise SystemExit(f"sweep not done after 900 s: {done} of {trials}")
                time.sleep(0.05)
            total = time.monotonic() - t0
    return {"benchmark": "workloads.sweep", "trials": trials, "parallelism": parallelism,
            "trial_seconds": seconds, "gpu_per_trial": 0.25, "gpus": 4, "max_running": peak,
            "samples": samples, "seconds": round(total, 2), "target_max_running": parallelism,
            "meets_target": peak <= parallelism, "machine": machine()}


def inference(replicas: int, hold: float, delay: float) -> dict[str, Any]:
    import httpx

    from tessera.testing.embedded import EmbeddedServer, free_port

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "serve.py"
        script.write_text(SERVER)
        server = EmbeddedServer(Path(tmp) / "data", simulate=["1xV100-16GB"])
        with server.serving("bench", gpu="1"):
            port = free_port()
            server.cli("inference", "submit", "svc", "-p", "bench", "-g", "0.1", "--port",
                       str(port), "--min-replicas", "1", "--max-replicas", str(replicas),
                       "--metric", "concurrency", "--metric-threshold", "1",
                       "--scale-down-delay", str(delay), "--", sys.executable, str(script))
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/0", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the service never answered")
                time.sleep(0.1)
            t0 = time.monotonic()
            ends: list[float] = []

            def hold_one() -> None:
                httpx.get(f"{url}/{hold}", timeout=hold + 60)
                ends.append(time.time())

            load = [threading.Thread(target=hold_one) for _ in range(replicas)]
            for t in load:
                t.start()
            while len(_running(server, "svc-")) < replicas:
                if time.monotonic() - t0 > 120:
                    raise SystemExit("never scaled up")
                time.sleep(0.05)
            up = time.monotonic() - t0
            for t in load:
                t.join()
            end = max(ends)  # the last connection closed
            while len(_running(server, "svc-")) > 1:
                if time.time() - end > 120:
                    raise SystemExit("never scaled down")
                time.sleep(0.05)
            while set(_phases(server, "svc-")) != {"svc-0"}:  # the replicas' processes gone
                if time.time() - end > 120:
                    raise SystemExit("the replicas removed never went")
                time.sleep(0.05)
            gone = time.time() - end
            with server.http() as c:
                rows = c.get("/api/v1/workloads", params={"limit": 500}).json()["workloads"]
                wid = next(w["workloadId"] for w in rows if w["name"] == "svc-0")
                history = c.get(f"/api/v1/workloads/inferences/{wid}").json()[
                    "inference"]["history"]
            decided = history[-1]["time"] - end
    return {"benchmark": "workloads.inference", "max_replicas": replicas,
            "scale_up_seconds": round(up, 2), "scale_down_decided_seconds": round(decided, 2),
            "scale_down_gone_seconds": round(gone, 2), "scale_down_delay": delay,
            "target_up_seconds": 30, "target_decided_seconds": delay + 1.0,
            "meets_target": up <= 30 and decided <= delay + 1.0, "machine": machine()}


def gang_pytorchjob(pods: int, whole: bool = False) -> dict[str, Any]:
    """A PyTorchJob (its CRD from the Kubeflow training operator's module) and its pods, created
    by this benchmark as the operator creates them (Master-0, Worker-0..N-2, each owned by the
    PyTorchJob); tessera's webhook and scheduler on the kwok cluster."""
    from concurrent.futures import ThreadPoolExecutor

    import yaml
    from lightkube import codecs
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import Pod

    from tessera.testing.engines import apply_crds, module_dir
    from tessera.testing.workload_stack import project_namespace, workload_stack

    with workload_stack(gpus_per_node=8, nodes=max(2, pods // (8 if whole else 16)),
                        controller_manager=False) as cluster:
        source = module_dir("github.com/kubeflow/training-operator", "v1.9.3")
        crd = yaml.safe_load((source / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
                             .read_text())
        apply_crds(cluster, [crd])
        client = cluster.client()
        ns, _ = project_namespace(client, "bench-gang", deserved=pods)
        share = {} if whole else {"tessera.io/gpu-portion": "0.5"}
        container: dict[str, Any] = {"name": "pytorch", "image": "pytorch"}
        if whole:  # one whole GPU each: no reservation pods, no node agent in the path
            container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        tmpl = {"metadata": {"annotations": share},
                "spec": {"schedulerName": "tessera", "containers": [container]}}
        create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
        job = client.create(codecs.from_dict({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "big"},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": tmpl},
                "Worker": {"replicas": pods - 1, "template": tmpl}}}}), namespace=ns)
        names = ["big-master-0", *(f"big-worker-{i}" for i in range(pods - 1))]
        created: dict[str, float] = {}

        def create(name: str) -> None:
            client.create(codecs.from_dict({
                "apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": name, "annotations": share,
                    "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                         "name": "big", "uid": job.metadata.uid,
                                         "controller": True}]},
                "spec": tmpl["spec"]}), namespace=ns)
            created[name] = time.time()

        t0 = time.time()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(create, names))
        bound_at: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while len(bound_at) < pods:
            now = time.time()
            for p in client.list(Pod, namespace=ns):
                if p.spec.nodeName and p.metadata.name not in bound_at:
                    bound_at[p.metadata.name] = now
            if time.monotonic() > deadline:
                from tessera.testing.workload_stack import scheduled_message
                some = next(iter(client.list(Pod, namespace=ns)), None)
                raise SystemExit(f"{len(bound_at)} of {pods} bound after 300 s; e.g. "
                                 f"{some and (some.metadata.annotations, scheduled_message(some))}")
            time.sleep(0.02)
        groups = {(p.metadata.annotations or {}).get("tessera.io/pod-group")
                  for p in client.list(Pod, namespace=ns)}
    last_created = max(created.values())
    return {"benchmark": "workloads.gang", "pods": pods, "gpu": "1 whole" if whole else "0.5",
            "engine": "PyTorchJob (kubeflow.org/v1 "
            "CRD; pods created as the training operator does)", "groups": sorted(map(str, groups)),
            "create_seconds": round(last_created - t0, 3),
            "last_created_to_last_bound_s": round(max(bound_at.values()) - last_created, 3),
            "first_to_last_bound_s": round(max(bound_at.values()) - min(bound_at.values()), 3),
            "target_seconds": 2.0,
            "meets_target": max(bound_at.values()) - last_created <= 2.0, "machine": machine(),
            "last_created_unix": round(last_created, 3),  # to read the components' logs by
            "first_bound_unix": round(min(bound_at.values()), 3)}


def gang(pods: int) -> dict[str, Any]:
    from lightkube import codecs
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import Pod

    from tessera.testing import engines
    from tessera.testing.workload_stack import project_namespace, workload_stack

    create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
    per_job = 4
    with workload_stack(gpus_per_node=8, nodes=max(2, pods // 16)) as cluster, \
            engines.running(cluster, "jobset"):
        client = cluster.client()
        ns, _ = project_namespace(client, "bench-gang", deserved=pods)
        client.create(codecs.from_dict({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "big"},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": pods // per_job,
                                         "template": {"spec": {
                                             "parallelism": per_job, "completions": per_job,
                                             "backoffLimit": 0, "template": {
                                                 "metadata": {"annotations": {
                                                     "tessera.io/gpu-portion": "0.5"}},
                                                 "spec": {"restartPolicy": "Never",
                                                          "containers": [{"name": "w",
                                                                          "image": "pause"}]}}}}}]}}),
            namespace=ns)
        deadline = time.monotonic() + 300
        bound_at: dict[str, float] = {}
        created: dict[str, float] = {}
        while len(bound_at) < pods:
            for p in client.list(Pod, namespace=ns):
                created.setdefault(p.metadata.name, time.time())
                if p.spec.nodeName and p.metadata.name not in bound_at:
                    bound_at[p.metadata.name] = time.time()
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(bound_at)} of {pods} bound after 300 s")
            time.sleep(0.02)
        last_created = max(created.values())
        first_bound, last_bound = min(bound_at.values()), max(bound_at.values())
    return {"benchmark": "workloads.gang", "pods": pods, "engine": "JobSet (+ Job controller)",
            "seen_last_created_to_last_bound_s": round(last_bound - last_created, 3),
            "first_to_last_bound_s": round(last_bound - first_bound, 3),
            "target_seconds": 2.0, "meets_target": last_bound - last_created <= 2.0,
            "machine": machine()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.workloads")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--trials", type=int, default=100)
    s.add_argument("--parallelism", type=int, default=8)
    s.add_argument("--seconds", type=float, default=0.5, help="each trial's run time")
    i = sub.add_parser("inference")
    i.add_argument("--replicas", type=int, default=4)
    i.add_argument("--hold", type=float, default=10.0)
    i.add_argument("--delay", type=float, default=5.0)
    g = sub.add_parser("gang")
    g.add_argument("--pods", type=int, default=64)
    g.add_argument("--engine", choices=("pytorchjob", "jobset"), default="pytorchjob")
    g.add_argument("--whole", action="store_true", help="one whole GPU per pod (default 0.5)")
    args = ap.parse_args(argv)
    if args.what == "sweep":
        out = sweep(args.trials, args.parallelism, args.seconds)
    elif args.what == "inference":
        out = inference(args.replicas, args.hold, args.delay)
    elif args.engine == "jobset":
        out = gang(args.pods)
    else:
        out = gang_pytorchjob(args.pods, args.whole)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    raise SystemExit(main())
