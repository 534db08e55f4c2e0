"""The real-node tier (issue 27, item 2; docs/real-node.md): a real kubelet v1.36.3 with
containerd 2.x and runc in its own network and mount namespace (tessera.testing.realnode),
registered with the test API server next to the kwok nodes; tessera-node as its DRA driver under
the chart's privileges; kube-scheduler v1.36.3 places the pods. ``pytest -k real_node`` runs the
tier alone. One cluster and node for the module (about 10 s to a Ready node once built)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.realnode import RealNode
from tessera.testing.realnode_agent import RealNodeAgent, start_agent

NEW_DRIVER = "615.42.01"


@dataclass
class RealWorld:
    cluster: TestCluster
    node: RealNode
    agent: RealNodeAgent
    scheduler: subprocess.Popen[bytes]
    kwok_node: str


@pytest.fixture(scope="module")
def real() -> Iterator[RealWorld]:
    cluster = TestCluster()
    cluster.start()
    node = RealNode(cluster)
    scheduler = None
    try:
        (kwok_node,) = cluster.create_gpu_nodes(1, NodeShape(gpus=1, model="A100-40GB"),
                                                prefix="kwok-")
        node.start()
        # a driver of branch r615+ (NVML's per-cgroup limits hold the shares' hard cap too);
        # GPU 0 whole for shares, GPU 1 in MIG mode (the chart's MIG opt-in for its partitions)
        agent = start_agent(node, env_overrides={"FAKE_NVML_DRIVER_VERSION": NEW_DRIVER,
                                                 "FAKE_GPU_MIG_1": "1"},
                            chart_values=("nodeAgent.manageMig=true",))
        path = binaries.ensure(["kube-scheduler"])["kube-scheduler"]
        assert cluster.workdir is not None
        log = (cluster.workdir / "logs" / "kube-scheduler.log").open("ab")
        scheduler = subprocess.Popen(
            [str(path), f"--kubeconfig={cluster.kubeconfig}", "--leader-elect=false",
             "--secure-port=0", "--feature-gates=DRAConsumableCapacity=true", "--v=2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        yield RealWorld(cluster, node, agent, scheduler, kwok_node)
    finally:
        node.stop()
        if scheduler is not None:
            scheduler.terminate()
            scheduler.wait(10)
        cluster.stop()
