"""tessera-node on the test cluster: a real API server, kwok nodes, the kubelet pod-resources
double, one agent process per node on its own fake NVML machine."""

from __future__ import annotations

import contextlib
import json
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
        assert "Forbidden" not in agent.process.log_tail(200)
        assert "403" not in agent.process.log_tail(200)
    finally:
        for ns, name in ((SYSTEM_NS, f"res-{node}"), (kube_namespace, "ok"), (kube_namespace, "bad")):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, name, namespace=ns, grace_period=0)
        group.stop()
        kube_client.delete(Node, node)
