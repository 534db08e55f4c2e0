"""The admission webhook on the real API server: a real ``tessera-webhook`` process on loopback
(certificate from the harness CA), registered with the chart's own webhook configurations, and
running as the chart's ServiceAccount with only the chart's RBAC rules."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, PodBinding

from tessera.core.units import parse_memory
from tessera.kube import names
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    SYSTEM_NS,
    _cgpu,
    _seq,
    create,
    create_project_namespace,
    delete_pods,
    plain_pod,
    refused,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.waiting import wait_until

# The cGPU seed (shared/seeds/002), step 1, verbatim.
BINPACK_1 = """\
apiVersion: apps/v1
kind: StatefulSet

metadata:
  name: binpack-1
  labels:
    app: binpack-1

spec:
  # Set the number of pod replicas to 1. This makes it easier for you to check GPU memory allocation.
  replicas: 1
  serviceName: "binpack-1"
  podManagementPolicy: "Parallel"
  selector: # define how the deployment finds the pods it manages
    matchLabels:
      app: binpack-1

  template: # define the pods specifications
    metadata:
      labels:
        app: binpack-1
        # Declare 4 GPUs for the pod and specify that each GPU allocates 2 GiB of memory.
        aliyun.com/gpu-count: "4"
    spec:
      containers:
      - name: binpack-1
        image: registry.cn-shanghai.aliyuncs.com/tensorflow-samples/tensorflow-gpu-mem:10.0-runtime-centos7
        resources:
          limits:
            # The pod requests 8 GiB of GPU memory in total.
            aliyun.com/gpu-mem: 8
