"""The upstream kube-scheduler (built from the Go module proxy) against a test cluster of a
module's own, for the DRA tests that check tessera's devices with Kubernetes' own allocator."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster


@contextlib.contextmanager
def kube_scheduler(c: TestCluster) -> Iterator[subprocess.Popen[bytes]]:
    """kube-scheduler with DRAConsumableCapacity on (its other gates at their defaults), its log
    beside the cluster's; stopped after the block."""
    assert c.workdir is not None
    path = binaries.ensure(["kube-scheduler"])["kube-scheduler"]
    with (c.workdir / "logs" / "kube-scheduler.log").open("ab") as log:
        proc = subprocess.Popen(
            [str(path), f"--kubeconfig={c.kubeconfig}", "--leader-elect=false",
             "--secure-port=0", "--feature-gates=DRAConsumableCapacity=true", "--v=2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
