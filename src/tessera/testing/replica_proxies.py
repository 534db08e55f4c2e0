"""The kubelet's part for the replicas of an inference that scales on the kwok test cluster
(test harness): kwok runs no containers, so for each Running replica pod this starts the pod's
``tessera-proxy`` container command (tessera.kube.replica_proxy, the real program, with its pod's
``POD_IP``) on that pod's IP, added to the loopback interface (needs root and ``ip``, as
tessera.testing.service_proxy does). The model server behind the proxies is the test's own
process on ``127.0.0.1:PORT``; on one machine the replicas share it (each real pod has its own).
The autoscaler then reads the real proxies' counters at ``POD_IP:9464``, as in a cluster.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Pod

from tessera.kube import workload_docs as wd
from tessera.testing.processes import stop_processes


class ReplicaProxies:
    def __init__(self, client: Client, namespace: str, workload_id: str) -> None:
        self.client = client
        self.namespace = namespace
        self.workload_id = workload_id
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ips: dict[str, str] = {}
        self.last_error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="replica-proxies")

    def __enter__(self) -> ReplicaProxies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        stop_processes(list(self.procs.values()))
        for ip in set(self.ips.values()):
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)

    def running(self) -> list[str]:
        """Names of the replica pods whose proxy was started and is still running."""
        return sorted(n for n, p in self.procs.items() if p.poll() is None)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._step()
            except Exception as exc:  # the API server busy: the next step tries again
                self.last_error = exc

    def _step(self) -> None:
        pods: list[Any] = list(self.client.list(Pod, namespace=self.namespace,
                                                labels={wd.WORKLOAD_ID: self.workload_id}))
        live = set()
        for pod in pods:
            name = pod.metadata.name
            ip = pod.status.podIP if pod.status else None
            if pod.metadata.deletionTimestamp is not None or not ip or \
                    (pod.status.phase if pod.status else None) != "Running":
                continue
            live.add(name)
            if name in self.procs and self.procs[name].poll() is None:
                continue  # running; one that exited is started again (restartPolicy Always)
            proxy = next(c for c in pod.spec.containers if c.name == "tessera-proxy")
            argv = list(proxy.command)
            if argv[0] == "python":
                argv[0] = sys.executable
            out = subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"],
                                 capture_output=True, text=True)
            if out.returncode != 0 and not any(w in out.stderr for w in ("File exists",
                                                             "already assigned")):
                raise RuntimeError(f"ip addr add {ip}: {out.stderr.strip()}")
            self.ips[name] = ip
            self.procs[name] = subprocess.Popen(argv, env={"POD_IP": ip, "PATH": "/usr/bin:/bin",
                                                           "PYTHONPATH": ":".join(sys.path)})
        # The pod was deleted: its proxy gets SIGTERM, as from the kubelet, all at once.
        stop_processes([self.procs.pop(n) for n in [n for n in self.procs if n not in live]])
