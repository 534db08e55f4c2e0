"""tessera-scheduler allocates ResourceClaims of class ``mig.tessera.io`` (issue 20, item 4;
docs/mig.md): a pod it schedules with such a claim is placed like a pod annotated with the
profile (its fraction in quota, the MigConstraint's reason when it waits), and the claim is
allocated the device of the placement :func:`tessera.core.mig.choose` picks over the node's MIG
GPUs minus what allocated claims hold (an idle partition of the profile first, where
kube-scheduler would take the first device that fits). Real API server, the real scheduler
process, the real tessera-node on the fake NVML with an A100-40GB in MIG mode; the test plays
the kubelet (prepare / unprepare over the plugin's gRPC socket)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod

from tessera.kube import names
from tessera.kube.claims import ResourceClaim
from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2
from tessera.node.draplugin import registration_pb2_grpc as reg_grpc
from tessera.node.resourceslice import ResourceSlice
from tessera.testing.cluster import TestCluster
from tessera.testing.node_agents import NodeAgent
from tests.kube.mig_nodes import mig_node_agents, pod_gone
from tests.kube.mig_nodes import partitions as mig_partitions
from tests.kube.scheduler_env import (
    SchedulerEnv,
    bound,
    claim_status,
    get_pod,
    placement,
    scheduled_false,
)
from tests.waiting import wait_until

NODE = "dmigt-node-0"
TAINT = "tessera.io/dmigt-test"


@pytest.fixture(scope="module")
def agent(kube_cluster: TestCluster, kube_client: Client) -> Iterator[NodeAgent]:
    """One A100-40GB in MIG mode and its tessera-node (tests.kube.mig_nodes)."""
    with mig_node_agents(kube_cluster, kube_client, NODE, 212, TAINT) as agents:
        yield agents.agents[NODE]


def mig_claim_pod(client: Client, ns: str, name: str, profile: str) -> None:
    client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression":
                                   f'device.attributes["gpu.tessera.io"].profile == "{profile}"'}}],
        }}]}}}))
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                 "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": "mig"}]}}]}}))


def device(client: Client, ns: str, name: str) -> str:
    (r,) = claim_status(client, ns, name)["allocation"]["devices"]["results"]
    assert (r["driver"], r["pool"]) == ("gpu.tessera.io", NODE) and "shareID" not in r
    return str(r["device"])


def kubelet(a: NodeAgent, client: Client, ns: str, name: str, prepare: bool) -> str:
    """NodePrepareResources (the MIG UUID the CDI spec gives) or NodeUnprepareResources."""
    claim = client.get(ResourceClaim, name, namespace=ns).to_dict()
    ref = dra_pb2.Claim(namespace=ns, name=name, uid=claim["metadata"]["uid"])
    with grpc.insecure_channel(f"unix://{a.registration_socket}") as ch:
        endpoint = reg_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                         timeout=10).endpoint
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        stub = dra_pb2_grpc.DRAPluginStub(ch)
        if not prepare:
            got = stub.NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=30)
            assert got.claims[ref.uid].error == ""
            return ""
        reply = stub.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30).claims[ref.uid]
    assert reply.error == "", reply.error
    spec = json.loads((a.cdi_dir / f"gpu.tessera.io-{ref.uid}.json").read_text())
    (line,) = spec["containerEdits"]["env"]
    return line.removeprefix("NVIDIA_VISIBLE_DEVICES=")


def partitions(client: Client) -> list[dict[str, Any]]:
    return mig_partitions(client, NODE)


def gone(client: Client, ns: str, pod: str) -> None:
    """The pod deleted; tessera-scheduler deallocates the claim it allocated for it."""
    pod_gone(client, ns, pod, lambda: "allocation" not in claim_status(client, ns, pod))


def test_tessera_scheduler_allocates_mig_claims_by_choose(
        env: SchedulerEnv, kube_client: Client, project: str,
        agent: NodeAgent) -> None:
    ns = project
    wait_until("the MIG devices published", lambda: any(
        (s.metadata.name if s.metadata else "").endswith("-mig-0")
        for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": NODE})))
    # A 1g.5gb at slot 0, then a 3g.20gb: slot 4 is the one free placement left for it.
    mig_claim_pod(kube_client, ns, "small", "1g.5gb")
    [small] = bound(kube_client, ns, "small")
    assert small.spec is not None and small.spec.nodeName == NODE
    assert device(kube_client, ns, "small") == "gpu-0-mig-1g5gb-0"
    assert placement(small)["gpus"] == pytest.approx(1 / 7, abs=1e-3)  # quota: its fraction
    mig_claim_pod(kube_client, ns, "half", "3g.20gb")
    bound(kube_client, ns, "half")
    assert device(kube_client, ns, "half") == "gpu-0-mig-3g20gb-4"
    made = kubelet(agent, kube_client, ns, "half", prepare=True)
    assert made.startswith("MIG-")
    kubelet(agent, kube_client, ns, "small", prepare=True)
    # Both end: their partitions stay, idle (the kubelet unprepares, tessera deallocates).
    for pod in ("half", "small"):
        kubelet(agent, kube_client, ns, pod, prepare=False)
        gone(kube_client, ns, pod)
    wait_until("both idle in the inventory", lambda: sorted(
        (p["profile"], p["start"], "claim" in p) for p in partitions(kube_client)) == [
        ("1g.5gb", 0, False), ("3g.20gb", 4, False)])
    # A new 3g.20gb: choose() reuses the idle partition at slot 4, where a first-fit allocator
    # (kube-scheduler takes the first device that fits) would cut slot 0.
    mig_claim_pod(kube_client, ns, "again", "3g.20gb")
    [again] = bound(kube_client, ns, "again")
    assert device(kube_client, ns, "again") == "gpu-0-mig-3g20gb-4"
    assert placement(again)["gpus"] == pytest.approx(3 / 7, abs=1e-3)
    assert kubelet(agent, kube_client, ns, "again", prepare=True) == made
    # The allocated claim holds its slots: a second 3g.20gb takes slot 0 (removing the idle
    # 1g.5gb there at prepare), a third waits with the reason naming what exists.
    mig_claim_pod(kube_client, ns, "second", "3g.20gb")
    bound(kube_client, ns, "second")
    assert device(kube_client, ns, "second") == "gpu-0-mig-3g20gb-0"
    mig_claim_pod(kube_client, ns, "third", "3g.20gb")
    why = wait_until("third pending", lambda: scheduled_false(kube_client, ns, "third"))
    assert f"no room for MIG 3g.20gb on their MIG GPUs ({NODE} A100-40GB:" in why, why
    assert "allocation" not in claim_status(kube_client, ns, "third")
    kubelet(agent, kube_client, ns, "again", prepare=False)


def test_mig_claim_of_a_profile_no_gpu_has_waits_with_the_reason(
        env: SchedulerEnv, kube_client: Client, project: str,
        agent: NodeAgent) -> None:
    mig_claim_pod(kube_client, project, "big", "3g.40gb")  # an A100-80GB / H100 profile
    why = wait_until("big pending", lambda: scheduled_false(kube_client, project, "big"))
    assert ("no GPU in MIG mode has profile 3g.40gb (MIG profiles here: A100-40GB: 1g.5gb, "
            "1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)") in why, why
    assert get_pod(kube_client, project, "big").spec.nodeName is None
    assert "allocation" not in claim_status(kube_client, project, "big")


def test_partitions_of_annotated_pods_are_not_offered_as_devices(
        env: SchedulerEnv, kube_client: Client, project: str,
        agent: NodeAgent) -> None:
    """A pod of the annotation path (tessera.io/gpu-mig-profile) holds a partition: tessera-node
    takes the placements overlapping it out of its slice (kube-scheduler could otherwise give
    them to a claim); when the pod is gone they are offered again."""
    ns = project
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ann", "namespace": ns,
                     "annotations": {names.MIG_PROFILE: "1g.5gb"}},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12"}]}}))
    [pod] = bound(kube_client, ns, "ann")
    start = json.loads((pod.metadata.annotations or {})[names.MIG_PARTITION])["start"]
    overlapping = {f"gpu-0-mig-1g5gb-{start}", "gpu-0-mig-7g40gb-0"}

    def offered() -> set[str]:
        return {d["name"] for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": NODE})
                for d in (s.spec or {}).get("devices") or [] if "-mig-" in d["name"]}
    left = wait_until("the held placement out of the slice",
                      lambda: (o := offered()) and not (o & overlapping) and o)
    assert f"gpu-0-mig-1g5gb-{(start + 1) % 7}" in left  # the rest still offered
    kube_client.delete(Pod, "ann", namespace=ns, grace_period=0)
    wait_until("offered again once the pod is gone", lambda: overlapping <= offered())
