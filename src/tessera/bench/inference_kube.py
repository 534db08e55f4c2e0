"""Inference that scales on Kubernetes (issue 32): ``python -m tessera.bench.inference_kube
[--replicas 4 --hold 10 --delay 5]``.

The workload test cluster (real kube-apiserver, kube-controller-manager's Deployment and
ReplicaSet controllers, tessera's webhook and scheduler, kwok nodes), an inference of min 1 /
max N replicas on ``concurrency`` 1 per replica, the API server's autoscaler at its production
interval (1 s), each replica's real tessera proxy started on its pod IP
(tessera.testing.replica_proxies). N connections are held open through replica 0's proxy for
``--hold`` seconds: ``scale_up_seconds`` is from the load's start until N replicas run with
their proxies. From the moment the last connection closed (its client's answer):
``scale_down_decided_seconds`` until the autoscaler set the Deployment to 1 (its history; the
target: within the scale-down delay + 1 s, docs/workloads.md), ``scale_down_proxies_seconds``
until only one replica's proxy still runs (the others got SIGTERM as their pods were deleted, and
exited), ``scale_down_gone_seconds`` until the API server lists one pod (kube-controller-manager's
ReplicaSet controller deleted them, kwok removed them). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tessera.bench.workloads import machine

MODEL_SERVER = r"""
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(self.path.strip("/") or 0))
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _wait(what: str, ok: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := ok()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.05)
    return got


def run(replicas: int, hold: float, delay: float) -> dict[str, Any]:
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Pod

    from tessera.api.backend import WorkloadSubmission
    from tessera.core.model import GpuRequest
    from tessera.kube.api_backend import KubeBackend
    from tessera.kube.autoscaling import KubeAutoscaler
    from tessera.kube.workload_docs import WORKLOAD_ID
    from tessera.testing.embedded import free_port
    from tessera.testing.replica_proxies import ReplicaProxies
    from tessera.testing.workload_stack import project_namespace, workload_stack

    with workload_stack() as cluster, tempfile.TemporaryDirectory() as tmp:
        client = cluster.client()
        ns, project = project_namespace(client, "bench-infer")
        backend = KubeBackend(client, Path(tmp))
        scaler = KubeAutoscaler(client).start()
        port = free_port()
        model = subprocess.Popen([sys.executable, "-c", MODEL_SERVER, str(port)])
        try:
            doc = backend.submit(WorkloadSubmission(
                name="svc", project=project, type="Inference", gpu=GpuRequest.fraction("0.25"),
                command=["python", "serve.py"],
                spec={"command": "python", "args": "serve.py", "ports": [{"container": port}],
                      "autoscaling": {"minReplicas": 1, "maxReplicas": replicas,
                                      "metric": "concurrency", "metricThreshold": 1,
                                      "scaleDownDelaySeconds": delay}}))

            def want() -> int:
                return int(client.get(Deployment, "svc", namespace=ns).spec.replicas)

            with ReplicaProxies(client, ns, doc["workloadId"]) as proxies:
                ip = proxies.ips[_wait("replica 0", lambda: proxies.running() or None)[0]]

                def answers() -> bool:
                    try:
                        return httpx.get(f"http://{ip}:8013/0", timeout=5).status_code == 200
                    except httpx.HTTPError:
                        return False
                _wait("replica 0 answers", answers)
                t0 = time.monotonic()
                ends: list[float] = []

                def hold_one() -> None:
                    httpx.get(f"http://{ip}:8013/{hold}", timeout=hold + 60)
                    ends.append(time.time())

                load = [threading.Thread(target=hold_one) for _ in range(replicas)]
                for t in load:
                    t.start()
                _wait("scale up", lambda: want() == replicas
                      and len(proxies.running()) == replicas)
                up = time.monotonic() - t0
                for t in load:
                    t.join()
                end = max(ends)  # the last connection closed
                _wait("scale down", lambda: want() == 1)
                _wait("the proxies of the replicas removed stopped",
                      lambda: len(proxies.running()) == 1)
                proxies_down = time.time() - end
                _wait("the pods removed gone", lambda: len(list(client.list(
                    Pod, namespace=ns, labels={WORKLOAD_ID: doc["workloadId"]}))) == 1)
                gone = time.time() - end
                decided = scaler.state[doc["workloadId"]].history[-1][0] - end
            backend.delete_workload(doc["workloadId"])
        finally:
            scaler.stop()
            model.terminate()
            model.wait()
            backend.stop()
    return {"benchmark": "inference_kube", "max_replicas": replicas,
            "scale_up_seconds": round(up, 2), "scale_down_decided_seconds": round(decided, 2),
            "scale_down_proxies_seconds": round(proxies_down, 2),
            "scale_down_gone_seconds": round(gone, 2), "scale_down_delay": delay,
            "target_up_seconds": 30, "target_decided_seconds": delay + 1.0,
            "meets_target": up <= 30 and decided <= delay + 1.0, "machine": machine()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.inference_kube")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--hold", type=float, default=10.0)
    ap.add_argument("--delay", type=float, default=5.0)
    args = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("tessera.kube.autoscaling").setLevel(logging.INFO)  # its decisions
    print(json.dumps(run(args.replicas, args.hold, args.delay)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
