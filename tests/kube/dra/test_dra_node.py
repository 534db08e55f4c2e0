"""The kubelet DRA plugin as ``tessera-node run`` serves it (docs/dra.md): the real agent process
on its fake NVML machine, a gRPC client playing the kubelet against the sockets the agent made,
claims on the real API server."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import grpc
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from tessera.core.model import GpuRequest
from tessera.core.state import Placement
from tessera.isolation.config import CONFIG_NAME, LIMIT_ENV, REGION_NAME
from tessera.kube.claims import allocation_status
from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2
from tessera.node.draplugin import registration_pb2_grpc as reg_grpc
from tessera.node.resourceslice import ResourceSlice, slice_name
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgent, start_node_agents
from tests.kube.dra_docs import doc_claims
from tests.waiting import wait_until

GIB = 2**30


def agent_of(cluster: TestCluster) -> NodeAgent:
    agents = cluster.node_agents[0]
    agents.wait_ready()
    node = cluster.gpu_nodes[0]  # type: ignore[attr-defined]
    agent: NodeAgent = agents.agents[node]
    return agent


def get_info(agent: NodeAgent) -> Any:
    """GetInfo on the registration socket, as the kubelet does once it appears (a socket a
    killed agent left refuses connections until the new one replaces it)."""
    def ask() -> Any:
        if not agent.registration_socket.exists():
            return None
        with grpc.insecure_channel(f"unix://{agent.registration_socket}") as ch:
            try:
                return reg_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                             timeout=10)
            except grpc.RpcError:
                return None
    return wait_until("the plugin's registration", ask)


def prepare(endpoint: str, claims: list[Any], unprepare: bool = False) -> Any:
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        stub = dra_pb2_grpc.DRAPluginStub(ch)
        if unprepare:
            return stub.NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=10)
        return stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims),
                                         timeout=10)


def allocate(cluster: TestCluster, claim: dict[str, Any], node: str, device: int,
             pods: list[tuple[str, str]]) -> None:
    p = Placement(node, devices=(device,), request_bytes=(5 * GIB,), limit_bytes=(5 * GIB,))
    status = allocation_status(claim, "gpu", p, GpuRequest.of_memory(5 * GIB), pods)
    out = cluster.kubectl("patch", "resourceclaim", claim["metadata"]["name"], "-n",
                          claim["metadata"]["namespace"], "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": status}), check=False)
    assert out.returncode == 0, out.stderr


def test_tessera_node_serves_the_kubelet_plugin(kube_cluster: TestCluster, kube_client: Client,
                                                kube_namespace: str) -> None:
    """tessera-node run registers gpu.tessera.io in its plugins_registry directory; prepare of a
    claim allocated on its node writes the claim's config (the limit it consumed, the GPU by
    UUID, the headroom, the loans ledger), its region in the group of the pod that uses it, and
    a CDI spec that mounts them (the loans line with the pod's priority class); unprepare removes them; after kill -9 and a restart the plugin
    is registered again and prepares the same."""
    agent = agent_of(kube_cluster)
    info = get_info(agent)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.tessera.io", ["v1.DRAPlugin"])
    assert info.endpoint == str(agent.root / "plugins" / "gpu.tessera.io" / "dra.sock")

    ns = kube_namespace
    c = doc_claims()[0]  # five-gib
    c["metadata"]["namespace"] = ns
    claim = kube_client.create(codecs.from_dict(c)).to_dict()
    uid = claim["metadata"]["uid"]
    group = 4321 if os.geteuid() == 0 else os.getegid()
    pod = kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "user", "namespace": ns,
                     "annotations": {"tessera.io/priority-class": "inference"}},
        "spec": {"schedulerName": "nobody", "securityContext": {"fsGroup": group},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "five-gib"}],
                 "containers": [{"name": "main", "image": "cuda",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}}))
    assert isinstance(pod, Pod) and pod.metadata is not None
    allocate(kube_cluster, claim, agent.node, 1, [("user", str(pod.metadata.uid))])

    req = [dra_pb2.Claim(namespace=ns, name="five-gib", uid=uid)]
    got = prepare(info.endpoint, req).claims[uid]
    assert got.error == ""
    assert [(d.device_name, list(d.cdi_device_ids)) for d in got.devices] == [
        ("gpu-1", [f"gpu.tessera.io/claim={uid}-gpu-1"])]

    spec = json.loads((agent.cdi_dir / f"gpu.tessera.io-{uid}.json").read_text())
    env = spec["containerEdits"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={agent.uuids[1]}" in env
    assert "TESSERA_GPU_CONFIG=/etc/tessera/gpu-isolation.conf" in env
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    host = f"/var/lib/tessera/containers/claims/{uid}"  # the host's path (--containers-host-dir)
    assert mounts["/etc/tessera"]["hostPath"] == f"{host}/conf"
    assert "ro" in mounts["/etc/tessera"]["options"]
    assert mounts["/run/tessera"]["hostPath"] == f"{host}/region"
    assert mounts["/run/tessera-loans"]["hostPath"] == str(agent.root / "loans")
    assert mounts["/usr/local/tessera"]["hostPath"] == str(agent.library_dir)
    assert spec["devices"][0]["containerEdits"]["env"] == [f"{LIMIT_ENV}_0={5 * GIB}"]

    base = agent.containers_dir / "claims" / uid
    conf = (base / "conf" / CONFIG_NAME).read_text().splitlines()
    assert f"device index=0 uuid={agent.uuids[1]} request={5 * GIB} limit={5 * GIB}" in conf
    assert "region /run/tessera/gpu-usage.region" in conf
    overhead = int(next(line for line in conf if line.startswith("context-overhead")).split()[1])
    assert overhead > 0  # the GPU's headroom
    assert any(line.startswith(f"loans dir=/run/tessera-loans share={uid} priority=125 ")
               for line in conf), conf  # the pod's class, inference
    region = (base / "region").stat()
    assert (region.st_gid, stat.S_IMODE(region.st_mode)) == (group, 0o2770)
    assert (base / "region" / REGION_NAME).stat().st_gid == group

    assert prepare(info.endpoint, req, unprepare=True).claims[uid].error == ""
    assert not (agent.cdi_dir / f"gpu.tessera.io-{uid}.json").exists()
    assert not base.exists()

    agent.kill9()  # the sockets stay behind, as after a crash
    agent.restart()
    info2 = get_info(agent)
    assert info2.endpoint == info.endpoint
    kube_cluster.node_agents[0].wait_ready()
    got = wait_until("prepare after the restart",
                     lambda: (r := prepare(info.endpoint, req).claims[uid]).error == "" and r)
    assert [d.device_name for d in got.devices] == ["gpu-1"]
    assert (base / "conf" / CONFIG_NAME).read_text().splitlines() == conf
    prepare(info.endpoint, req, unprepare=True)


def test_no_dra_plugin_serves_no_socket_and_withdraws_the_slice(kube_cluster: TestCluster,
                                                                 kube_client: Client) -> None:
    """An agent with the plugin published the node's ResourceSlice; restarted with
    --no-dra-plugin, it serves no registration socket and deletes the slice (nothing on the node
    would prepare a claim allocated there)."""
    names = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="A100-40GB"),
                                          prefix="nodra-")
    node = names[0]
    first = kube_cluster.node_agents[-1]

    def slice_there() -> bool:
        try:
            kube_client.get(ResourceSlice, slice_name(node))
            return True
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise

    try:
        wait_until("the slice of the agent with the plugin", slice_there)
        first.stop()
        agents = start_node_agents(kube_cluster, names, extra_args=["--no-dra-plugin"])
        agents.wait_ready()
        agent = agents.agents[node]
        wait_until("the slice withdrawn", lambda: not slice_there())
        assert "DRA kubelet plugin off (--no-dra-plugin)" in (
            kube_cluster.workdir / "logs" / f"tessera-node-{node}.log").read_text()
        assert not agent.registration_socket.exists()
        agents.stop()
    finally:
        first.stop()
        kube_client.delete(Node, node)


def test_a_claims_compute_share_is_in_its_gpus_arbiter_when_prepared(
        kube_cluster: TestCluster, kube_client: Client, kube_namespace: str) -> None:
    """A share claim with ``capacity.requests.compute`` (docs/compute-share.md), allocated with
    ``consumedCapacity.compute``: prepare over the kubelet's gRPC writes its entry into the GPU's
    arbiter in the node's ledger directory and ``gpu-compute.conf`` beside its config (mounted at
    /etc/tessera), before answering, with the limit its opaque ComputeShare config sets (the
    real API server takes the config); unprepare removes the entry."""
    from tessera.isolation import arbiter

    agent = agent_of(kube_cluster)
    info = get_info(agent)
    ns = kube_namespace
    claim = kube_client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "timed", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "share.gpu.tessera.io",
            "capacity": {"requests": {"memory": "5Gi", "compute": "400m"}}}}],
            # the limit (burst ceiling): the driver's opaque config (tessera.core.compute_claim)
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.tessera.io", "parameters": {
                "apiVersion": "gpu.tessera.io/v1", "kind": "ComputeShare", "computeLimit": "700m"}}}]}}})).to_dict()
    uid = claim["metadata"]["uid"]
    p = Placement(agent.node, devices=(0,), request_bytes=(5 * GIB,), limit_bytes=(5 * GIB,),
                  compute=400_000)
    status = allocation_status(claim, "gpu", p, GpuRequest.of_memory(5 * GIB), [])
    out = kube_cluster.kubectl("patch", "resourceclaim", "timed", "-n", ns, "--subresource=status",
                               "--type=merge", "-p", json.dumps({"status": status}), check=False)
    assert out.returncode == 0, out.stderr
    req = [dra_pb2.Claim(namespace=ns, name="timed", uid=uid)]
    try:
        got = prepare(info.endpoint, req).claims[uid]
        assert got.error == ""
        conf = agent.containers_dir / "claims" / uid / "conf" / "gpu-compute.conf"
        assert conf.read_text().splitlines()[1:] == [
            f"arbiter /run/tessera-loans/compute/{agent.uuids[0]}.share", f"workload {uid}"]
        share = agent.root / "loans" / "compute" / f"{agent.uuids[0]}.share"
        (entry,) = [u for u in arbiter.usage(share) if u.key == uid]
        assert (round(entry.request, 3), round(entry.limit, 3)) == (0.4, 0.7)
        assert prepare(info.endpoint, req, unprepare=True).claims[uid].error == ""
        assert uid not in {u.key for u in arbiter.usage(share)}
    finally:
        prepare(info.endpoint, req, unprepare=True)
