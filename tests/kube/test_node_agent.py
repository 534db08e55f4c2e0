"""tessera-node on the test cluster: a real API server, kwok nodes, the kubelet pod-resources
double, one agent process per node on its own fake NVML machine."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgents, start_node_agents

SYSTEM_NS = "tessera-system"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def agents(kube_cluster: TestCluster) -> Iterator[NodeAgents]:
    nodes = kube_cluster.create_gpu_nodes(2, NodeShape(gpus=4, model="A100-40GB"),
                                          prefix="agent-node-")
    a = start_node_agents(kube_cluster, nodes)
    try:
        a.wait_ready()
        yield a
    finally:
        a.stop()


def reservation_pod(name: str, node: str) -> Any:
    return codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": SYSTEM_NS,
                     "labels": {"tessera.io/gpu-reservation": "true"}},
        "spec": {"nodeName": node, "containers": [{
            "name": "hold", "image": "tessera-node",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    })


def test_node_publishes_inventory_and_readiness(agents: NodeAgents, kube_client: Client) -> None:
    for name, agent in agents.agents.items():
        node = kube_client.get(Node, name)
        ann = node.metadata.annotations
        assert ann["tessera.io/node-ready"] == "true"
        assert ann["tessera.io/node-ready-reason"] == ""
        assert ann["tessera.io/gpu-uuids"] == ",".join(agent.uuids)
        inv = json.loads(ann["tessera.io/gpu-inventory"])
        assert inv["driver"] == "570.133.20" and inv["cuda"] == "12.8"
        assert [g["uuid"] for g in inv["gpus"]] == agent.uuids
        assert {g["model"] for g in inv["gpus"]} == {"A100-40GB"}
        assert {g["memory"] for g in inv["gpus"]} == {40960 * 2**20}
        assert len(inv["links"]) == 6
        # The kwok node already carries GFD labels: the agent keeps them.
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_reservation_pods_get_the_uuid_the_device_plugin_gave(
        agents: NodeAgents, kube_client: Client) -> None:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace
    with contextlib.suppress(ApiError):  # 409: there already
        kube_client.create(Namespace(metadata=ObjectMeta(name=SYSTEM_NS)))
    node = sorted(agents.agents)[0]
    names = [f"res-{node}-{i}" for i in range(3)]
    for n in names:
        kube_client.create(reservation_pod(n, node))

    def uuids() -> list[str] | None:
        got = [(kube_client.get(Pod, n, namespace=SYSTEM_NS).metadata.annotations or {})
               .get("tessera.io/gpu-uuid") for n in names]
        return got if all(got) else None  # type: ignore[return-value]

    got = wait_until("gpu-uuid on the reservation pods", uuids)
    assert len(set(got)) == 3
    assert set(got) <= set(agents.agents[node].uuids)
    for n in names:
        kube_client.delete(Pod, n, namespace=SYSTEM_NS)
