"""tessera-scheduler end to end on the real API server (etcd + kube-apiserver + kwok).

The scheduler runs as a real process under its own ServiceAccount with exactly the RBAC rules
of deploy/rbac.yaml; the simulated GPU status writer plays the node agent for reservation pods.
Tests that need a full or private set of GPUs create their own nodes of a GPU model nobody
else uses and ask for that model (``tessera.io/gpu-model``), since all tests share one cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from tessera.core.usage import UsagePolicy, decayed_usage
from tessera.core.usage_history import UsageHistory
from tessera.core.usage_saved import restore
from tessera.isolation.config import manual_environment
from tessera.kube import names
from tessera.kube import usage_history_store as history_store
from tessera.kube.objects import PodGroupResource, ProjectResource
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tests.kube.scheduler_env import (
    H100_BYTES,
    ROOT,
    SchedulerEnv,
    bound,
    claim_status,
    configmap_data,
    events,
    get_pod,
    make_claim,
    make_claim_pod,
    make_pod,
    make_project,
    placement,
    reservations,
    scheduled_false,
    uuids,
)
from tests.shares import share
from tests.waiting import wait_until


def test_claims_are_placed_and_allocated_before_binding(kube_client: Client, project: str
                                                        ) -> None:
    """5 GiB of one GPU and 2 whole GPUs asked with ResourceClaims: placed by the same core
    (the placement annotation says so), each claim's status.allocation (device, pool,
    consumedCapacity, shareID, node selector) and reservedFor written for the pod; when the
    pod goes, its claim is deallocated."""
    from tessera.core.units import parse_memory
    ns = project
    make_claim(kube_client, ns, "five-gib", "share.gpu.tessera.io", capacity={"memory": "5Gi"})
    make_claim(kube_client, ns, "two-whole", "gpu.tessera.io", count=2)
    make_claim_pod(kube_client, ns, "share", "five-gib")
    make_claim_pod(kube_client, ns, "whole", "two-whole")
    share_pod, whole_pod = bound(kube_client, ns, "share", "whole")
    p = placement(share_pod)
    assert p["request"] == [5 * 2**30] and not p["exclusive"]
    # No reservation pod, no ConfigMap: the claim's allocation holds the GPU and the kubelet
    # plugin's CDI edits give the container its GPU and limit.
    assert not {names.NODE_GPU_UUIDS, names.CONFIGMAP} & set(share_pod.metadata.annotations)
    st = claim_status(kube_client, ns, "five-gib")
    (result,) = st["allocation"]["devices"]["results"]
    assert result["driver"] == "gpu.tessera.io" and result["request"] == "gpu"
    assert result["pool"] == share_pod.spec.nodeName
    assert result["device"] == f"gpu-{p['devices'][0]}"
    assert parse_memory(result["consumedCapacity"]["memory"], "m") == 5 * 2**30
    assert result["shareID"]
    assert st["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"] == [share_pod.spec.nodeName]
    assert st["reservedFor"] == [{"resource": "pods", "name": "share",
                                  "uid": share_pod.metadata.uid}]
    w = placement(whole_pod)
    assert w["exclusive"] and len(w["devices"]) == 2
    results = claim_status(kube_client, ns, "two-whole")["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == [f"gpu-{d}" for d in w["devices"]]
    assert {r["consumedCapacity"]["shares"] for r in results} == {"100"}
    # The pod goes: its claim is deallocated; the other claim keeps its allocation.
    kube_client.delete(Pod, "share", namespace=ns, grace_period=0)
    wait_until("five-gib deallocated", lambda: "allocation" not in claim_status(
        kube_client, ns, "five-gib"))
    assert "reservedFor" not in claim_status(kube_client, ns, "five-gib")
    assert "allocation" in claim_status(kube_client, ns, "two-whole")


def test_bad_claims_leave_the_pod_pending_with_the_reason(kube_client: Client, project: str
                                                          ) -> None:
    ns = project
    make_claim(kube_client, ns, "huge", "share.gpu.tessera.io", capacity={"memory": "500Gi"})
    make_claim(kube_client, ns, "nv", "gpu.nvidia.com")
    make_claim(kube_client, ns, "ok", "share.gpu.tessera.io", capacity={"memory": "1Gi"})
    make_claim(kube_client, ns, "whole-cap", "gpu.tessera.io", capacity={"memory": "1Gi"})
    make_claim_pod(kube_client, ns, "too-big", "huge")
    make_claim_pod(kube_client, ns, "mixed", "ok", "nv")
    make_claim_pod(kube_client, ns, "missing", "nowhere")
    make_claim_pod(kube_client, ns, "whole-with-capacity", "whole-cap")
    want = {"too-big": "500", "mixed": "mixes gpu.tessera.io device classes with gpu.nvidia.com",
            "missing": "resourceclaim nowhere: not found",
            "whole-with-capacity": "gives whole GPUs"}
    for pod, words in want.items():
        msg = wait_until(f"{pod}'s reason", lambda p=pod: scheduled_false(kube_client, ns, p))
        assert words in msg, msg
        assert not get_pod(kube_client, ns, pod).spec.nodeName
    for c in ("huge", "ok", "whole-cap"):
        assert "allocation" not in claim_status(kube_client, ns, c)


def test_claims_count_against_the_projects_quota(env: SchedulerEnv, kube_client: Client,
                                                  kube_namespace: str) -> None:
    """A project limited to 1 GPU: a whole-GPU claim pod runs, a second waits on the limit (the
    claim's request is charged as an ordinary one), and runs once the first is gone."""
    ns = kube_namespace
    make_project(kube_client, ns, ns, deserved=1, limit=1)
    for n in ("one", "two"):
        make_claim(kube_client, ns, n, "gpu.tessera.io")
    make_claim_pod(kube_client, ns, "first", "one")
    bound(kube_client, ns, "first")
    make_claim_pod(kube_client, ns, "second", "two")
    msg = wait_until("second's reason", lambda: scheduled_false(kube_client, ns, "second"))
    assert "limit" in msg, msg
    assert not get_pod(kube_client, ns, "second").spec.nodeName
    kube_client.delete(Pod, "first", namespace=ns, grace_period=0)
    bound(kube_client, ns, "second")
    kube_client.delete(Pod, "second", namespace=ns, grace_period=0)


def test_a_claim_shared_by_pods_is_allocated_once_and_charged_once(
        env: SchedulerEnv, kube_client: Client, kube_namespace: str) -> None:
    """Three pods name one whole-GPU claim in a project limited to 1 GPU: the claim is
    allocated once, the pods run on its node and are all in its reservedFor, and the project
    is charged 1 GPU (a pod of a second claim waits on the limit). The first pod goes: it
    leaves reservedFor, the claim keeps its GPU and its charge (the second claim still waits).
    All go: the claim is deallocated and the other pod runs."""
    ns = kube_namespace
    make_project(kube_client, ns, ns, deserved=1, limit=1)
    make_claim(kube_client, ns, "shared", "gpu.tessera.io")
    for n in ("a", "b", "c"):
        make_claim_pod(kube_client, ns, n, "shared")
    pods = bound(kube_client, ns, "a", "b", "c")
    assert len({p.spec.nodeName for p in pods}) == 1
    st = claim_status(kube_client, ns, "shared")
    (result,) = st["allocation"]["devices"]["results"]
    assert result["pool"] == pods[0].spec.nodeName
    assert sorted(r["uid"] for r in st["reservedFor"]) == sorted(p.metadata.uid for p in pods)
    charged = [p for p in pods if placement(p)["devices"]]
    assert len(charged) == 1 and placement(charged[0])["exclusive"]
    assert f"gpu-{placement(charged[0])['devices'][0]}" == result["device"]
    make_claim(kube_client, ns, "other", "gpu.tessera.io")
    make_claim_pod(kube_client, ns, "d", "other")
    msg = wait_until("d's reason", lambda: scheduled_false(kube_client, ns, "d"))
    assert "limit" in msg, msg
    first = charged[0].metadata.name
    kube_client.delete(Pod, first, namespace=ns, grace_period=0)
    rest = sorted(p.metadata.uid for p in pods if p.metadata.name != first)
    wait_until("the gone pod out of reservedFor", lambda: sorted(
        r["uid"] for r in claim_status(kube_client, ns, "shared").get("reservedFor", [])) == rest)
    assert claim_status(kube_client, ns, "shared")["allocation"] == st["allocation"]
    # A pod that joins now is placed by a cycle that also saw d: d still waits (the claim's
    # GPU is charged to a pod that holds it now).
    make_claim_pod(kube_client, ns, "e", "shared")
    (e,) = bound(kube_client, ns, "e")
    assert e.spec.nodeName == pods[0].spec.nodeName
    assert not get_pod(kube_client, ns, "d").spec.nodeName
    assert "limit" in (scheduled_false(kube_client, ns, "d") or "")
    for p in [*pods, e]:
        if p.metadata.name != first:
            kube_client.delete(Pod, p.metadata.name, namespace=ns, grace_period=0)
    wait_until("shared deallocated", lambda: "allocation" not in claim_status(
        kube_client, ns, "shared"))
    bound(kube_client, ns, "d")
    kube_client.delete(Pod, "d", namespace=ns, grace_period=0)


def test_claim_template_pod_waits_for_its_claim_then_is_placed(kube_client: Client,
                                                               project: str) -> None:
    """A pod naming a ResourceClaimTemplate waits, saying for what, until its claim exists and
    is recorded in status.resourceClaimStatuses — the job of kube-controller-manager's
    resourceclaim controller, which the test cluster does not run, so the test does it here
    (as kwok stands in for kubelets) — then it is placed and the made claim allocated."""
    ns = project
    kube_client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "three-gib", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "share.gpu.tessera.io",
            "capacity": {"requests": {"memory": "3Gi"}}}}]}}}}))
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "templated", "namespace": ns},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "three-gib"}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}}))
    msg = wait_until("the reason", lambda: scheduled_false(kube_client, ns, "templated"))
    assert "waiting for the ResourceClaim of template three-gib" in msg, msg
    # What the resourceclaim controller does: the claim from the template, owned by the pod,
    # and its name in the pod's status.
    pod = get_pod(kube_client, ns, "templated")
    kube_client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "templated-gpu-x1y2z", "namespace": ns,
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "templated",
                                          "uid": pod.metadata.uid, "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "share.gpu.tessera.io",
            "capacity": {"requests": {"memory": "3Gi"}}}}]}}}))
    kube_client.patch(Pod.Status, "templated", {"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "templated-gpu-x1y2z"}]}}, namespace=ns,
        patch_type=PatchType.MERGE)
    (placed,) = bound(kube_client, ns, "templated")
    assert placement(placed)["request"] == [3 * 2**30]
    st = claim_status(kube_client, ns, "templated-gpu-x1y2z")
    assert st["reservedFor"][0]["uid"] == placed.metadata.uid


# ---- the seed scenarios ------------------------------------------------------------------------
def test_frac05_and_frac03_share_one_gpu_with_one_reservation_pod(
    kube_client: Client, project: str
) -> None:
    ns = project
    make_pod(kube_client, ns, "frac05", {names.GPU_PORTION: "0.5"}, model="H100-80GB")
    make_pod(kube_client, ns, "frac03", {names.GPU_PORTION: "0.3"}, model="H100-80GB")
    a, b = bound(kube_client, ns, "frac05", "frac03")
    pa, pb = placement(a), placement(b)
    assert pa["node"] == pb["node"] and pa["devices"] == pb["devices"] and len(pa["devices"]) == 1
    assert uuids(a) == uuids(b)
    node, device = pa["node"], pa["devices"][0]
    holders = [r for r in reservations(kube_client, node)
               if r.metadata and r.metadata.labels
               and r.metadata.labels[names.RESERVATION_DEVICE] == str(device)]
    assert len(holders) == 1, "one reservation pod holds the shared GPU"
    res = holders[0]
    assert res.spec is not None and res.spec.containers[0].resources is not None
    assert res.spec.containers[0].resources.limits == {names.GPU_RESOURCE: "1"}
    assert res.metadata is not None and res.metadata.annotations is not None
    assert res.metadata.annotations[names.GPU_UUID] == uuids(a)[0]
    data = configmap_data(kube_client, ns, "frac05")
    assert data["NVIDIA_VISIBLE_DEVICES"] == uuids(a)[0]
    assert data["TESSERA_GPU_MEMORY_REQUEST"] == str(share(0.5, "H100-80GB", H100_BYTES))
    assert data["TESSERA_GPU_MEMORY_LIMIT"] == str(share(0.5, "H100-80GB", H100_BYTES))
    assert configmap_data(kube_client, ns, "frac03")["TESSERA_GPU_MEMORY_REQUEST"] == str(
        share(0.3, "H100-80GB", H100_BYTES))
    # Project status is written back.
    def status() -> dict[str, Any] | None:
        st = kube_client.get(ProjectResource, ns).get("status") or {}
        return st if st.get("allocated", {}).get("gpu") == pytest.approx(0.8, abs=1e-3) else None

    st = wait_until("project status", status)
    assert st["requested"]["gpu"] == pytest.approx(0.8, abs=1e-3)
    assert st["fairShare"]["gpu"] >= 0.8
    # Deleting both tenants deletes the reservation pod.
    for name in ("frac05", "frac03"):
        kube_client.delete(Pod, name, namespace=ns, grace_period=0)
    wait_until("reservation pod deleted", lambda: not [
        r for r in reservations(kube_client, node)
        if r.metadata and r.metadata.name == res.metadata.name])  # type: ignore[union-attr]


def test_two_halves_fill_one_gpu(kube_client: Client, project: str) -> None:
    ns = project
    make_pod(kube_client, ns, "frac05", {names.GPU_PORTION: "0.5"}, model="H100-80GB")
    make_pod(kube_client, ns, "frac05-2", {names.GPU_PORTION: "0.5"}, model="H100-80GB")
    a, b = bound(kube_client, ns, "frac05", "frac05-2")
    assert placement(a)["node"] == placement(b)["node"]
    assert uuids(a) == uuids(b)


def test_gpu_memory_5g(kube_client: Client, project: str) -> None:
    ns = project
    make_pod(kube_client, ns, "mem5g", {names.GPU_MEMORY: "5G"}, model="H100-80GB")
    (pod,) = bound(kube_client, ns, "mem5g")
    assert placement(pod)["request"] == [5 * 10**9]
    data = configmap_data(kube_client, ns, "mem5g")
    assert data["TESSERA_GPU_MEMORY_REQUEST"] == "5000000000"
    assert data["TESSERA_GPU_MEMORY_LIMIT"] == "5000000000"
    assert data["NVIDIA_VISIBLE_DEVICES"] == uuids(pod)[0]


def test_four_gpus_of_2gib_on_one_node(kube_client: Client, project: str) -> None:
    ns = project
    make_pod(kube_client, ns, "multi", {names.GPU_MEMORY: "2Gi", names.GPU_DEVICES: "4"},
             model="H100-80GB")
    (pod,) = bound(kube_client, ns, "multi")
    pl = placement(pod)
    assert len(set(pl["devices"])) == 4 and pl["request"] == [2 * 2**30] * 4
    ids = uuids(pod)
    assert len(set(ids)) == 4
    node = pl["node"]
    on_node = {r.metadata.annotations.get(names.GPU_UUID) for r in reservations(kube_client, node)
               if r.metadata and r.metadata.annotations}
    assert set(ids) <= on_node
    assert configmap_data(kube_client, ns, "multi")["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)


def test_multi_device_portion_limit_is_one_value_the_isolation_library_reads(
    kube_client: Client, project: str
) -> None:
    ns = project
    make_pod(kube_client, ns, "multiq", {names.GPU_PORTION: "0.25", names.GPU_DEVICES: "2"},
             model="H100-80GB")
    (pod,) = bound(kube_client, ns, "multiq")
    assert len(set(placement(pod)["devices"])) == 2
    data = configmap_data(kube_client, ns, "multiq")
    share_bytes = share(0.25, "H100-80GB", H100_BYTES)
    assert data["TESSERA_GPU_MEMORY_LIMIT"] == str(share_bytes)
    assert data["TESSERA_GPU_MEMORY_LIMITS"] == f"{share_bytes},{share_bytes}"
    env = manual_environment(data["TESSERA_GPU_MEMORY_LIMIT"], library=Path("/lib/x.so"))
    assert env["TESSERA_GPU_MEMORY_LIMIT"] == str(share_bytes)


def test_gang_of_four_all_or_nothing(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    ns = project
    kube_cluster.create_gpu_nodes(2, NodeShape(gpus=2, model="L4-24GB"), prefix="gang-l4-")
    kube_client.create(PodGroupResource(metadata=ObjectMeta(name="gang", namespace=ns),
                                        spec={"minMember": 4}))
    for i in range(3):
        make_pod(kube_client, ns, f"w{i}", gpus=1, model="L4-24GB", group="gang")
    msg = wait_until("gang waits", lambda: scheduled_false(kube_client, ns, "w0"))
    assert "needs 4 pods" in msg
    assert not any(get_pod(kube_client, ns, f"w{i}").spec.nodeName for i in range(3))  # type: ignore[union-attr]
    make_pod(kube_client, ns, "w3", gpus=1, model="L4-24GB", group="gang")
    pods = bound(kube_client, ns, "w0", "w1", "w2", "w3")
    assert {p.spec.nodeName for p in pods} <= {"gang-l4-0", "gang-l4-1"}  # type: ignore[union-attr]
    # A gang of 2 more cannot fit on the 4 busy L4s: neither of its pods starts.
    kube_client.create(PodGroupResource(metadata=ObjectMeta(name="gang2", namespace=ns),
                                        spec={"minMember": 2}))
    make_pod(kube_client, ns, "x0", gpus=1, model="L4-24GB", group="gang2")
    make_pod(kube_client, ns, "x1", gpus=1, model="L4-24GB", group="gang2")
    wait_until("second gang explained", lambda: scheduled_false(kube_client, ns, "x0"))
    assert not get_pod(kube_client, ns, "x0").spec.nodeName  # type: ignore[union-attr]
    assert not get_pod(kube_client, ns, "x1").spec.nodeName  # type: ignore[union-attr]
    for n in ("gang-l4-0", "gang-l4-1"):
        kube_client.delete(Node, n)


def test_reclaim_when_second_project_claims_its_quota(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    hog = project
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"), prefix="reclaim-t4-")
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    make_pod(kube_client, hog, "hog-0", gpus=1, model="T4-16GB")
    make_pod(kube_client, hog, "hog-1", gpus=1, model="T4-16GB")
    bound(kube_client, hog, "hog-0", "hog-1")
    starved = f"{hog}-b"
    kube_cluster.kubectl("create", "namespace", starved)
    make_project(kube_client, starved, starved, deserved=1)
    try:
        make_pod(kube_client, starved, "claim", gpus=1, model="T4-16GB")
        (pod,) = bound(kube_client, starved, "claim")
        assert pod.spec is not None and pod.spec.nodeName == "reclaim-t4-0"
        left = [p.metadata.name for p in kube_client.list(Pod, namespace=hog)]  # type: ignore[union-attr]
        assert len(left) == 1, left
        victim = ({"hog-0", "hog-1"} - set(left)).pop()
        reasons = [e.reason for e in events(kube_client, hog, victim)]
        assert "Reclaimed" in reasons
        msg = next(e.message for e in events(kube_client, hog, victim) if e.reason == "Reclaimed")
        assert starved in (msg or "")
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, "claim", namespace=starved, grace_period=0)
        kube_client.delete(Node, "reclaim-t4-0")


def make_pinned_claim_pod(client: Client, ns: str, name: str, claim_name: str, node: str,
                          annotations: dict[str, str] | None = None, make: bool = True) -> None:
    """A pod of one whole-GPU claim (made here unless ``make`` is False), held to ``node`` by
    required node affinity."""
    if make:
        make_claim(client, ns, claim_name, "gpu.tessera.io")
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                               {"nodeSelectorTerms": [{"matchFields": [
                                                   {"key": "metadata.name", "operator": "In",
                                                    "values": [node]}]}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}}))


def test_preemption_evicts_a_claim_holding_pod_and_its_claim_is_deallocated(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    """Two train pods hold both GPUs of a node through claims; an inference pod's claim for
    that node preempts one (Preempted), whose claim is deallocated, and is allocated the GPU."""
    ns = project
    node = "preempt-claims-t4-0"
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"),
                                  prefix="preempt-claims-t4-")
    try:
        for i in range(2):
            make_pinned_claim_pod(kube_client, ns, f"train-{i}", f"t{i}", node,
                                  {names.PRIORITY_CLASS: "train"})
        bound(kube_client, ns, "train-0", "train-1")
        make_pinned_claim_pod(kube_client, ns, "serve", "s", node,
                              {names.PRIORITY_CLASS: "inference"})
        (pod,) = bound(kube_client, ns, "serve")
        left = {p.metadata.name for p in kube_client.list(Pod, namespace=ns)}  # type: ignore[union-attr]
        (victim,) = {"train-0", "train-1"} - left
        wait_until("the Preempted event", lambda: "Preempted" in [
            e.reason for e in events(kube_client, ns, victim)])
        wait_until("the victim's claim deallocated", lambda: "allocation" not in claim_status(
            kube_client, ns, {"train-0": "t0", "train-1": "t1"}[victim]))
        (mine,) = claim_status(kube_client, ns, "s")["allocation"]["devices"]["results"]
        assert mine["pool"] == node
        assert f"gpu-{placement(pod)['devices'][0]}" == mine["device"]
    finally:
        kube_client.delete(Node, node)


def test_reclaim_of_a_shared_claim_evicts_all_its_pods(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    """Two pods of a project with no deserved GPUs share one claim for the only GPU of a node;
    a project asking for its deserved GPU there gets it: both pods are evicted (one for the
    reclaim, the other because it shares the claim — evicting one frees nothing), the claim is
    deallocated, and the new claim allocated gpu-0."""
    hog = project
    node = "reclaim-shared-t4-0"
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=1, model="T4-16GB"),
                                  prefix="reclaim-shared-t4-")
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    make_pinned_claim_pod(kube_client, hog, "hog-a", "c0", node)
    make_pinned_claim_pod(kube_client, hog, "hog-b", "c0", node, make=False)
    bound(kube_client, hog, "hog-a", "hog-b")
    assert len(claim_status(kube_client, hog, "c0")["reservedFor"]) == 2
    starved = f"{hog}-b"
    kube_cluster.kubectl("create", "namespace", starved)
    make_project(kube_client, starved, starved, deserved=1)
    try:
        make_pinned_claim_pod(kube_client, starved, "taker", "mine", node)
        bound(kube_client, starved, "taker")
        assert not list(kube_client.list(Pod, namespace=hog))
        for victim in ("hog-a", "hog-b"):
            wait_until(f"{victim}'s Reclaimed event", lambda v=victim: "Reclaimed" in [
                e.reason for e in events(kube_client, hog, v)])
        wait_until("the shared claim deallocated",
                   lambda: "allocation" not in claim_status(kube_client, hog, "c0"))
        (mine,) = claim_status(kube_client, starved, "mine")["allocation"]["devices"]["results"]
        assert (mine["pool"], mine["device"]) == (node, "gpu-0")
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, "taker", namespace=starved, grace_period=0)
        kube_client.delete(Node, node)


