"""Shares served by the smallest fitting MIG profile on Kubernetes (docs/mig.md): a share pod
that no shared GPU can hold is bound to a node labelled ``tessera.io/mig-serves-shares=true``
with the partition of the smallest profile that holds it (``tessera.io/mig-partition``, as for a
pod annotated with the profile), tessera-node makes it and writes its MIG UUID into the pod's
ConfigMap; no reservation pod. Without the label it waits. Real API server, the real scheduler
process, the real tessera-node on the fake NVML with its A100-40GB in MIG mode."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import (
    Container,
    HostPathVolumeSource,
    PodSpec,
    Toleration,
    Volume,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from tessera.core.mig import SERVES_SHARES
from tessera.kube import names
from tessera.node.containers import ShareDevice, read_share
from tessera.testing.cluster import TestCluster
from tessera.testing.node_agents import NodeAgents
from tests.kube.mig_nodes import mig_node_agents
from tests.kube.scheduler_env import (
    SchedulerEnv,
    bound,
    events,
    get_pod,
    reservations,
    scheduled_false,
)
from tests.waiting import wait_until

NODE = "migs-node-0"
TAINT = "tessera.io/migs-test"


@pytest.fixture(scope="module")
def mig_node(kube_cluster: TestCluster, kube_client: Client) -> Iterator[NodeAgents]:
    """One A100-40GB in MIG mode and no shared GPU, its tessera-node; not labelled yet
    (tests.kube.mig_nodes)."""
    with mig_node_agents(kube_cluster, kube_client, NODE, 230, TAINT) as agents:
        yield agents


def label(client: Client, value: str | None) -> None:
    client.patch(Node, NODE, {"metadata": {"labels": {SERVES_SHARES: value}}},
                 patch_type=PatchType.MERGE)


def share_pod(client: Client, ns: str, name: str, annotations: dict[str, str]) -> None:
    """A share pinned to the MIG node (its only GPU is in MIG mode: no shared GPU fits), with
    the isolation config key and mount the webhook gives a share (no webhook in this module)."""
    key = hashlib.sha256(name.encode()).hexdigest()[:16]
    client.create(Pod(
        metadata=ObjectMeta(name=name, namespace=ns,
                            annotations={**annotations, names.GPU_CONFIG_KEY: key}),
        spec=PodSpec(schedulerName=names.SCHEDULER_NAME, nodeSelector={
            "kubernetes.io/hostname": NODE},
            tolerations=[Toleration(key=TAINT, operator="Exists", effect="NoSchedule")],
            containers=[Container(name="main", image="example.invalid/cuda:12")],
            volumes=[Volume(name="tessera-gpu-config", hostPath=HostPathVolumeSource(
                path=f"/var/lib/tessera/containers/{key}/conf/main", type="Directory"))]),
    ))


def configmap(client: Client, ns: str, pod: str, key: str) -> str:
    def get() -> Any:
        try:
            cm = client.get(ConfigMap, f"{pod}-tessera-gpu", namespace=ns)
        except ApiError:
            return None
        return (cm.data or {}).get(key)
    return str(wait_until(f"{key} of {pod}", get))


def test_a_share_is_served_by_the_smallest_profile_only_on_labelled_nodes(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents) -> None:
    # Without the label: the share waits for a shared GPU, as before.
    share_pod(kube_client, project, "quarter", {names.GPU_PORTION: "0.25"})
    reason = wait_until("quarter waits", lambda: scheduled_false(kube_client, project, "quarter"))
    assert "MIG" not in reason, reason
    label(kube_client, "maybe")  # not true: logged by the scheduler, taken as false
    share_pod(kube_client, project, "mem5g", {names.GPU_MEMORY: "5G"})
    wait_until("mem5g waits", lambda: scheduled_false(kube_client, project, "mem5g"))
    wait_until("the bad label in the scheduler's log", lambda: (
        f"node {NODE} metadata.labels[{SERVES_SHARES}]: must be true or false (whether this "
        "node's GPUs in MIG mode may serve shares by the smallest fitting profile) (got "
        "'maybe'); its MIG GPUs do not serve shares") in env.log("scheduler-0") or None)
    pod = get_pod(kube_client, project, "quarter")
    assert pod.spec is not None and not pod.spec.nodeName
    assert names.MIG_PARTITION not in (pod.metadata.annotations or {} if pod.metadata else {})

    # With it: 0.25 is two of the eight memory slots, 1g.10gb; 5G (4768 MiB) fits 1g.5gb.
    label(kube_client, "true")
    q, m = bound(kube_client, project, "quarter", "mem5g")
    holds = {}
    for name, p in (("quarter", q), ("mem5g", m)):
        assert p.spec is not None and p.spec.nodeName == NODE
        ann = p.metadata.annotations if p.metadata and p.metadata.annotations else {}
        holds[name] = json.loads(ann[names.MIG_PARTITION])
        placement = json.loads(ann[names.PLACEMENT])
        assert placement["devices"] == [] and placement["gpus"] == pytest.approx(1 / 7, abs=1e-3)
        assert names.NODE_GPU_UUIDS not in ann
    assert holds["quarter"]["profile"] == "1g.10gb" and holds["mem5g"]["profile"] == "1g.5gb"
    assert holds["quarter"]["gpu"] == mig_node.agents[NODE].uuids[0]
    for name in ("quarter", "mem5g"):
        assert configmap(kube_client, project, name, "NVIDIA_VISIBLE_DEVICES").startswith("MIG-")
    # The isolation library's limit: a quarter of 40 GiB capped at the partition's 9856 MiB.
    assert configmap(kube_client, project, "quarter", "TESSERA_GPU_MEMORY_LIMIT") == \
        str(9856 * 2**20)
    assert reservations(kube_client, NODE) == []
    # tessera-node writes the share's isolation files with the partition as its device.
    uuid = configmap(kube_client, project, "quarter", "NVIDIA_VISIBLE_DEVICES")
    ann = q.metadata.annotations if q.metadata and q.metadata.annotations else {}
    key = ann[names.GPU_CONFIG_KEY]
    written = wait_until("the isolation files", lambda: read_share(
        mig_node.agents[NODE].containers_dir, key))
    assert written.devices == (ShareDevice(uuid, 9856 * 2**20, 9856 * 2**20),)
    assert (mig_node.agents[NODE].containers_dir / key / "conf" / "main").is_dir()
    said = wait_until("the Scheduled event", lambda: [
        e.message for e in events(kube_client, project, "quarter")
        if e.reason == "Scheduled" and e.message] or None)
    assert "served by MIG 1g.10gb on GPU" in said[0], said

    # A share no profile holds (more than the whole GPU) waits with the existing reasons.
    share_pod(kube_client, project, "huge", {names.GPU_MEMORY: "41Gi"})
    reason = wait_until("huge waits", lambda: scheduled_false(kube_client, project, "huge"))
    assert "MIG" not in reason, reason
    label(kube_client, None)