"""


@pytest.fixture(scope="module")
def webhook(kube_cluster: TestCluster) -> Iterator[local.LocalWebhook]:
    """The webhook as ServiceAccount tessera-system/tessera-webhook with the chart's RBAC, and
    the scheduler's RBAC (so tests can act as the scheduler)."""
    crds = [d for d in local.helm_template(include_crds=True)
            if d["kind"] == "CustomResourceDefinition"]
    local.apply(kube_cluster, crds)
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io")
    rbac = [d for d in local.helm_template() if d["kind"] in (
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-scheduler")
    kubeconfig = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-webhook")
    local.apply(kube_cluster, rbac)
    hook = local.start_webhook(kube_cluster, kubeconfig=kubeconfig)
    try:
        local.register(kube_cluster, hook)
        yield hook
    finally:
        local.unregister(kube_cluster)
        hook.stop()


@pytest.fixture(scope="module")
def team(webhook: local.LocalWebhook, kube_client: Client) -> Iterator[tuple[str, str]]:
    """A namespace owned by a Project (Run:ai's runai-team-a / team-a). Its pods are deleted
    afterwards: a scheduler started by a later test would otherwise place them."""
    ns, project = create_project_namespace(kube_client, "runai-team-a")
    wait_webhook_sees_project(kube_client, ns)
    yield ns, project
    delete_pods(kube_client, ns)


def env_of(container: Any) -> dict[str, Any]:
    return {e.name: e for e in container.env or []}


def assert_share_wiring(pod: Pod, container: str, project: str) -> None:
    assert pod.spec is not None and pod.metadata is not None
    assert pod.spec.schedulerName == "tessera"
    assert (pod.metadata.annotations or {})[names.PROJECT] == project
    cm = f"{pod.metadata.name}-tessera-gpu"
    for c in [*pod.spec.containers, *(pod.spec.initContainers or [])]:
        env = env_of(c)
        if c.name == container:
            ref = env["NVIDIA_VISIBLE_DEVICES"].valueFrom.configMapKeyRef
            assert (ref.name, ref.key, ref.optional) == (cm, "NVIDIA_VISIBLE_DEVICES", None)
            limit = env["TESSERA_GPU_MEMORY_LIMIT"]
            memory = (pod.metadata.annotations or {}).get(names.GPU_MEMORY_LIMIT) or \
                (pod.metadata.annotations or {}).get(names.GPU_MEMORY)
            if memory:  # a memory request: the same bytes on any GPU, given as a value
                assert limit.value == str(parse_memory(memory, "m")) and limit.valueFrom is None
            else:  # a portion: bytes depend on the GPU, from the scheduler's ConfigMap
                ref = limit.valueFrom.configMapKeyRef
                assert (ref.name, ref.key, ref.optional) == (cm, "TESSERA_GPU_MEMORY_LIMIT", None)
            mounts = {m.mountPath: m for m in c.volumeMounts or []}
            assert mounts["/etc/ld.so.preload"].name == "tessera-ld-so-preload"
            assert mounts["/usr/local/tessera"].readOnly is True
            assert mounts["/etc/tessera"].readOnly is True
        else:
            assert env["NVIDIA_VISIBLE_DEVICES"].value == "void"
    volumes = {v.name: v for v in pod.spec.volumes or []}
    assert volumes["tessera-isolation"].hostPath.path == "/var/lib/tessera/isolation"
    assert volumes["tessera-isolation"].hostPath.type == "Directory"
    assert volumes["tessera-ld-so-preload"].hostPath.path == "/var/lib/tessera/isolation/ld.so.preload"
    assert volumes["tessera-ld-so-preload"].hostPath.type == "File"


# ---- the seeds ---------------------------------------------------------------------------------
def test_runai_quickstart_pods_are_translated(kube_client: Client, team: tuple[str, str]) -> None:
    ns, project = team
    frac05 = runai_pod("frac05", {"gpu-fraction": "0.5"})
    frac05_2 = runai_pod("frac05-2", {"gpu-fraction": "0.5"})
    mem5g = runai_pod("mem5g", {"gpu-memory": "5000"})
    for manifest in (frac05, frac05_2, mem5g):
        create(kube_client, manifest, ns)
    for name in ("frac05", "frac05-2"):
        pod = kube_client.get(Pod, name, namespace=ns)
        ann = pod.metadata.annotations
        assert ann["gpu-fraction"] == "0.5" and ann[names.GPU_PORTION] == "0.5"
        assert names.GPU_MEMORY not in ann
        assert_share_wiring(pod, name, project)
    pod = kube_client.get(Pod, "mem5g", namespace=ns)
    assert pod.metadata.annotations[names.GPU_MEMORY] == "5000Mi"
    assert_share_wiring(pod, "mem5g", project)


def test_runai_dynamic_fraction_and_container_name(kube_client: Client,
                                                   team: tuple[str, str]) -> None:
    ns, project = team
    manifest = runai_pod("dyn", {"gpu-fraction": "0.25", "gpu-fraction-container-name": "gpu",
                                 "gpu-fraction-num-devices": "2"})
    manifest["spec"]["containers"] = [
        {"name": "sidecar", "image": "busybox"},
        {"name": "gpu", "image": "x", "env": [{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "0.8"}]},
    ]
    manifest["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    create(kube_client, manifest, ns)
    pod = kube_client.get(Pod, "dyn", namespace=ns)
    ann = pod.metadata.annotations
    assert (ann[names.GPU_PORTION], ann[names.GPU_PORTION_LIMIT], ann[names.GPU_DEVICES]) == (
        "0.25", "0.8", "2")
    assert_share_wiring(pod, "gpu", project)

    mem = runai_pod("dynmem", {"gpu-memory": "4000"},
                    env=[{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "8G"}])
    create(kube_client, mem, ns)
    ann = kube_client.get(Pod, "dynmem", namespace=ns).metadata.annotations
    assert (ann[names.GPU_MEMORY], ann[names.GPU_MEMORY_LIMIT]) == ("4000Mi", "8000000000")


def test_cgpu_binpack_statefulset_pod(kube_cluster: TestCluster, kube_client: Client,
                                      team: tuple[str, str]) -> None:
    """The seed's StatefulSet applied verbatim. There is no kube-controller-manager in the test
    cluster, so its pod is created here from the StatefulSet's template as the StatefulSet
    controller would (name <set>-<ordinal>, the set's pod labels, an owner reference, hostname
    and subdomain); the webhook sees the same object it would see from the controller."""
    ns, project = team
    path = kube_cluster.workdir / "binpack-1.yaml"  # type: ignore[operator]
    path.write_text(BINPACK_1)
    kube_cluster.kubectl("apply", "-n", ns, "-f", str(path))
    sts = kube_client.get(StatefulSet, "binpack-1", namespace=ns)
    template = sts.spec.template.to_dict()
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            **template.get("metadata", {}),
            "name": "binpack-1-0",
            "labels": {**template["metadata"]["labels"],
                       "statefulset.kubernetes.io/pod-name": "binpack-1-0",
                       "apps.kubernetes.io/pod-index": "0"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                 "name": "binpack-1", "uid": sts.metadata.uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {**template["spec"], "hostname": "binpack-1-0", "subdomain": "binpack-1"},
    }
    create(kube_client, pod, ns)
    got = kube_client.get(Pod, "binpack-1-0", namespace=ns)
    ann = got.metadata.annotations
    assert (ann[names.GPU_MEMORY], ann[names.GPU_DEVICES]) == ("2Gi", "4")
    assert got.metadata.labels["aliyun.com/gpu-count"] == "4"
    container = got.spec.containers[0]
    assert "aliyun.com/gpu-mem" not in ((container.resources.limits or {}) if container.resources
                                        else {}), "no node advertises aliyun.com/gpu-mem"
    env = env_of(container)
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"].value == "2"
    dev = env["ALIYUN_COM_GPU_MEM_DEV"].valueFrom.configMapKeyRef
    assert (dev.name, dev.key, dev.optional) == ("binpack-1-0-tessera-gpu", "ALIYUN_COM_GPU_MEM_DEV", True)
    assert_share_wiring(got, "binpack-1", project)


def test_generate_name_pod_gets_its_name_and_configmap(kube_client: Client,
                                                       team: tuple[str, str]) -> None:
    """Mutating webhooks run before the API server generates a name; the webhook names the pod
    so that the ConfigMap reference matches the name the scheduler will use."""
    ns, project = team
    manifest = runai_pod("x", {"gpu-fraction": "0.3"})
    del manifest["metadata"]["name"]
    manifest["metadata"]["generateName"] = "frac03-"
    pod = create(kube_client, manifest, ns)
    assert pod.metadata.name.startswith("frac03-") and len(pod.metadata.name) == len("frac03-") + 5
    assert_share_wiring(kube_client.get(Pod, pod.metadata.name, namespace=ns), "x", project)


def test_canonical_whole_gpu_and_cpu_pods(kube_client: Client, team: tuple[str, str]) -> None:
    ns, project = team
    whole = plain_pod("whole", schedulerName="tessera", containers=[
        {"name": "gpu", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        {"name": "side", "image": "busybox"}])
    create(kube_client, whole, ns)
    pod = kube_client.get(Pod, "whole", namespace=ns)
    assert pod.metadata.annotations[names.PROJECT] == project
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(pod.spec.containers[0])
    assert env_of(pod.spec.containers[1])["NVIDIA_VISIBLE_DEVICES"].value == "void"
    assert not pod.spec.volumes or all(v.hostPath is None for v in pod.spec.volumes)

    canonical = plain_pod("canon")
    canonical["metadata"]["annotations"] = {names.GPU_MEMORY: "10Gi", names.GPU_MEMORY_LIMIT: "20Gi"}
    create(kube_client, canonical, ns)
    pod = kube_client.get(Pod, "canon", namespace=ns)
    assert pod.metadata.annotations[names.GPU_MEMORY_LIMIT] == "20Gi"
    assert_share_wiring(pod, "main", project)


def test_gpu_operator_mig_resources_keep_their_devices(kube_client: Client,
                                                     team: tuple[str, str]) -> None:
    """A tessera-scheduled pod asking for nvidia.com/mig-3g.20gb: the device plugin gives that
    container its MIG device, so it gets no NVIDIA_VISIBLE_DEVICES=void (its sidecar does); a MIG
    resource together with a share is refused (docs/mig.md)."""
    ns, project = team
    mig = "nvidia.com/mig-3g.20gb"
    create(kube_client, plain_pod("mig", schedulerName="tessera", containers=[
        {"name": "gpu", "image": "x", "resources": {"limits": {mig: "1"}}},
        {"name": "side", "image": "busybox"}]), ns)
    pod = kube_client.get(Pod, "mig", namespace=ns)
    assert pod.metadata.annotations[names.PROJECT] == project
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(pod.spec.containers[0])
    assert env_of(pod.spec.containers[1])["NVIDIA_VISIBLE_DEVICES"].value == "void"
    both = plain_pod("mig-share", containers=[
        {"name": "main", "image": "x", "resources": {"limits": {mig: "1"}}}])
    both["metadata"]["annotations"] = {names.GPU_PORTION: "0.5"}
    message = refused(kube_client, both, ns)
    assert (f"containers[main].resources.limits.{mig}: give a MIG partition ({mig}) or a share "
            f"({names.GPU_PORTION}), not both") in message, message


def test_mig_profile_annotation(kube_client: Client, team: tuple[str, str]) -> None:
    """tessera.io/gpu-mig-profile (dynamic MIG, docs/mig.md): any spelling parse_profile takes
    becomes the canonical profile; the pod is tessera's and its first container reads
    NVIDIA_VISIBLE_DEVICES (the MIG UUID tessera-node writes) from the pod's ConfigMap, the
    others get void. An unknown profile, or a profile with a share, is refused naming the
    annotation."""
    ns, project = team
    pod = plain_pod("migp", containers=[{"name": "gpu", "image": "x"},
                                        {"name": "side", "image": "busybox"}])
    pod["metadata"]["annotations"] = {names.MIG_PROFILE: "MIG 3g.20gb"}
    create(kube_client, pod, ns)
    got = kube_client.get(Pod, "migp", namespace=ns)
    assert got.spec.schedulerName == "tessera"
    assert got.metadata.annotations[names.MIG_PROFILE] == "3g.20gb"
    assert got.metadata.annotations[names.PROJECT] == project
    ref = env_of(got.spec.containers[0])["NVIDIA_VISIBLE_DEVICES"].valueFrom.configMapKeyRef
    assert (ref.name, ref.key, ref.optional) == ("migp-tessera-gpu", "NVIDIA_VISIBLE_DEVICES", None)
    assert env_of(got.spec.containers[1])["NVIDIA_VISIBLE_DEVICES"].value == "void"
    field = f"metadata.annotations[{names.MIG_PROFILE}]"
    unknown = plain_pod("mig-unknown")
    unknown["metadata"]["annotations"] = {names.MIG_PROFILE: "5g.99gb"}
    message = refused(kube_client, unknown, ns)
    assert f"{field}: is not a MIG profile of any GPU tessera knows (1g.5gb, " in message, message
    assert "7g.40gb" in message and "3g.40gb" in message
    both = plain_pod("mig-share")
    both["metadata"]["annotations"] = {names.MIG_PROFILE: "3g.20gb", names.GPU_PORTION: "0.5"}
    message = refused(kube_client, both, ns)
    assert f"{field}: a MIG profile is the pod's whole GPU request; give it or a share" \
        in message, message


def test_operator_mig_resources_made_by_tessera_where_no_node_has_them(
        kube_client: Client, kube_cluster: TestCluster, team: tuple[str, str]) -> None:
    """``nvidia.com/mig-3g.20gb: 1`` (the GPU operator's spelling) where no node advertises that
    resource but a GPU in MIG mode has the profile (tessera-node's inventory): the webhook turns
    it into tessera.io/gpu-mig-profile, takes the resource out of the container (a kubelet
    would refuse it) and wires the partition's UUID to the container that asked. A profile a
    node advertises stays the operator's; more than one partition is refused naming the field."""
    import json

    from lightkube.resources.core_v1 import Node

    from tessera.testing.gpu_nodes import NodeShape, node_manifest

    ns, project = team
    node = node_manifest("opmig-node", NodeShape(gpus=1, model="A100-40GB"), index=230)
    node["metadata"].setdefault("annotations", {})[names.NODE_GPU_INVENTORY] = json.dumps(
        {"gpus": [{"index": 0, "uuid": "GPU-opmig", "model": "A100-40GB", "mig": True,
                   "partitions": []}]})
    for part in ("capacity", "allocatable"):
        node["status"][part][names.GPU_RESOURCE] = "0"
        node["status"][part]["nvidia.com/mig-1g.5gb"] = "2"  # static partitions of one profile
    node["spec"]["taints"] = [{"key": "tessera.io/opmig-test", "effect": "NoSchedule"}]
    kube_client.create(codecs.from_dict(node))
    asks = plain_pod("opmig", schedulerName="tessera", containers=[
        {"name": "side", "image": "busybox"},
        {"name": "gpu", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": "1"},
                                                     "requests": {"cpu": "100m"}}}])
    try:
        def rewritten() -> Any:
            got = kube_client.create(codecs.from_dict(copy.deepcopy(asks)), namespace=ns,
                                     dry_run=True)
            return got if names.MIG_PROFILE in (got.metadata.annotations or {}) else None
        wait_until("the webhook sees the MIG node", rewritten)
        create(kube_client, asks, ns)
        pod = kube_client.get(Pod, "opmig", namespace=ns)
        assert pod.spec.schedulerName == "tessera"
        assert pod.metadata.annotations[names.MIG_PROFILE] == "3g.20gb"
        assert pod.metadata.annotations[names.PROJECT] == project
        side, gpu = pod.spec.containers
        assert gpu.resources.limits is None and gpu.resources.requests == {"cpu": "100m"}
        ref = env_of(gpu)["NVIDIA_VISIBLE_DEVICES"].valueFrom.configMapKeyRef
        assert (ref.name, ref.key) == ("opmig-tessera-gpu", "NVIDIA_VISIBLE_DEVICES")
        assert env_of(side)["NVIDIA_VISIBLE_DEVICES"].value == "void"

        static = plain_pod("opmig-static", schedulerName="tessera", containers=[
            {"name": "gpu", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}])
        create(kube_client, static, ns)
        pod = kube_client.get(Pod, "opmig-static", namespace=ns)
        assert names.MIG_PROFILE not in (pod.metadata.annotations or {})
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/mig-1g.5gb": "1"}

        two = plain_pod("opmig-two", schedulerName="tessera", containers=[
            {"name": "gpu", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": "2"}}}])
        message = refused(kube_client, two, ns)
        assert ("spec.containers[gpu].resources.limits.nvidia.com/mig-3g.20gb: must be 1: "
                "tessera makes one MIG partition per pod") in message, message
        both = copy.deepcopy(asks)
        both["metadata"]["name"] = "opmig-both"
        both["metadata"]["annotations"] = {names.MIG_PROFILE: "1g.5gb"}
        message = refused(kube_client, both, ns)
        assert ("spec.containers[gpu].resources.limits.nvidia.com/mig-3g.20gb: give a MIG "
                "partition either as nvidia.com/mig-3g.20gb or as the annotation "
                f"{names.MIG_PROFILE}, not both") in message, message
    finally:
        kube_client.delete(Node, "opmig-node")
        for name in ("opmig", "opmig-static"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, name, namespace=ns, grace_period=0)
        # Later tests expect nvidia.com/mig-3g.20gb to be the operator's again.
        wait_until("the webhook forgets the MIG node", lambda: rewritten() is None or None)


def test_pods_without_gpu_are_not_touched(kube_client: Client, team: tuple[str, str]) -> None:
    ns, _ = team
    create(kube_client, plain_pod("cpu-only"), ns)
    pod = kube_client.get(Pod, "cpu-only", namespace=ns)
    assert pod.spec.schedulerName == "default-scheduler"
    assert not pod.spec.containers[0].env and not pod.metadata.annotations
    # NVIDIA_VISIBLE_DEVICES=void is allowed on any pod
    void = plain_pod("void", containers=[{"name": "main", "image": "busybox", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}])
    create(kube_client, void, ns)


# ---- refusals ------------------------------------------------------------------------------------
def _runai(ann: dict[str, str], **container: Any) -> dict[str, Any]:
    return runai_pod("bad", ann, **container)


def _canon(ann: dict[str, str], **container: Any) -> dict[str, Any]:
    pod = plain_pod("bad", containers=[{"name": "main", "image": "x", **container}])
    pod["metadata"]["annotations"] = ann
    return pod


INVALID = {
    "fraction-too-big": (_runai({"gpu-fraction": "1.5"}),
                         "metadata.annotations[gpu-fraction]: must be a decimal GPU portion in (0, 1)"),
    "fraction-not-a-number": (_runai({"gpu-fraction": "half"}),
                              "metadata.annotations[gpu-fraction]: must be a decimal GPU portion"),
    "runai-memory-with-suffix": (_runai({"gpu-memory": "5G"}),
                                 "metadata.annotations[gpu-memory]: must be a positive whole number of MiB"),
    "fraction-and-memory": (_runai({"gpu-fraction": "0.5", "gpu-memory": "5000"}),
                            "metadata.annotations[gpu-memory]: give gpu-fraction or gpu-memory, not both"),
    "fraction-limit-below-request": (_runai({"gpu-fraction": "0.5", "gpu-fraction-limit": "0.3"}),
                                     "metadata.annotations[gpu-fraction-limit]: must be at least the request 0.5"),
    "memory-limit-below-request": (_runai({"gpu-memory": "5000", "gpu-memory-limit": "4000"}),
                                   "metadata.annotations[gpu-memory-limit]: must be at least the request"),
    "env-limit-below-request": (
        _runai({"gpu-memory": "5000"}, env=[{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "4G"}]),
        "env[RUNAI_GPU_MEMORY_LIMIT]: must be at least the request"),
    "fraction-limit-without-fraction": (_runai({"gpu-memory": "5000", "gpu-fraction-limit": "0.8"}),
                                        "metadata.annotations[gpu-fraction-limit]: needs a gpu-fraction request"),
    "num-devices-alone": (_runai({"gpu-fraction-num-devices": "2"}),
                          "needs a gpu-fraction or gpu-memory annotation"),
    "more-devices-than-any-node": (_runai({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "16"}),
                                   "metadata.annotations[gpu-fraction-num-devices]: asks for 16 GPUs on one node; the largest node has 8"),
    "container-name-unknown": (_runai({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"}),
                               "metadata.annotations[gpu-fraction-container-name]: names no container"),
    "cgpu-not-divisible": (_cgpu("3", 8),
                           "spec.containers[main].resources.limits[aliyun.com/gpu-mem]: must divide evenly over aliyun.com/gpu-count=3"),
    "cgpu-count-not-a-number": (_cgpu("four", 8), "metadata.labels[aliyun.com/gpu-count]: must be a whole number"),
    "cgpu-label-without-memory": (_cgpu("4", None), "metadata.labels[aliyun.com/gpu-count]: needs aliyun.com/gpu-mem"),
    "cgpu-more-gpus-than-any-node": (_cgpu("16", 32), "metadata.labels[aliyun.com/gpu-count]: asks for 16 GPUs on one node"),
    "cgpu-more-memory-than-any-gpu": (_cgpu("1", 100),
                                      "spec.containers[main].resources.limits[aliyun.com/gpu-mem]: is larger than every GPU in the cluster"),
    "tessera-portion-zero": (_canon({names.GPU_PORTION: "0"}),
                             "metadata.annotations[tessera.io/gpu-portion]: must be a decimal GPU portion"),
    "tessera-portion-and-memory": (_canon({names.GPU_PORTION: "0.5", names.GPU_MEMORY: "5G"}),
                                   "metadata.annotations[tessera.io/gpu-memory]: give a GPU portion or a GPU memory amount, not both"),
    "tessera-memory-limit-below": (_canon({names.GPU_MEMORY: "10G", names.GPU_MEMORY_LIMIT: "5G"}),
                                   "metadata.annotations[tessera.io/gpu-memory-limit]: must be at least the request"),
    "visible-devices-by-hand": (
        plain_pod("bad", containers=[{"name": "main", "image": "x", "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
        "spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]: may only be void or none"),
    "visible-devices-by-hand-in-share": (
        _runai({"gpu-fraction": "0.5"}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-1234"}]),
        "env[NVIDIA_VISIBLE_DEVICES]: may only be void or none"),
    "isolation-env-by-hand": (
        _runai({"gpu-fraction": "0.5"}, env=[{"name": "TESSERA_GPU_MEMORY_LIMIT", "value": "80G"}]),
        "env[TESSERA_GPU_MEMORY_LIMIT]: is set by tessera"),
    # issue 14: envFrom could set the isolation variables env may not (finding 5)
    "isolation-env-from-configmap": (
        _runai({"gpu-fraction": "0.5"}, envFrom=[{"configMapRef": {"name": "limits"}}]),
        "spec.containers[bad].envFrom[0]: could set tessera's GPU isolation variables"),
    "isolation-env-from-secret-bad-prefix": (
        _runai({"gpu-fraction": "0.5"}, envFrom=[{"secretRef": {"name": "s"},
                                                  "prefix": "TESSERA_"}]),
        "spec.containers[bad].envFrom[0]: could set tessera's GPU isolation variables"),
    "isolation-fault-env-by-hand": (
        _runai({"gpu-fraction": "0.5"}, env=[{"name": "TESSERA_ISOLATION_FAULT",
                                              "value": "stall-in-lock"}]),
        "env[TESSERA_ISOLATION_FAULT]: is set by tessera"),
    # issue 14: quantities that once took a minute to convert (finding 2)
    "runai-memory-huge": (_runai({"gpu-memory": "9" * 5000}),
                          "metadata.annotations[gpu-memory]: must be a positive whole number of MiB"),
    "runai-memory-limit-env-huge": (
        _runai({"gpu-memory": "5000"}, env=[{"name": "RUNAI_GPU_MEMORY_LIMIT",
                                             "value": "1e999999"}]),
        "env[RUNAI_GPU_MEMORY_LIMIT]: is out of range"),
    "tessera-memory-huge": (_canon({names.GPU_MEMORY: "1e999999"}),
                            "metadata.annotations[tessera.io/gpu-memory]: is out of range"),
    "placement-by-hand": (_runai({"gpu-fraction": "0.5", names.PLACEMENT: '{"node":"n","devices":[0]}'}),
                          "metadata.annotations[tessera.io/placement]: is written by tessera only"),
    "placement-by-hand-without-share": (_canon({names.PLACEMENT: "{}"}),
                                        "metadata.annotations[tessera.io/placement]: is written by tessera only"),
    "privileged-share": (_runai({"gpu-fraction": "0.5"}, securityContext={"privileged": True}),
                         "securityContext.privileged: must not be true in a pod with a GPU share"),
    "mix-runai-and-tessera": (_runai({"gpu-fraction": "0.5", names.GPU_PORTION: "0.5"}),
                              "mixes GPU spellings"),
    "mix-runai-and-cgpu": (
        _runai({"gpu-fraction": "0.5"}, resources={"limits": {"aliyun.com/gpu-mem": 8}}),
        "mixes GPU spellings: Alibaba cGPU"),
    "mix-fraction-and-whole-gpus": (
        _runai({"gpu-fraction": "0.5"}, resources={"limits": {"nvidia.com/gpu": 1}}),
        "metadata.annotations[gpu-fraction]: give nvidia.com/gpu limits (whole GPUs)"),
    "other-scheduler": (
        {**_runai({"gpu-fraction": "0.5"}), "spec": {**_runai({})["spec"], "schedulerName": "volcano"}},
        "spec.schedulerName: a GPU-share pod is scheduled by tessera"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_request_is_refused_with_its_field(kube_client: Client, team: tuple[str, str],
                                                   case: str) -> None:
    manifest, expected = INVALID[case]
    message = refused(kube_client, manifest, team[0])
    assert expected in message, message
    assert "denied the request" in message


def test_env_from_with_a_safe_prefix_is_accepted(kube_client: Client,
                                                  team: tuple[str, str]) -> None:
    ns, _ = team
    pod = create(kube_client, runai_pod("envfrom-ok", {"gpu-fraction": "0.5"}, envFrom=[
        {"configMapRef": {"name": "app-settings"}, "prefix": "APP_"}]), ns)
    assert pod.metadata.name == "envfrom-ok"


def test_project_comes_from_the_namespace(kube_client: Client, team: tuple[str, str]) -> None:
    ns, project = team
    manifest = _runai({"gpu-fraction": "0.5", names.PROJECT: "someone-else"})
    message = refused(kube_client, manifest, ns)
    assert f"metadata.annotations[tessera.io/project]: is set from the namespace: {ns} belongs " \
           f"to project {project}" in message
    lonely = f"no-project-{next(_seq)}"
    kube_client.create(Namespace(metadata=ObjectMeta(name=lonely)))
    message = refused(kube_client, _runai({"gpu-fraction": "0.5"}), lonely)
    assert f"metadata.namespace: namespace {lonely} belongs to no tessera Project" in message
    create(kube_client, plain_pod("cpu"), lonely)  # pods without GPUs need no project


# ---- after creation: only the scheduler changes tessera's annotations --------------------------
def test_users_cannot_change_requests_or_placement(kube_cluster: TestCluster, kube_client: Client,
                                                   team: tuple[str, str]) -> None:
    ns, _ = team
    create(kube_client, runai_pod("upd", {"gpu-fraction": "0.5"}), ns)
    for key, value in ((names.GPU_PORTION, "0.9"), (names.PLACEMENT, '{"node":"x"}'),
                       ("gpu-fraction", "0.9")):
        with pytest.raises(ApiError) as info:
            kube_client.patch(Pod, "upd", {"metadata": {"annotations": {key: value}}}, namespace=ns)
        assert f"metadata.annotations[{key}]: cannot be changed after the pod is created" in \
            str(info.value.status.message)
    kube_client.patch(Pod, "upd", {"metadata": {"labels": {"team": "vision"}}}, namespace=ns)
    # The scheduler writes the placement with the binding (pods/binding copies the Binding's
    # annotations onto the pod), as its ServiceAccount with the chart's rules.
    scheduler = kube_cluster.service_account_client(SYSTEM_NS, "tessera-scheduler")
    node = kube_cluster.gpu_nodes[0]  # type: ignore[attr-defined]
    with contextlib.suppress(msgspec.ValidationError):  # lightkube cannot decode the Status reply
        scheduler.create(PodBinding(
            metadata=ObjectMeta(name="upd", namespace=ns,
                                annotations={names.PLACEMENT: '{"node":"n"}'}),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node)), "upd", namespace=ns)
    pod = kube_client.get(Pod, "upd", namespace=ns)
    assert pod.metadata.annotations[names.PLACEMENT] == '{"node":"n"}'
    assert pod.spec.nodeName == node
    with pytest.raises(ApiError) as info:
        kube_client.patch(Pod, "upd", {"metadata": {"annotations": {names.PLACEMENT: "{}"}}},
                          namespace=ns)
    assert "cannot be changed after the pod is created" in str(info.value.status.message)


def test_only_the_scheduler_writes_per_pod_configmaps(kube_cluster: TestCluster,
                                                      kube_client: Client,
                                                      team: tuple[str, str]) -> None:
    ns, _ = team
    forged = ConfigMap(metadata=ObjectMeta(name="victim-tessera-gpu"),
                       data={"NVIDIA_VISIBLE_DEVICES": "all"})
    with pytest.raises(ApiError) as info:
        kube_client.create(forged, namespace=ns)
    assert "is written by tessera's scheduler only" in str(info.value.status.message)
    scheduler = kube_cluster.service_account_client(SYSTEM_NS, "tessera-scheduler")
    labels = {names.MANAGED_BY: "tessera"}
    scheduler.create(ConfigMap(metadata=ObjectMeta(name="real-tessera-gpu", labels=labels),
                               data={"NVIDIA_VISIBLE_DEVICES": "GPU-1"}), namespace=ns)
    with pytest.raises(ApiError) as info:
        kube_client.patch(ConfigMap, "real-tessera-gpu",
                          {"data": {"NVIDIA_VISIBLE_DEVICES": "all"}}, namespace=ns)
    assert "is written by tessera's scheduler only" in str(info.value.status.message)
    kube_client.create(ConfigMap(metadata=ObjectMeta(name="ordinary"), data={"a": "b"}),
                       namespace=ns)


def test_webhook_manifests_match_the_rendered_chart(webhook: local.LocalWebhook,
                                                    kube_client: Client) -> None:
    """What the tests registered is the chart's configuration, only pointed at loopback."""
    docs = local.webhook_configurations(webhook.url, webhook.ca_bundle)
    in_cluster = [d for d in local.helm_template() if d["kind"] in local.WEBHOOK_KINDS]
    for mine, chart in zip(docs, in_cluster, strict=True):
        for a, b in zip(mine["webhooks"], chart["webhooks"], strict=True):
            a, b = dict(a), dict(b)
            assert "url" in a.pop("clientConfig") and "service" in b.pop("clientConfig")
            assert a == b
    assert yaml.safe_dump(docs)  # serialisable


def test_node_changes_reach_the_webhook(kube_cluster: TestCluster, kube_client: Client,
                                        team: tuple[str, str]) -> None:
    """The webhook's node view follows the cluster: a model no node has is refused, then
    admitted once such a node joins, then refused again when it leaves."""
    ns, _ = team
    from lightkube.resources.core_v1 import Node

    from tessera.testing.gpu_nodes import NodeShape

    manifest = _runai({"gpu-fraction": "0.5", names.GPU_MODEL: "L4-24GB"})
    assert "no GPU of model L4-24GB in the cluster" in refused(kube_client, manifest, ns)
    (node,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="L4-24GB"),
                                            prefix="l4-node-")
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                create(kube_client, {**manifest, "metadata": {**manifest["metadata"],
                                                              "name": "on-l4"}}, ns)
                break
            except ApiError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        kube_client.delete(Node, node)
    deadline = time.monotonic() + 15
    while "no GPU of model L4-24GB" not in _try(kube_client, manifest, ns):
        assert time.monotonic() < deadline, "the webhook did not see the node go"
        time.sleep(0.05)


def _try(client: Client, manifest: dict[str, Any], ns: str) -> str:
    try:
        create(client, manifest, ns)
    except ApiError as exc:
        return str(exc.status.message)
    client.delete(Pod, manifest["metadata"]["name"], namespace=ns, grace_period=0)
    return ""


def test_debug_containers_of_a_gpu_pod_get_no_gpu(kube_client: Client,
                                                   team: tuple[str, str]) -> None:
    """``kubectl debug`` adds an ephemeral container through pods/ephemeralcontainers: on a GPU
    pod it gets NVIDIA_VISIBLE_DEVICES=void, and asking for devices or privileges is refused."""
    from lightkube.resources.core_v1 import PodEphemeralcontainers

    ns, _ = team
    create(kube_client, runai_pod("dbg", {"gpu-fraction": "0.5"}), ns)

    def add(container: dict[str, Any]) -> None:
        pod = kube_client.get(Pod, "dbg", namespace=ns).to_dict()
        ephemeral = [*pod["spec"].get("ephemeralContainers", []), container]
        kube_client.patch(PodEphemeralcontainers, "dbg",
                          {"spec": {"ephemeralContainers": ephemeral}}, namespace=ns)

    add({"name": "debugger", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"})
    (got,) = kube_client.get(Pod, "dbg", namespace=ns).spec.ephemeralContainers
    assert env_of(got)["NVIDIA_VISIBLE_DEVICES"].value == "void"
    with pytest.raises(ApiError) as info:
        add({"name": "sneaky", "image": "cuda", "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})
    assert "spec.ephemeralContainers[sneaky].env[NVIDIA_VISIBLE_DEVICES]: must be void or none" \
        in str(info.value.status.message)