def test_reclaim_evicts_a_claim_holding_pod_and_its_claim_is_deallocated(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    """Claim pods of a project with no deserved GPUs borrow both GPUs of a node; a project
    asking for its deserved GPU with a claim gets one back: a borrower is evicted (Reclaimed),
    its claim deallocated, and the new claim allocated on the GPU it held."""
    hog = project
    node = "reclaim-claims-t4-0"
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"),
                                  prefix="reclaim-claims-t4-")
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)

    def pinned_claim_pod(ns: str, name: str, claim_name: str) -> None:
        make_pinned_claim_pod(kube_client, ns, name, claim_name, node)

    pinned_claim_pod(hog, "hog-0", "c0")
    pinned_claim_pod(hog, "hog-1", "c1")
    bound(kube_client, hog, "hog-0", "hog-1")
    starved = f"{hog}-b"
    kube_cluster.kubectl("create", "namespace", starved)
    make_project(kube_client, starved, starved, deserved=1)
    try:
        pinned_claim_pod(starved, "taker", "mine")
        (pod,) = bound(kube_client, starved, "taker")
        assert pod.spec is not None and pod.spec.nodeName == node
        left = [p.metadata.name for p in kube_client.list(Pod, namespace=hog)]  # type: ignore[union-attr]
        assert len(left) == 1, left
        victim = ({"hog-0", "hog-1"} - set(left)).pop()
        wait_until("the Reclaimed event", lambda: "Reclaimed" in [
            e.reason for e in events(kube_client, hog, victim)])
        lost = {"hog-0": "c0", "hog-1": "c1"}[victim]
        wait_until("the victim's claim deallocated",
                   lambda: "allocation" not in claim_status(kube_client, hog, lost))
        kept = claim_status(kube_client, hog, {"hog-0": "c1", "hog-1": "c0"}[victim])
        (mine,) = claim_status(kube_client, starved, "mine")["allocation"]["devices"]["results"]
        (theirs,) = kept["allocation"]["devices"]["results"]
        assert mine["pool"] == node and mine["device"] != theirs["device"]
        assert f"gpu-{placement(pod)['devices'][0]}" == mine["device"]
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, "taker", namespace=starved, grace_period=0)
        for n in ("hog-0", "hog-1"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, n, namespace=hog, grace_period=0)
        kube_client.delete(Node, node)


