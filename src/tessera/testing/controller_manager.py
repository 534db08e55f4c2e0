"""kube-controller-manager for the test cluster: ``start_controller_manager(cluster)`` after
``cluster.start()`` runs the controllers workloads need, on loopback (docs/test-cluster.md).
(Test harness.)"""

from __future__ import annotations

import time

import httpx

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster
from tessera.testing.processes import ManagedProcess, _wait_for, free_ports

CONTROLLER_MANAGER = "kube-controller-manager"
CONTROLLERS = (
    "job-controller", "cronjob-controller", "replicaset-controller", "deployment-controller",
    "statefulset-controller", "garbage-collector-controller", "resourceclaim-controller",
    "namespace-controller", "endpointslice-controller",
)
"""kube-controller-manager's controllers the test cluster runs (the namespace controller: a test
that deletes its namespaces gets its pods and GPUs back; the EndpointSlice controller: a
workload's Service (--port) lists its pods; not the node lifecycle, IPAM or service-account
controllers: kwok nodes need none)."""


def start_controller_manager(self: TestCluster) -> None:
    """kube-controller-manager with the controllers workloads need, on loopback."""
    assert self.workdir is not None and self.pki is not None
    t = time.monotonic()
    self.paths[CONTROLLER_MANAGER] = self.binary_overrides.get(CONTROLLER_MANAGER) or \
        binaries.ensure([CONTROLLER_MANAGER], report=self.report)[CONTROLLER_MANAGER]
    (port,) = free_ports(1)
    kcm = ManagedProcess(
        CONTROLLER_MANAGER,
        [
            str(self.paths[CONTROLLER_MANAGER]),
            f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={self.pki.sa_private_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--concurrent-job-syncs=10",
            "--v=0",
        ],
        self.workdir / "logs" / "kube-controller-manager.log",
    )
    self.processes.append(kcm)
    kcm.start()
    _wait_for(
        "kube-controller-manager /healthz",
        lambda: httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False,
                          timeout=2).status_code == 200,
        timeout=60,
        processes=[kcm],
        interval=0.2,
    )
    self.startup_seconds[CONTROLLER_MANAGER] = time.monotonic() - t
