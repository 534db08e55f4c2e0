"""Seeds end to end: webhook and scheduler both running as the chart's ServiceAccounts with only
the chart's RBAC. A Run:ai quickstart pod and the cGPU binpack-1 pod are admitted, translated,
scheduled and bound, and the per-pod ConfigMap the scheduler writes holds every key the
webhook wired into the containers."""

from __future__ import annotations

from pathlib import Path

from lightkube import Client
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from tessera.isolation.config import manual_environment
from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    _cgpu,
    create,
    create_project_namespace,
    delete_pods,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.waiting import wait_until


def bound(client: Client, ns: str, name: str) -> Pod:
    def check() -> Pod | None:
        pod = client.get(Pod, name, namespace=ns)
        return pod if pod.spec.nodeName else None
    pod: Pod = wait_until(f"{ns}/{name} bound", check)
    return pod


def configmap_refs(pod: Pod) -> list[tuple[str, str, bool]]:
    out = []
    for c in [*pod.spec.containers, *(pod.spec.initContainers or [])]:
        for e in c.env or []:
            ref = e.valueFrom.configMapKeyRef if e.valueFrom else None
            if ref is not None:
                out.append((ref.name, ref.key, bool(ref.optional)))
    return out


def check_configmap(client: Client, ns: str, pod: Pod) -> dict[str, str]:
    refs = configmap_refs(pod)
    assert refs, "the webhook wired no ConfigMap"
    (cm_name,) = {name for name, _, _ in refs}
    data = client.get(ConfigMap, cm_name, namespace=ns).data or {}
    missing = [key for _, key, optional in refs if not optional and key not in data]
    assert not missing, f"ConfigMap {cm_name} lacks {missing} (has {sorted(data)})"
    return data


def node_uuids(client: Client, node: str) -> list[str]:
    return client.get(Node, node).metadata.annotations[names.NODE_GPU_UUIDS].split(",")


def test_runai_quickstart_frac05_pair_runs_on_one_gpu(stack: TestCluster,
                                                      kube_client: Client) -> None:
    ns, _ = create_project_namespace(kube_client, "e2e-team-a")
    wait_webhook_sees_project(kube_client, ns)
    try:
        for name in ("frac05", "frac05-2"):
            create(kube_client, runai_pod(name, {"gpu-fraction": "0.5"}), ns)
        pods = [bound(kube_client, ns, n) for n in ("frac05", "frac05-2")]
        datas = [check_configmap(kube_client, ns, p) for p in pods]
        assert pods[0].spec.nodeName == pods[1].spec.nodeName
        assert datas[0]["NVIDIA_VISIBLE_DEVICES"] == datas[1]["NVIDIA_VISIBLE_DEVICES"]
        assert datas[0]["NVIDIA_VISIBLE_DEVICES"] in node_uuids(kube_client, pods[0].spec.nodeName)
        # Half of what the node's GPU can give (its memory less the headroom its agent published).
        node = kube_client.get(Node, pods[0].spec.nodeName).metadata
        memory = int(node.labels["nvidia.com/gpu.memory"]) * 2**20
        headroom = int(node.annotations[names.NODE_GPU_HEADROOM].split(",")[0])
        for data in datas:
            limit = data["TESSERA_GPU_MEMORY_LIMIT"]
            assert int(limit) == (memory - headroom) // 2
            # the value the container gets is one the isolation library accepts
            assert manual_environment(limit, library=Path("/lib/x.so"))["TESSERA_GPU_MEMORY_LIMIT"]
    finally:
        cleanup(kube_client, ns)


def test_cgpu_binpack_pod_gets_four_gpus_of_one_node(stack: TestCluster,
                                                     kube_client: Client) -> None:
    ns, _ = create_project_namespace(kube_client, "e2e-cgpu")
    wait_webhook_sees_project(kube_client, ns)
    try:
        manifest = _cgpu("4", 8)
        manifest["metadata"]["name"] = "binpack-1-0"
        manifest["spec"]["containers"][0]["name"] = "binpack-1"
        create(kube_client, manifest, ns)
        pod = bound(kube_client, ns, "binpack-1-0")
        data = check_configmap(kube_client, ns, pod)
        visible = data["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(set(visible)) == 4
        assert set(visible) <= set(node_uuids(kube_client, pod.spec.nodeName))
        # 2 GiB on each of the 4 GPUs, in the form the isolation library reads
        limit = {e.name: e for e in pod.spec.containers[0].env}["TESSERA_GPU_MEMORY_LIMIT"].value
        assert limit == str(2 * 2**30)
        assert manual_environment(limit, library=Path("/lib/x.so"))["TESSERA_GPU_MEMORY_LIMIT"]
        # seed 002: ALIYUN_COM_GPU_MEM_DEV, the whole GiB of each device (81559 MiB H100s: 79)
        assert data["ALIYUN_COM_GPU_MEM_DEV"] == str(81559 * 2**20 // 2**30)
    finally:
        cleanup(kube_client, ns)


def cleanup(client: Client, ns: str) -> None:
    delete_pods(client, ns)