def test_pod_without_project_or_with_bad_request_is_explained(
    kube_client: Client, project: str
) -> None:
    ns = project
    make_pod(kube_client, ns, "bad", {names.GPU_PORTION: "1.5"})
    msg = wait_until("explanation", lambda: scheduled_false(kube_client, ns, "bad"))
    assert names.GPU_PORTION in msg and "(0, 1)" in msg
    # The Event is written after the condition, in its own task: wait for it (under load it
    # came a moment later and the bare assert failed in the full module run).
    wait_until("the FailedScheduling event", lambda: any(
        e.reason == "FailedScheduling" for e in events(kube_client, ns, "bad")))


def test_project_schema_validates_in_the_api_server(env: SchedulerEnv, kube_client: Client) -> None:
    with pytest.raises(ApiError) as err:
        kube_client.create(ProjectResource(
            metadata=ObjectMeta(name="bad-limit"),
            spec={"namespace": "x", "resources": {"gpu": {"deserved": 4, "limit": 2}}}))
    assert err.value.status.code == 422 and "limit must be at least deserved" in str(err.value)
    with pytest.raises(ApiError) as err:
        kube_client.create(PodGroupResource(metadata=ObjectMeta(name="g", namespace="default"),
                                            spec={"minMember": 0}))
    assert err.value.status.code == 422 and "minMember" in str(err.value)


