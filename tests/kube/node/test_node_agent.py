"""tessera-node on the test cluster: a real API server, kwok nodes, the kubelet pod-resources
double, one agent process per node on its own fake NVML machine."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Event, Node, Pod

from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgents
from tests.waiting import wait_until

SYSTEM_NS = "tessera-system"




@pytest.fixture(scope="module")
def agents(kube_cluster: TestCluster) -> Iterator[NodeAgents]:
    nodes = kube_cluster.create_gpu_nodes(2, NodeShape(gpus=4, model="A100-40GB"),
                                          prefix="agent-node-")
    agents = kube_cluster.node_agents[-1]
    try:
        yield agents
    finally:  # other modules place A100-40GB pods: leave no extra node behind
        agents.stop()
        client = kube_cluster.client()
        for n in nodes:
            client.delete(Node, n)


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


@pytest.fixture(scope="module")
def scheduler(kube_cluster: TestCluster) -> Iterator[None]:
    from tessera.testing.cluster import start_scheduler

    proc = start_scheduler(kube_cluster)
    assert proc is not None
    try:
        yield
    finally:
        proc.stop()
        kube_cluster.processes.remove(proc)


def scheduled_message(client: Client, ns: str, name: str) -> str:
    pod = client.get(Pod, name, namespace=ns)
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message or ""
    return ""


def test_shares_wait_for_a_ready_agent_and_say_so(scheduler: None, kube_cluster: TestCluster,
                                                   kube_client: Client, kube_namespace: str) -> None:
    """A GPU node whose tessera-node has not reported gets no share; the pending pod says why.
    Once the agent runs there, the pod is bound and its reservation pod gets the UUID the
    device plugin (the kubelet double) gave it, learned through pod-resources."""
    from lightkube.generic_resource import create_global_resource

    from tessera.testing.node_agents import start_node_agents

    project_res = create_global_resource("tessera.io", "v1alpha1", "Project", "projects")
    ns = kube_namespace
    kube_client.create(project_res(metadata={"name": ns},
                                   spec={"namespace": ns, "resources": {"gpu": {"deserved": 1}}}))
    (node,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"),
                                            prefix="no-agent-", node_agents=False)
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "half", "namespace": ns,
                     "annotations": {"tessera.io/gpu-portion": "0.5",
                                     "tessera.io/gpu-model": "T4-16GB"}},
        "spec": {"schedulerName": "tessera",
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12"}]},
    }))
    msg = wait_until("the pending reason", lambda: scheduled_message(kube_client, ns, "half"))
    assert f"not ready for GPU shares: {node} (tessera-node: no tessera-node has reported" in msg
    assert not kube_client.get(Pod, "half", namespace=ns).spec.nodeName

    agents = start_node_agents(kube_cluster, [node])
    kube_cluster.node_agents.append(agents)
    try:
        agents.wait_ready()
        pod = wait_until("half bound", lambda: (p := kube_client.get(Pod, "half", namespace=ns))
                         .spec.nodeName and p)
        assert pod.spec.nodeName == node
        uuids = pod.metadata.annotations["tessera.io/gpu-uuids"].split(",")
        assert len(uuids) == 1 and uuids[0] in agents.agents[node].uuids
        res = [p for p in kube_client.list(Pod, namespace=SYSTEM_NS,
                                           labels={"tessera.io/gpu-reservation": "true"})
               if p.spec.nodeName == node]
        assert [p.metadata.annotations["tessera.io/gpu-uuid"] for p in res] == uuids
    finally:  # other modules place T4 pods: leave no extra node behind
        kube_client.delete(Pod, "half", namespace=ns)
        agents.stop()
        kube_client.delete(Node, node)


def test_a_pod_naming_a_gpu_the_node_lacks_gets_an_event_and_no_files(
        agents: NodeAgents, kube_client: Client, kube_namespace: str) -> None:
    """What a ConfigMap naming a device the node does not have comes to: the placement's UUID
    is not in the node's NVML inventory. The agent refuses to write the files (so the container
    cannot start: its config mount is a hostPath of type Directory) and says why."""
    ns = kube_namespace
    node = sorted(agents.agents)[0]
    agent = agents.agents[node]
    key = "0123456789abcdef"
    placement = {"node": node, "devices": [0], "request": [2**30], "limit": [2**30],
                 "exclusive": False, "cpu": 0, "memory": 0}
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stray", "namespace": ns, "annotations": {
            "tessera.io/placement": json.dumps(placement), "tessera.io/gpu-uuids": "GPU-not-on-this-node",
            "tessera.io/gpu-config-key": key}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}],
                 "volumes": [{"name": "tessera-gpu-config", "hostPath": {
                     "path": f"/var/lib/tessera/containers/{key}/conf/main", "type": "Directory"}}]},
    }
    try:
        kube_client.create(codecs.from_dict(manifest))  # bound directly, no webhook in this module
        ev = wait_until("the Event", lambda: [e for e in events(kube_client, ns, "stray")
                                              if e.reason == "GPUIsolationFailed"])
        assert "GPU-not-on-this-node" in ev[0].message and "not started uncapped" in ev[0].message
        assert ev[0].type == "Warning" and ev[0].source.component == "tessera-node"
        time.sleep(1.0)  # two more syncs
        assert not (agent.containers_dir / key).exists()
        assert len([e for e in events(kube_client, ns, "stray")
                    if e.reason == "GPUIsolationFailed"]) == 1, "one Event, not one per sync"
    finally:
        kube_client.delete(Pod, "stray", namespace=ns, grace_period=0)


def events(client: Client, ns: str, name: str) -> list[Event]:
    return [e for e in client.list(Event, namespace=ns) if e.involvedObject.name == name]


def share_pod(name: str, ns: str, node: str, uuid: str, key: str) -> Any:
    """A share pod as the scheduler binds it and the webhook wires it (created bound)."""
    placement = {"node": node, "devices": [0], "request": [2**30], "limit": [2 * 2**30],
                 "exclusive": False, "cpu": 0, "memory": 0}
    return codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": {
            "tessera.io/placement": json.dumps(placement), "tessera.io/gpu-uuids": uuid,
            "tessera.io/gpu-config-key": key}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}],
                 "volumes": [{"name": "tessera-gpu-config", "hostPath": {
                     "path": f"/var/lib/tessera/containers/{key}/conf/main", "type": "Directory"}}]},
    })


def test_kill_9_and_restart_rereads_what_runs(agents: NodeAgents, kube_client: Client,
                                              kube_namespace: str) -> None:
    """The agent keeps no state of its own: killed with -9, a pod deleted and another created
    meanwhile, on restart it writes the new pod's files, removes the gone pod's, and reports
    the GPU of a reservation pod created while it was down."""
    ns = kube_namespace
    node = sorted(agents.agents)[1]
    agent = agents.agents[node]
    uuid = agent.uuids[3]
    old_key, new_key = "1" * 16, "2" * 16
    kube_client.create(share_pod("old", ns, node, uuid, old_key))
    old_conf = agent.containers_dir / old_key / "conf" / "main" / "gpu-isolation.conf"
    wait_until("old's files", old_conf.is_file)
    agent.kill9()
    kube_client.delete(Pod, "old", namespace=ns, grace_period=0)
    kube_client.create(share_pod("new", ns, node, uuid, new_key))
    kube_client.create(reservation_pod(f"res-restart-{node}", node))
    time.sleep(1.0)
    assert old_conf.is_file(), "nobody removes files while the agent is down"
    agent.restart()
    new_conf = agent.containers_dir / new_key / "conf" / "main" / "gpu-isolation.conf"
    wait_until("new's files", new_conf.is_file)
    wait_until("old's files removed", lambda: not (agent.containers_dir / old_key).exists())
    assert f"uuid={uuid} request={2**30} limit={2 * 2**30}" in new_conf.read_text()
    got = wait_until("the reservation pod's GPU", lambda: (kube_client.get(
        Pod, f"res-restart-{node}", namespace=SYSTEM_NS).metadata.annotations or {}).get(
        "tessera.io/gpu-uuid"))
    assert got in agent.uuids
    kube_client.delete(Pod, "new", namespace=ns, grace_period=0)
    kube_client.delete(Pod, f"res-restart-{node}", namespace=SYSTEM_NS, grace_period=0)


def test_agent_runs_with_the_charts_rbac(kube_cluster: TestCluster, kube_client: Client,
                                         kube_namespace: str) -> None:
    """As ServiceAccount tessera-system/tessera-node-agent with only the chart's rules: it
    publishes its Node, reports a reservation pod's GPU, writes a share's files and posts an
    Event for a bad one. A missing rule fails this test."""
    from tessera.testing import webhook as local
    from tessera.testing.node_agents import start_node_agents

    docs = [d for d in local.helm_template()
            if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
            and "tessera-node-agent" in d["metadata"]["name"]]
    assert {d["kind"] for d in docs} == {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    kube_cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)  # run alone: not made yet
    local.apply(kube_cluster, docs)
    sa = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-node-agent")
    (node,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="L4-24GB"),
                                            prefix="rbac-", node_agents=False)
    group = start_node_agents(kube_cluster, [node], kubeconfig=sa)
    try:
        group.wait_ready()
        agent = group.agents[node]
        kube_client.create(reservation_pod(f"res-{node}", node))
        wait_until("the reservation pod's GPU", lambda: (kube_client.get(
            Pod, f"res-{node}", namespace=SYSTEM_NS).metadata.annotations or {}).get(
            "tessera.io/gpu-uuid"))
        key = "3" * 16
        kube_client.create(share_pod("ok", kube_namespace, node, agent.uuids[0], key))
        wait_until("files", (agent.containers_dir / key / "conf" / "main").is_dir)
        kube_client.create(share_pod("bad", kube_namespace, node, "GPU-elsewhere", "4" * 16))
        wait_until("Event", lambda: [e for e in events(kube_client, kube_namespace, "bad")
                                     if e.reason == "GPUIsolationFailed"])
        wait_until("its ResourceSlice", lambda: resource_slice(kube_client, node))
        assert "not written" not in agent.process.log_tail(200)
        assert "Forbidden" not in agent.process.log_tail(200)
        # 403 as a word of its own (a status code), not digits inside a port (127.0.0.1:54033)
        # or a random temporary directory's name (/tmp/tessera-cluster-x403ab…)
        assert not re.search(r"(?<![\w.:/-])403(?!\w)", agent.process.log_tail(200))
    finally:
        for ns, name in ((SYSTEM_NS, f"res-{node}"), (kube_namespace, "ok"), (kube_namespace, "bad")):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, name, namespace=ns, grace_period=0)
        group.stop()
        kube_client.delete(Node, node)


# ---- DRA: the node's ResourceSlice (issue 19, docs/dra.md) -----------------------------------
def resource_slice(client: Client, node: str) -> Any:
    """The node's slice; None while there is none."""
    from tessera.node.resourceslice import ResourceSlice, slice_name
    try:
        return client.get(ResourceSlice, slice_name(node))
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


