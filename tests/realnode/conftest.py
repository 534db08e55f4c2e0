"""The real-node tier (issue 27, item 2; docs/real-node.md): a real kubelet v1.36.3 with
containerd 2.x and runc in its own network and mount namespace (tessera.testing.realnode),
registered with the test API server next to the kwok nodes; tessera-node as its DRA driver under
the chart's privileges; kube-scheduler v1.36.3 places the pods. ``pytest -k real_node`` runs the
tier alone. One cluster and node for the module (about 10 s to a Ready node once built)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tessera.kube import names
from tessera.testing import binaries, webhook
from tessera.testing.cluster import ManagedProcess, TestCluster
from tessera.testing.gpu_nodes import NodeShape, node_manifest
from tessera.testing.node_images import PAUSE_IMAGE
from tessera.testing.realnode import RealNode
from tessera.testing.realnode_agent import RealNodeAgent, start_agent
from tessera.testing.stack import Stack, start_stack
from tests.waiting import wait_until

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
        # tessera-node as the chart's ServiceAccount with the chart's RBAC (what the webhook and
        # the API server let it write is what a cluster lets it write)
        docs = webhook.helm_template(include_crds=False)
        cluster.kubectl("create", "namespace", names.SYSTEM_NAMESPACE, check=False)
        webhook.apply(cluster, [d for d in docs if d["kind"] in (
            "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")])
        node_kc = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-node-agent")
        # a driver of branch r615+ (NVML's per-cgroup limits hold the shares' hard cap too);
        # GPU 0 whole for shares, GPU 1 in MIG mode (the chart's MIG opt-in for its partitions)
        agent = start_agent(node, env_overrides={"FAKE_NVML_DRIVER_VERSION": NEW_DRIVER,
                                                 "FAKE_GPU_MIG_1": "1"},
                            chart_values=("nodeAgent.manageMig=true",), kubeconfig=node_kc)
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


@dataclass
class WebhookPath:
    """The annotation path on the real node: tessera's webhook and tessera-scheduler (as the
    chart runs them, tessera.testing.stack) and a device plugin advertising ``nvidia.com/gpu``
    for the whole GPU 0 (a test double of NVIDIA's, tessera.testing.deviceplugin)."""
    stack: Stack
    device_plugin: ManagedProcess


@pytest.fixture(scope="module")
def webhook_path(real: RealWorld) -> Iterator[WebhookPath]:
    node, agent = real.node, real.agent
    plugin = ManagedProcess("real-node-device-plugin", [
        sys.executable, "-m", "tessera.testing.deviceplugin",
        f"--dir={node.device_plugins_dir}", agent.uuids[0]],
        node.logs / "real-node-device-plugin.log")
    plugin.start()
    real.cluster.processes.append(plugin)
    def advertised() -> bool:
        plugin.check_alive()
        alloc = real.cluster.client().get(Node, node.name).status.allocatable or {}
        return alloc.get("nvidia.com/gpu") == "1"
    try:
        wait_until("the kubelet advertises nvidia.com/gpu from the device plugin", advertised, 30)
    except AssertionError as exc:
        said = [line for line in node.kubelet_log_text().splitlines()
                if "evice" in line and "plugin" in line.lower()][-8:]
        raise AssertionError(f"{exc}\ndevice plugin: {plugin.log_tail(10)}\n"
                             "kubelet: " + "\n".join(said)) from None
    # what NVIDIA's GPU feature discovery labels a node with (tessera-scheduler reads the model)
    gfd = {k: v for k, v in node_manifest(node.name, NodeShape(gpus=2, model="A100-40GB"))[
        "metadata"]["labels"].items() if k.startswith("nvidia.com/")}
    gfd["nvidia.com/cuda.driver.major"] = NEW_DRIVER.split(".")[0]
    real.cluster.client().patch(Node, node.name, {"metadata": {"labels": gfd}},
                                patch_type=PatchType.MERGE)
    stack = start_stack(real.cluster, gpus=2, webhook_args=(
        f"--library-host-dir={agent.root / 'isolation'}",
        f"--preload-host-file={agent.root / 'isolation' / 'ld.so.preload'}",
        f"--containers-host-dir={agent.containers_dir}",
        f"--loans-host-dir={agent.root / 'loans'}"),
        scheduler_args=(f"--reservation-image={PAUSE_IMAGE}",))
    try:
        yield WebhookPath(stack, plugin)
    finally:
        stack.stop()
        plugin.stop()