def test_stale_configmap_conflict_is_retried_and_replaced(
    kube_client: Client, project: str
) -> None:
    ns = project
    kube_client.create(ConfigMap(
        metadata=ObjectMeta(name="conf-tessera-gpu", namespace=ns),
        data={"NVIDIA_VISIBLE_DEVICES": "GPU-stale"}))
    make_pod(kube_client, ns, "conf", {names.GPU_PORTION: "0.25"}, model="H100-80GB")
    (pod,) = bound(kube_client, ns, "conf")
    data = configmap_data(kube_client, ns, "conf")
    assert data["NVIDIA_VISIBLE_DEVICES"] == uuids(pod)[0] != "GPU-stale"


def test_node_deleted_while_it_holds_workloads(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    ns = project
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="A100-40GB"), prefix="doomed-")
    make_pod(kube_client, ns, "whole", gpus=1, model="A100-40GB")
    make_pod(kube_client, ns, "share", {names.GPU_PORTION: "0.5"}, model="A100-40GB")
    bound(kube_client, ns, "whole", "share")
    assert reservations(kube_client, "doomed-0")
    kube_client.delete(Node, "doomed-0")
    wait_until("pods on the deleted node deleted", lambda: not list(kube_client.list(Pod, namespace=ns)))
    assert any(e.reason == "NodeLost" for e in events(kube_client, ns, "whole"))
    wait_until("reservation pod on the deleted node deleted",
               lambda: not reservations(kube_client, "doomed-0"))
    wait_until("ConfigMap of the deleted pod removed", lambda: not [
        c for c in kube_client.list(ConfigMap, namespace=ns) if c.metadata.name == "share-tessera-gpu"])  # type: ignore[union-attr]