def test_node_publishes_its_resource_slice(agents: NodeAgents, kube_client: Client) -> None:
    """One ResourceSlice per node for gpu.tessera.io, accepted by the API server's validation
    (with DRAConsumableCapacity on: the capacity request policies survive the round trip), its
    devices what NVML on that node says."""
    from tessera.core import nvlink
    from tessera.node.resourceslice import DeviceClass
    for name, agent in agents.agents.items():
        node = kube_client.get(Node, name)
        ann = node.metadata.annotations
        inv = json.loads(ann["tessera.io/gpu-inventory"])
        headroom = [int(x) for x in ann["tessera.io/gpu-headroom"].split(",")]
        obj = wait_until(f"{name}'s slice", lambda n=name: resource_slice(kube_client, n))
        spec = obj.spec
        assert spec["driver"] == "gpu.tessera.io" and spec["nodeName"] == name
        assert spec["pool"]["name"] == name and spec["pool"]["resourceSliceCount"] == 1
        assert obj.metadata.ownerReferences[0].uid == node.metadata.uid
        devs = spec["devices"]
        assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(4)]
        assert [d["attributes"]["uuid"]["string"] for d in devs] == agent.uuids
        islands = nvlink.islands(4, [(lk["a"], lk["b"]) for lk in inv["links"] if lk["nvlink"]])
        for d, g, room, island in zip(devs, inv["gpus"], headroom, islands, strict=True):
            assert d["attributes"]["model"] == {"string": "A100-40GB"}
            assert d["attributes"]["memory"] == {"int": 40960 * 2**20}
            assert d["attributes"]["index"] == {"int": g["index"]}
            assert d["attributes"]["nvlinkIsland"] == {"int": island}
            assert d["allowMultipleAllocations"] is True
            mem = d["capacity"]["memory"]
            usable = (g["memory"] - room) // 2**20 * 2**20
            assert parse_quantity(mem["value"]) == usable
            assert parse_quantity(mem["requestPolicy"]["default"]) == usable
            assert {k: parse_quantity(v) for k, v in mem["requestPolicy"]["validRange"].items()
                    } == {"min": 2**20, "step": 2**20}
            assert parse_quantity(d["capacity"]["shares"]["value"]) == 100
    # The test cluster installs the chart's DeviceClasses.
    classes = {c.metadata.name for c in kube_client.list(DeviceClass)}
    assert {"gpu.tessera.io", "share.gpu.tessera.io"} <= classes


