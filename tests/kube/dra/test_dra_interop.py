"""Interop (issue 19, item 4; docs/dra.md): kube-scheduler v1.36.3 — no tessera-scheduler —
allocates claims for tessera's device classes against the ResourceSlice tessera-node published
(consumable capacity), and tessera-node's kubelet plugin prepares what it allocated with the
limit it consumed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod

from tessera.core.units import parse_memory
from tessera.isolation.config import CONFIG_NAME
from tessera.kube.claims import ResourceClaim, ours
from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2
from tessera.node.draplugin import registration_pb2_grpc as reg_grpc
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgent
from tests.kube.upstream_scheduler import kube_scheduler
from tests.waiting import wait_until

GIB = 2**30


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[TestCluster, NodeAgent, subprocess.Popen[bytes]]]:
    """A private cluster (kube-scheduler must place only this test's pods): one node of
    2 × A100-40GB with its tessera-node, and kube-scheduler with DRAConsumableCapacity."""
    c = TestCluster()
    c.start()
    try:
        (node,) = c.create_gpu_nodes(1, NodeShape(gpus=2, model="A100-40GB"), prefix="dra-")
        with kube_scheduler(c) as proc:
            yield c, c.node_agents[0].agents[node], proc
    finally:
        c.stop()


def claim(name: str, ns: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "share.gpu.tessera.io",
                "capacity": {"requests": {"memory": memory}}}}]}}}


def pod(name: str, ns: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def test_kube_scheduler_allocates_and_tessera_node_enforces(
        cluster: tuple[TestCluster, NodeAgent, subprocess.Popen[bytes]]) -> None:
    """Two claims of 15 GiB and 30 GiB on a node of 2 × A100-40GB: kube-scheduler places both
    pods on it with consumedCapacity on one device each, not both on one GPU (consumable
    capacity counted: 45 GiB do not fit in 40); tessera-node's plugin prepares each with the
    limit it consumed. A third of 30 GiB does not fit anywhere: Pending, nothing allocated."""
    c, agent, proc = cluster
    client: Client = c.client()
    ns = "default"
    for name, memory in (("small", "15Gi"), ("large", "30Gi")):
        client.create(codecs.from_dict(claim(name, ns, memory)))
        client.create(codecs.from_dict(pod(f"{name}-pod", ns, name)))

    def bound(name: str) -> Any:
        assert proc.poll() is None, "kube-scheduler exited"
        p = client.get(Pod, name, namespace=ns)
        return p if p.spec and p.spec.nodeName else None

    for name in ("small-pod", "large-pod"):
        got = wait_until(f"{name} bound by kube-scheduler", lambda n=name: bound(n), 60)
        assert got.spec.nodeName == agent.node
    claims = {n: client.get(ResourceClaim, n, namespace=ns).to_dict() for n in ("small", "large")}
    devices = {}
    for name, want in (("small", 15 * GIB), ("large", 30 * GIB)):
        st = claims[name]["status"]
        (r,) = st["allocation"]["devices"]["results"]
        assert (r["driver"], r["pool"]) == ("gpu.tessera.io", agent.node)
        assert parse_memory(r["consumedCapacity"]["memory"], "memory") == want
        assert r.get("shareID")  # kube-scheduler's, not tessera's
        assert not ours(claims[name])
        assert st["reservedFor"][0]["name"] == f"{name}-pod"
        devices[name] = r["device"]
    assert devices["small"] != devices["large"]  # 45 GiB do not fit in one GPU
    client.create(codecs.from_dict(claim("third", ns, "30Gi")))
    client.create(codecs.from_dict(pod("third-pod", ns, "third")))

    def unschedulable() -> str | None:
        p = client.get(Pod, "third-pod", namespace=ns)
        for cond in (p.status.conditions if p.status else None) or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                return cond.message or "?"
        return None

    msg = wait_until("third-pod unschedulable", unschedulable, 60)
    assert not client.get(Pod, "third-pod", namespace=ns).spec.nodeName, msg
    assert "allocation" not in (client.get(ResourceClaim, "third", namespace=ns).to_dict()
                                .get("status") or {})

    wait_until("the plugin's socket", agent.registration_socket.exists)
    with grpc.insecure_channel(f"unix://{agent.registration_socket}") as ch:
        endpoint = reg_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                         timeout=10).endpoint
    req = [dra_pb2.Claim(namespace=ns, name=n, uid=claims[n]["metadata"]["uid"])
           for n in ("small", "large")]
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        got = dra_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=req), timeout=10)
    for name, want in (("small", 15 * GIB), ("large", 30 * GIB)):
        uid = claims[name]["metadata"]["uid"]
        reply = got.claims[uid]
        assert reply.error == ""
        (d,) = reply.devices
        assert d.device_name == devices[name]
        index = int(devices[name][4:])
        conf = (agent.containers_dir / "claims" / uid / "conf" / CONFIG_NAME).read_text()
        assert f"device index=0 uuid={agent.uuids[index]} request={want} limit={want}" in conf
        spec = json.loads((agent.cdi_dir / f"gpu.tessera.io-{uid}.json").read_text())
        assert f"NVIDIA_VISIBLE_DEVICES={agent.uuids[index]}" in spec["containerEdits"]["env"]