def _check_no_double_allocation(client: Client, ns: str) -> None:
    per_uuid: dict[str, float] = {}
    by_device = {(r.spec.nodeName, r.metadata.labels[names.RESERVATION_DEVICE]):  # type: ignore[union-attr,index]
                 (r.metadata.annotations or {}).get(names.GPU_UUID)  # type: ignore[union-attr]
                 for r in reservations(client)}
    for p in client.list(Pod, namespace=ns):
        if not (p.spec and p.spec.nodeName):
            continue
        pl = placement(p)
        for u, r in zip(uuids(p), pl["request"], strict=True):
            per_uuid[u] = per_uuid.get(u, 0) + r
        # Its ConfigMap and its reservation pods agree with what is recorded on the pod.
        assert p.metadata is not None and p.metadata.name is not None
        cm = configmap_data(client, ns, p.metadata.name)
        assert cm["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids(p))
        assert [by_device[(p.spec.nodeName, str(d))] for d in pl["devices"]] == uuids(p)
    assert per_uuid and all(v <= 40960 * 2**20 for v in per_uuid.values()), per_uuid
    holders: dict[str, list[str]] = {}
    for r in reservations(client):
        u = (r.metadata.annotations or {}).get(names.GPU_UUID)  # type: ignore[union-attr]
        if u:
            holders.setdefault(u, []).append(r.metadata.name)  # type: ignore[union-attr]
    assert all(len(v) == 1 for v in holders.values()), holders
    assert set(per_uuid) <= set(holders)


def test_scheduler_killed_mid_batch_restarts_without_double_allocation(
    env: SchedulerEnv, kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    ns = project
    kube_cluster.create_gpu_nodes(2, NodeShape(gpus=4, model="A100-40GB"), prefix="kill-")
    count = 28
    for i in range(count):
        make_pod(kube_client, ns, f"q{i}", {names.GPU_PORTION: "0.25"}, model="A100-40GB")

    def some_bound() -> bool:
        return sum(1 for p in kube_client.list(Pod, namespace=ns) if p.spec and p.spec.nodeName) >= 3

    wait_until("a few pods bound", some_bound, timeout=30)
    os.kill(env.scheduler.pid, signal.SIGKILL)
    env.scheduler.wait(5)
    partly = sum(1 for p in kube_client.list(Pod, namespace=ns) if p.spec and p.spec.nodeName)
    env.scheduler = env.start_scheduler("scheduler-restarted")
    bound(kube_client, ns, *[f"q{i}" for i in range(count)], timeout=60)
    _check_no_double_allocation(kube_client, ns)
    # 28 quarter GPUs fill exactly 7 GPUs: binpacking after the restart reused the partly
    # filled reservations instead of opening new ones.
    held = {u for p in kube_client.list(Pod, namespace=ns) for u in uuids(p)}
    assert len(held) == 7, (partly, held)
    for n in ("kill-0", "kill-1"):
        kube_client.delete(Node, n)


def test_leader_election_two_replicas_one_acts(
    env: SchedulerEnv, kube_client: Client, project: str
) -> None:
    """The running scheduler holds the Lease; a standby started beside it sees the Lease held,
    stands by and does not act; once the leader is killed, it takes over. Each step waits for
    what shows the previous one happened (the leader's Lease, the standby's "standing by"),
    not for a time: at load a Python process takes seconds to start."""
    ns = project
    leader = next(a for a in env.scheduler.args if str(a).startswith("--identity="))
    leader = str(leader).removeprefix("--identity=")

    def holder() -> str | None:
        try:
            lease = kube_client.get(Lease, names.LEASE_NAME, namespace=names.SYSTEM_NAMESPACE)
        except ApiError:
            return None
        return lease.spec.holderIdentity if lease.spec else None

    wait_until(f"{leader} holds the lease", lambda: holder() == leader, timeout=60)
    standby = env.start_scheduler("scheduler-standby")
    wait_until("the standby stands by", lambda: re.search(
        rf"lease \S+ is held by {re.escape(leader)}; standing by", env.log("scheduler-standby")),
        timeout=60)
    assert holder() == leader
    make_pod(kube_client, ns, "one", {names.GPU_PORTION: "0.5"}, model="H100-80GB")
    bound(kube_client, ns, "one")
    assert "caches synced" not in env.log("scheduler-standby"), "the standby must not act"
    os.kill(env.scheduler.pid, signal.SIGKILL)
    env.scheduler.wait(5)
    make_pod(kube_client, ns, "two", {names.GPU_PORTION: "0.5"}, model="H100-80GB")
    bound(kube_client, ns, "two", timeout=45)
    assert holder() == "scheduler-standby"
    assert "caches synced" in env.log("scheduler-standby")
    env.scheduler = standby


def test_crd_manifests_are_valid_yaml() -> None:
    for f in (ROOT / "deploy" / "crds").glob("*.yaml"):
        doc = yaml.safe_load(f.read_text())
        assert doc["spec"]["group"] == names.GROUP
        codecs.from_dict(doc)


def test_half_done_work_of_a_former_life_is_cleaned_up(
    env: SchedulerEnv, kube_client: Client, kube_namespace: str
) -> None:
    """A reservation pod with no tenant and a ConfigMap whose pod is not bound (what a
    scheduler killed between those writes and the binding leaves) are deleted."""
    ns = kube_namespace  # no Project owns it: its pod stays pending
    node = "gpu-node-1"
    kube_client.create(Pod(
        metadata=ObjectMeta(
            name=f"tessera-gpu-{node}-7", namespace=names.SYSTEM_NAMESPACE,
            labels={names.RESERVATION_LABEL: "true", names.RESERVATION_DEVICE: "7",
                    names.MANAGED_BY: "tessera"},
            annotations={names.RESERVATION_NODE: node}),
        spec=PodSpec(nodeName=node, schedulerName=names.SCHEDULER_NAME, containers=[Container(
            name="reserve", image="registry.k8s.io/pause:3.10",
            resources=ResourceRequirements(limits={names.GPU_RESOURCE: "1"}))]),
    ))
    make_pod(kube_client, ns, "stuck", {names.GPU_PORTION: "0.5"})
    kube_client.create(ConfigMap(
        metadata=ObjectMeta(name="stuck-tessera-gpu", namespace=ns,
                            labels={names.MANAGED_BY: "tessera"},
                            annotations={names.CONFIGMAP_POD: "stuck"}),
        data={"NVIDIA_VISIBLE_DEVICES": "GPU-left-over"}))
    wait_until("orphan reservation pod deleted", lambda: not [
        r for r in reservations(kube_client, node)
        if r.metadata and r.metadata.name == f"tessera-gpu-{node}-7"])
    wait_until("ConfigMap of the unbound pod deleted", lambda: not [
        c for c in kube_client.list(ConfigMap, namespace=ns)
        if c.metadata and c.metadata.name == "stuck-tessera-gpu"])
    msg = wait_until("explanation", lambda: scheduled_false(kube_client, ns, "stuck"))
    assert f"namespace {ns} belongs to no tessera Project" in msg
    kube_client.delete(Pod, "stuck", namespace=ns, grace_period=0)


def test_cordoned_node_gets_no_new_pods_until_uncordoned(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    ns = project
    (node,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="H200-141GB"),
                                            prefix="cordon-")
    make_pod(kube_client, ns, "before", gpus=1, model="H200-141GB")
    bound(kube_client, ns, "before")
    kube_client.patch(Node, node, {"spec": {"unschedulable": True}})
    make_pod(kube_client, ns, "after", gpus=1, model="H200-141GB")
    msg = wait_until("explanation", lambda: scheduled_false(kube_client, ns, "after"))
    assert not get_pod(kube_client, ns, "after").spec.nodeName, msg  # type: ignore[union-attr]
    assert get_pod(kube_client, ns, "before").spec.nodeName == node  # type: ignore[union-attr]
    kube_client.patch(Node, node, {"spec": {"unschedulable": False}})
    (pod,) = bound(kube_client, ns, "after")
    assert pod.spec is not None and pod.spec.nodeName == node
    kube_client.delete(Node, node)


def test_gpus_taken_by_another_schedulers_pod_are_not_given_out(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    import msgspec
    from lightkube.models.core_v1 import ObjectReference
    from lightkube.resources.core_v1 import PodBinding

    ns = project
    (node,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=1, model="H200-141GB"),
                                            prefix="foreign-")
    kube_client.create(Pod(
        metadata=ObjectMeta(name="theirs", namespace=ns),
        spec=PodSpec(schedulerName="someone-else", containers=[Container(
            name="main", image="example.invalid/cuda:12",
            resources=ResourceRequirements(limits={names.GPU_RESOURCE: "1"}))])))
    with contextlib.suppress(msgspec.ValidationError):
        kube_client.create(PodBinding(
            metadata=ObjectMeta(name="theirs", namespace=ns),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node)), "theirs", namespace=ns)
    make_pod(kube_client, ns, "ours", gpus=1, model="H200-141GB")
    wait_until("explanation", lambda: scheduled_false(kube_client, ns, "ours"))
    assert not get_pod(kube_client, ns, "ours").spec.nodeName  # type: ignore[union-attr]
    kube_client.delete(Pod, "theirs", namespace=ns, grace_period=0)
    (pod,) = bound(kube_client, ns, "ours")
    assert pod.spec is not None and pod.spec.nodeName == node
    kube_client.delete(Node, node)


def test_time_based_fair_share_gives_a_starved_project_its_history_back(
    env: SchedulerEnv, kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    """The scheduler restarted with --fair-share-history (as Helm's policy.fairShareHistory
    does): a project that held both T4s for a few seconds loses its over-quota share to one that
    held nothing; the Project's status says so (fairShare 2, fromUsageHistory +1) and the
    starved project's pods are bound by reclaim. The plain scheduler is put back after."""
    hog = project
    env.scheduler.terminate()  # releases the lease
    env.scheduler.wait(10)
    env.scheduler = env.start_scheduler("scheduler-history", "--fair-share-history",
                                        "window=1h,half-life=30s,k=2")
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"), prefix="history-t4-")
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    starved = f"{hog}-b"
    try:
        for i in range(2):
            make_pod(kube_client, hog, f"hog-{i}", gpus=1, model="T4-16GB")
        bound(kube_client, hog, "hog-0", "hog-1", timeout=45)
        time.sleep(3)
        kube_cluster.kubectl("create", "namespace", starved)
        make_project(kube_client, starved, starved, deserved=0)
        for i in range(2):
            make_pod(kube_client, starved, f"b-{i}", gpus=1, model="T4-16GB")

        def status(name: str) -> dict[str, Any]:
            return dict(kube_client.get(ProjectResource, name).get("status") or {})

        got = wait_until("the starved project's history share", lambda: (
            s := status(starved)).get("fromUsageHistory", {}).get("gpu", 0) > 0.5 and s, timeout=60)
        assert got["fairShare"]["gpu"] == pytest.approx(2.0, abs=0.01), got
        assert got["fromUsageHistory"]["gpu"] == pytest.approx(1.0, abs=0.01), got
        # (The hog's own status goes back to 0 from the next cycle: its bare pods, once
        # reclaimed, are gone, so it asks for nothing; the embedded test checks the "less".)
        bound(kube_client, starved, "b-0", "b-1", timeout=60)
    finally:
        for ns in (hog, starved):
            for pod in kube_client.list(Pod, namespace=ns):
                with contextlib.suppress(ApiError):
                    kube_client.delete(Pod, pod.metadata.name, namespace=ns,  # type: ignore[union-attr]
                                       grace_period=0)
        with contextlib.suppress(ApiError):
            kube_client.delete(ProjectResource, starved)
        kube_client.delete(Node, "history-t4-0")
        env.scheduler.terminate()
        env.scheduler.wait(10)
        env.scheduler = env.start_scheduler("scheduler-plain-again")


def _kept_usage(kube_client: Client, project: str, at: float) -> tuple[float, float, int] | None:
    """(savedAt, decayed usage of ``project`` at ``at``, its workloads running) from the
    scheduler's usage history ConfigMap, or None while there is none (or not a good record)."""
    try:
        cm = kube_client.get(ConfigMap, history_store.NAME, namespace=names.SYSTEM_NAMESPACE)
        records, running, saved = restore(history_store.decode(cm), time.time())
    except (ApiError, ValueError, OSError):
        return None
    return (saved, decayed_usage(records, at, {project: (3600.0, 30.0)}).get(project, 0.0),
            sum(p == project for p, _, _ in running.values()))


async def _load(cluster: TestCluster, history: UsageHistory) -> None:
    client = AsyncClient(KubeConfig.from_file(cluster.kubeconfig))
    try:
        await history_store.HistoryConfigMap(client, names.SYSTEM_NAMESPACE, history).load()
    finally:
        await client.close()


def test_usage_history_survives_a_scheduler_killed_and_a_corrupt_record_is_ignored(
    env: SchedulerEnv, kube_cluster: TestCluster, kube_client: Client, project: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With --fair-share-history ...,save-every=1s: a project holds two T4s a moment and stops;
    the scheduler is SIGKILLed and a new one takes the lease: the history it decides with (the
    record it writes) holds that usage exactly as before; SIGTERMed, it writes once more. A
    tenant with ConfigMap rights in its own namespace cannot write the record. A corrupt record
    is logged and ignored by the scheduler's loader: the history starts empty."""
    flags = ("--fair-share-history", "window=1h,half-life=30s,k=2,save-every=1s")
    ns = names.SYSTEM_NAMESPACE
    env.scheduler.terminate()  # releases the lease
    env.scheduler.wait(10)
    with contextlib.suppress(ApiError):
        kube_client.delete(ConfigMap, history_store.NAME, namespace=ns)
    env.scheduler = env.start_scheduler("scheduler-keep-1", *flags)
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="T4-16GB"), prefix="keep-t4-")
    try:
        for i in range(2):
            make_pod(kube_client, project, f"keep-{i}", gpus=1, model="T4-16GB")
        bound(kube_client, project, "keep-0", "keep-1", timeout=45)
        # Seen running by a cycle (one runs at least every 5 s; the history watches cycles).
        wait_until("both running in the record", lambda: (
            k := _kept_usage(kube_client, project, time.time())) and k[2] == 2, timeout=20)
        for i in range(2):
            kube_client.delete(Pod, f"keep-{i}", namespace=project, grace_period=0)
        stopped = time.time()
        saved = wait_until("the stopped pods' usage saved", lambda: (
            k if (k := _kept_usage(kube_client, project, stopped)) and k[0] > stopped and k[2] == 0
            else None), timeout=20)
        env.scheduler.kill()  # SIGKILL: no last write, the lease is not released
        env.scheduler.wait(10)
        killed = time.time()
        # (Its lease would expire in 6 s; deleted, the next scheduler leads at once.)
        kube_client.delete(Lease, names.LEASE_NAME, namespace=ns)
        env.scheduler = env.start_scheduler("scheduler-keep-2", *flags)
        after = wait_until("a record written after the restart", lambda: (
            k if (k := _kept_usage(kube_client, project, stopped)) and k[0] > killed else None),
            timeout=30)
        assert saved[1] > 0 and after[1] == pytest.approx(saved[1], rel=1e-6)
        # A tenant: ConfigMap rights in its own namespace, none in tessera's.
        kube_cluster.kubectl("create", "role", "cm-edit", "--verb=*", "--resource=configmaps",
                             "-n", project, check=False)
        kube_cluster.kubectl("create", "rolebinding", "tenant-edit", "--role=cm-edit",
                             "--user=tenant", "-n", project, check=False)
        for verb in (("patch", "configmap", history_store.NAME, "-p", '{"binaryData":{}}'),
                     ("delete", "configmap", history_store.NAME)):
            out = kube_cluster.kubectl("--as=tenant", "-n", ns, *verb, check=False)
            assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out.stderr
        terminated = time.time()
        env.scheduler.terminate()  # SIGTERM: it writes once more before it lets the lease go
        env.scheduler.wait(10)
        last = _kept_usage(kube_client, project, stopped)
        assert last is not None and last[0] > terminated and last[1] == pytest.approx(saved[1], rel=1e-6)
        # A corrupt record, read as a starting scheduler reads it (its own loader, in process).
        kube_client.patch(ConfigMap, history_store.NAME, {"binaryData": {
            history_store.KEY: base64.b64encode(b"not gzip").decode()}}, namespace=ns)
        history = UsageHistory(UsagePolicy(3600.0, 30.0, 2.0))
        with caplog.at_level(logging.INFO, "tessera.kube"):
            asyncio.run(_load(kube_cluster, history))
        assert not history.records and not history.running
        said = rf"usage history: ConfigMap {ns}/{history_store.NAME} ignored: not a gzipped JSON " \
            r"record \(.*\); starting empty"
        assert any(re.fullmatch(said, m) for m in caplog.messages), caplog.messages
    finally:
        for i in range(2):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, f"keep-{i}", namespace=project, grace_period=0)
        kube_client.delete(Node, "keep-t4-0")
        env.scheduler.terminate()
        env.scheduler.wait(10)
        with contextlib.suppress(ApiError):
            kube_client.delete(ConfigMap, history_store.NAME, namespace=ns)
        env.scheduler = env.start_scheduler("scheduler-plain-after-keep")