def parse_quantity(text: str) -> int:
    from tessera.core.units import parse_memory
    return parse_memory(text, "quantity")


def test_resource_slice_is_repaired_and_not_rewritten_on_restart(
        agents: NodeAgents, kube_client: Client) -> None:
    """Killed with -9; meanwhile its slice is edited (a device dropped) and an older agent's
    slice for the same node appears. On restart the agent replaces its slice (the pool's
    generation one up) and deletes the other; a second restart with nothing changed writes
    nothing."""
    from tessera.node.resourceslice import ResourceSlice
    node = sorted(agents.agents)[0]
    agent = agents.agents[node]
    before = wait_until("slice", lambda: resource_slice(kube_client, node))
    agent.kill9()
    edited = before.to_dict()
    edited["spec"]["devices"] = edited["spec"]["devices"][:2]
    edited["spec"]["pool"]["generation"] = generation = before.spec["pool"]["generation"] + 5
    kube_client.replace(codecs.from_dict(edited))
    stale = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-old-agent"},
             "spec": {**{k: edited["spec"][k] for k in ("driver", "nodeName", "devices")},
                      "pool": {"name": f"{node}-old", "generation": 1, "resourceSliceCount": 1}}}
    kube_client.create(codecs.from_dict(stale))
    agent.restart()
    fixed = wait_until("the slice repaired", lambda: (
        s := resource_slice(kube_client, node)) and len(s.spec["devices"]) == 4 and s)
    assert fixed.spec["pool"]["generation"] == generation + 1
    assert [d["attributes"]["uuid"]["string"] for d in fixed.spec["devices"]] == agent.uuids
    wait_until("the old agent's slice removed", lambda: f"{node}-old-agent" not in {
        s.metadata.name for s in kube_client.list(ResourceSlice)})

    agent.kill9()
    logged = agent.process.log_tail(10_000).count("ready=True")
    agent.restart()
    wait_until("a sync after the restart",
               lambda: agent.process.log_tail(10_000).count("ready=True") > logged)
    time.sleep(1.5)  # more syncs (interval 1 s at most): none of them may write the slice
    after = resource_slice(kube_client, node)
    assert after.metadata.resourceVersion == fixed.metadata.resourceVersion


def test_resource_slice_is_withdrawn_while_the_node_is_not_ready(
        agents: NodeAgents, kube_client: Client) -> None:
    """Fails closed: an agent that cannot enforce shares (its containers directory unusable)
    deletes its node's slice, so nothing allocates a GPU there; ready again, it publishes it."""
    node = sorted(agents.agents)[0]
    agent = agents.agents[node]
    wait_until("slice", lambda: resource_slice(kube_client, node))
    agent.kill9()
    aside = agent.containers_dir.with_name("containers.aside")
    agent.containers_dir.rename(aside)
    try:
        agent.containers_dir.write_text("not a directory")
        agent.restart()
        wait_until("not ready", lambda: (kube_client.get(Node, node).metadata.annotations or {})
                   .get("tessera.io/node-ready") == "false")
        wait_until("slice withdrawn", lambda: resource_slice(kube_client, node) is None)
    finally:
        agent.kill9()
        agent.containers_dir.unlink()
        aside.rename(agent.containers_dir)
        agent.restart()
    back = wait_until("slice back", lambda: resource_slice(kube_client, node))
    assert len(back.spec["devices"]) == 4
