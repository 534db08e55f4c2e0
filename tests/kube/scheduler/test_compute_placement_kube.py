"""Σ compute requests ≤ 1 per GPU on the Kubernetes backend (issue 30): the scheduler reads the
canonical ``tessera.io/gpu-compute-request`` the webhook writes, places by the same core as
embedded mode, and a pod that waits for GPU time says so (PodScheduled=False, the event)."""

from __future__ import annotations

import contextlib

from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tests.kube.scheduler_env import (
    bound,
    claim_status,
    env,
    events,
    make_claim,
    placement,
    project,
    scheduled_false,
)
from tests.waiting import wait_until

NODE = "compute-t4-0"
__all__ = ["env", "project"]  # the fixtures this module uses


def pinned_share(client: Client, ns: str, name: str, request: str) -> None:
    """4 GiB of a T4 with a compute request, held to NODE by required node affinity."""
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": {
            names.GPU_MEMORY: "4Gi", names.GPU_MODEL: "T4-16GB",
            "tessera.io/gpu-compute-request": request, "tessera.io/gpu-compute-limit": "1",
            "tessera.io/gpu-compute-mode": "fair"}},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                               {"nodeSelectorTerms": [{"matchFields": [
                                                   {"key": "metadata.name", "operator": "In",
                                                    "values": [NODE]}]}]}}},
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12"}]}}))


def test_memory_shares_wait_for_gpu_time_on_kubernetes(kube_cluster: TestCluster, kube_client: Client,
                                                       project: str) -> None:
    ns = project
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=1, model="T4-16GB"), prefix="compute-t4-")
    try:
        pinned_share(kube_client, ns, "time-a", "0.6")
        (a,) = bound(kube_client, ns, "time-a")
        assert placement(a)["compute"] == 600_000
        pinned_share(kube_client, ns, "time-b", "0.5")
        msg = wait_until("time-b's reason", lambda: scheduled_false(kube_client, ns, "time-b"))
        assert "waiting for GPU time" in msg and "0.4 on compute-t4-0 GPU 0" in msg, msg
        wait_until("time-b's FailedScheduling event", lambda: any(
            e.reason == "FailedScheduling" and "waiting for GPU time" in (e.message or "")
            for e in events(kube_client, ns, "time-b")))
        pinned_share(kube_client, ns, "time-c", "0.4")  # the time that is left fits
        (c,) = bound(kube_client, ns, "time-c")
        assert placement(c)["compute"] == 400_000
        kube_client.delete(Pod, "time-a", namespace=ns, grace_period=0)
        bound(kube_client, ns, "time-b")
    finally:
        for pod in ("time-a", "time-b", "time-c"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod, namespace=ns, grace_period=0)
        kube_client.delete(Node, NODE)


def pinned_claim_pod(client: Client, ns: str, name: str, claim: str) -> None:
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                               {"nodeSelectorTerms": [{"matchFields": [
                                                   {"key": "metadata.name", "operator": "In",
                                                    "values": [NODE]}]}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}}))


def test_dra_claims_consume_compute_capacity(kube_cluster: TestCluster, kube_client: Client,
                                             project: str) -> None:
    """``capacity.requests.compute`` of a share claim: placed within the GPU's time, recorded
    in the allocation's consumedCapacity, and a second claim that would over-promise waits."""
    ns = project
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=1, model="T4-16GB"), prefix="compute-t4-")
    try:
        make_claim(kube_client, ns, "time-60", "share.gpu.tessera.io",
                   capacity={"memory": "2Gi", "compute": "600m"})
        make_claim(kube_client, ns, "time-50", "share.gpu.tessera.io",
                   capacity={"memory": "2Gi", "compute": "500m"})
        pinned_claim_pod(kube_client, ns, "claim-a", "time-60")
        (a,) = bound(kube_client, ns, "claim-a")
        assert placement(a)["compute"] == 600_000
        (result,) = claim_status(kube_client, ns, "time-60")["allocation"]["devices"]["results"]
        assert result["consumedCapacity"]["compute"] == "600m"
        pinned_claim_pod(kube_client, ns, "claim-b", "time-50")
        msg = wait_until("claim-b's reason", lambda: scheduled_false(kube_client, ns, "claim-b"))
        assert "waiting for GPU time" in msg, msg
    finally:
        for pod in ("claim-a", "claim-b"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod, namespace=ns, grace_period=0)
        kube_client.delete(Node, NODE)