def test_an_elastic_gang_is_shrunk_to_make_room_not_evicted_whole(
    kube_cluster: TestCluster, kube_client: Client, project: str
) -> None:
    """A PodGroup of 4 one-GPU pods with minMember 1 (3 elastic) holds a 4-GPU node over quota;
    a project deserving 2 asks for 2 GPUs on one node: the gang gives back its two newest
    elastic pods (Event reason Shrunk), keeps running with two, and the pod is bound."""
    elastic = project
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=4, model="H200-141GB"), prefix="elastic-h200-")
    kube_client.patch(ProjectResource, elastic, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    kube_client.create(PodGroupResource(metadata=ObjectMeta(name="el", namespace=elastic),
                                        spec={"minMember": 1}))
    other = f"{elastic}-b"
    try:
        for i in range(4):
            make_pod(kube_client, elastic, f"e{i}", gpus=1, model="H200-141GB", group="el")
        bound(kube_client, elastic, "e0", "e1", "e2", "e3")
        kube_cluster.kubectl("create", "namespace", other)
        make_project(kube_client, other, other, deserved=2)
        make_pod(kube_client, other, "two", gpus=2, model="H200-141GB")
        bound(kube_client, other, "two", timeout=45)
        left = sorted(p.metadata.name for p in kube_client.list(Pod, namespace=elastic)  # type: ignore[union-attr]
                      if p.metadata and not p.metadata.deletionTimestamp)
        assert left == ["e0", "e1"], left
        assert all(get_pod(kube_client, elastic, n).spec.nodeName for n in left)  # type: ignore[union-attr]
        for gone in ("e2", "e3"):
            msg = next(e.message for e in events(kube_client, elastic, gone) if e.reason == "Shrunk")
            assert "shrunk by 2 elastic pod(s) (to 2 of 4, minimum 1)" in (msg or "")
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, "two", namespace=other, grace_period=0)
        with contextlib.suppress(ApiError):
            kube_client.delete(ProjectResource, other)
        kube_client.delete(Node, "elastic-h200-0")
