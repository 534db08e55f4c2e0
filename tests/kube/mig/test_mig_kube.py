"""The GPU operator's MIG resources on Kubernetes (issue 20, item 4): a pod that tessera
schedules asking for ``nvidia.com/mig-3g.20gb: 1`` is placed on a node that advertises free ones
(the GPU operator's static MIG, mixed strategy), and waits with the reason naming the resource
when none is free or none exists. Real API server, real tessera-scheduler process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client, codecs
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements, Toleration
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape, node_manifest
from tests.kube.scheduler_env import (
    SchedulerEnv,
    bound,
    get_pod,
    make_project,
    scheduled_false,
)
from tests.waiting import wait_until

MIG_NODE = "mig-node-0"
TAINT = "tessera.io/mig-test"


@pytest.fixture(scope="module")
def mig_node(kube_cluster: TestCluster, kube_client: Client) -> Iterator[str]:
    """A node advertising two 3g.20gb partitions, tainted so other tests' pods stay off it."""
    manifest = node_manifest(MIG_NODE, NodeShape(gpus=0, model="A100-40GB"), index=200)
    for part in ("capacity", "allocatable"):
        manifest["status"][part]["nvidia.com/mig-3g.20gb"] = "2"
    manifest["spec"]["taints"] = [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]
    node = kube_client.create(codecs.from_dict(manifest))
    assert isinstance(node, Node) and node.status is not None
    assert (node.status.allocatable or {}).get("nvidia.com/mig-3g.20gb") == "2"
    kube_cluster.wait_nodes_ready([MIG_NODE])
    yield MIG_NODE
    kube_client.delete(Node, MIG_NODE)


def mig_pod(client: Client, ns: str, name: str, resource: str = "nvidia.com/mig-3g.20gb") -> None:
    client.create(Pod(
        metadata=ObjectMeta(name=name, namespace=ns),
        spec=PodSpec(schedulerName=names.SCHEDULER_NAME,
                     tolerations=[Toleration(key=TAINT, operator="Exists", effect="NoSchedule")],
                     containers=[Container(name="main", image="example.invalid/cuda:12",
                                           resources=ResourceRequirements(limits={resource: "1"}))]),
    ))


def test_mig_resources_are_placed_where_a_node_advertises_them(
        env: SchedulerEnv, kube_client: Client, project: str, mig_node: str) -> None:
    mig_pod(kube_client, project, "mig-a")
    mig_pod(kube_client, project, "mig-b")
    assert {p.spec.nodeName for p in bound(kube_client, project, "mig-a", "mig-b")
            if p.spec} == {mig_node}
    mig_pod(kube_client, project, "mig-c")
    full = wait_until("mig-c pending with a reason",
                      lambda: scheduled_false(kube_client, project, "mig-c"))
    assert "Insufficient nvidia.com/mig-3g.20gb" in full
    mig_pod(kube_client, project, "mig-none", "nvidia.com/mig-2g.10gb")
    none = wait_until("mig-none pending with a reason",
                      lambda: scheduled_false(kube_client, project, "mig-none"))
    assert ("Insufficient nvidia.com/mig-2g.10gb (no node has this MIG profile; MIG resources "
            "the nodes advertise: nvidia.com/mig-3g.20gb)") in none
    assert "(no node has" not in full
    kube_client.delete(Pod, "mig-a", namespace=project, grace_period=0)
    assert [p.spec.nodeName for p in bound(kube_client, project, "mig-c") if p.spec] == [mig_node]
    assert get_pod(kube_client, project, "mig-none").spec.nodeName is None


def test_mig_resources_count_in_the_projects_quota(
        env: SchedulerEnv, kube_client: Client, kube_namespace: str,
        mig_node: str) -> None:
    """The GPU operator's partitions count as their profile's fraction (3g.20gb = 3/7 of a GPU)
    in the project's quota: a project limited to 0.5 GPU runs one, the second waits with the
    limit's reason although the node has a free one."""
    ns = kube_namespace
    make_project(kube_client, ns, ns, deserved=0.5, limit=0.5)
    mig_pod(kube_client, ns, "q-a")
    bound(kube_client, ns, "q-a")
    mig_pod(kube_client, ns, "q-b")
    why = wait_until("q-b pending", lambda: scheduled_false(kube_client, ns, "q-b"))
    assert f"project {ns} is at its limit of 0.5 GPU: 0.43 in use, this needs 0.43 more" in why, why
    for pod in ("q-a", "q-b"):
        kube_client.delete(Pod, pod, namespace=ns, grace_period=0)
