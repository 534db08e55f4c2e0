"""MIG partitions as DRA partitionable devices (issue 20, item 4; docs/mig.md): tessera-node on
the fake NVML with its A100-40GB in MIG mode publishes a counter set per MIG GPU and one device
per (profile, placement) consuming the slots it covers; kube-scheduler v1.36.3 (no
tessera-scheduler) allocates claims of class ``mig.tessera.io`` against them, the counters making
overlapping placements exclusive; tessera-node's kubelet plugin makes, reuses and removes the
partitions at prepare time. A private cluster: kube-scheduler must place only this test's pods;
the test plays kube-controller-manager's resourceclaim controller (deallocating a released
claim), which the test cluster does not run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from tessera.kube import names
from tessera.kube.claims import ResourceClaim
from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2
from tessera.node.draplugin import registration_pb2_grpc as reg_grpc
from tessera.node.resourceslice import ResourceSlice, slice_name
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgent, start_node_agents
from tests.kube.upstream_scheduler import kube_scheduler
from tests.node.fake_mig import nvml
from tests.waiting import wait_until

NS = "default"


@dataclass
class Env:
    cluster: TestCluster
    client: Client
    agent: NodeAgent
    scheduler: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    """One node with an A100-40GB in MIG mode, its tessera-node, and kube-scheduler with its defaults
    (DRAPartitionableDevices is beta and on in 1.36)."""
    c = TestCluster()
    c.start()
    try:
        (node,) = c.create_gpu_nodes(1, NodeShape(gpus=1, model="A100-40GB"), prefix="dmig-",
                                     node_agents=False)
        client = c.client()
        agents = start_node_agents(c, [node], env_overrides={"FAKE_GPU_MIG_0": "1"})
        agents.wait_ready()
        with kube_scheduler(c) as proc:
            yield Env(c, client, agents.agents[node], proc)
    finally:
        c.stop()


def mig_claim(client: Client, name: str, profile: str) -> None:
    client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression":
                                   f'device.attributes["gpu.tessera.io"].profile == "{profile}"'}}],
        }}]}}}))
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-pod", "namespace": NS},
        "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": "mig"}]}}]}}))


def bound(e: Env, name: str) -> dict[str, Any]:
    """The claim once kube-scheduler bound its pod (waited for)."""
    def check() -> Any:
        assert e.scheduler.poll() is None, "kube-scheduler exited"
        p = e.client.get(Pod, f"{name}-pod", namespace=NS)
        return p if p.spec and p.spec.nodeName else None
    pod = wait_until(f"{name}-pod bound by kube-scheduler", check, 60)
    assert pod.spec.nodeName == e.agent.node
    return dict(e.client.get(ResourceClaim, name, namespace=NS).to_dict())


def device(claim: dict[str, Any]) -> str:
    (r,) = claim["status"]["allocation"]["devices"]["results"]
    assert (r["driver"], r["pool"]) == ("gpu.tessera.io", claim["status"]["allocation"]
                                        ["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"]
                                        [0]["values"][0])
    return str(r["device"])


def unschedulable(e: Env, pod: str) -> str | None:
    p = e.client.get(Pod, pod, namespace=NS)
    for cond in (p.status.conditions if p.status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.message or "?"
    return None


def release(e: Env, name: str) -> None:
    """The pod deleted and its claim deallocated and deleted, as kube-controller-manager's
    resourceclaim controller does once the kubelet unprepared it."""
    e.client.delete(Pod, f"{name}-pod", namespace=NS, grace_period=0)
    e.client.patch(ResourceClaim.Status, name, [{"op": "remove", "path": "/status"}],
                   namespace=NS, patch_type=PatchType.JSON)
    e.client.patch(ResourceClaim, name, {"metadata": {"finalizers": None}}, namespace=NS,
                   patch_type=PatchType.MERGE)
    e.client.delete(ResourceClaim, name, namespace=NS)

    def gone() -> bool:
        try:
            e.client.get(Pod, f"{name}-pod", namespace=NS)
        except ApiError:
            return True
        return False
    wait_until(f"{name}-pod gone", gone)


def plugin(e: Env) -> dra_pb2_grpc.DRAPluginStub:
    wait_until("the plugin's socket", e.agent.registration_socket.exists)
    with grpc.insecure_channel(f"unix://{e.agent.registration_socket}") as ch:
        endpoint = reg_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                         timeout=10).endpoint
    return dra_pb2_grpc.DRAPluginStub(grpc.insecure_channel(f"unix://{endpoint}"))


def prepare(e: Env, claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    got = plugin(e).NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[
        dra_pb2.Claim(namespace=NS, name=meta["name"], uid=meta["uid"])]), timeout=30)
    return got.claims[meta["uid"]]


def unprepare(e: Env, claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    got = plugin(e).NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[
        dra_pb2.Claim(namespace=NS, name=meta["name"], uid=meta["uid"])]), timeout=30)
    assert got.claims[meta["uid"]].error == ""


def cdi_uuid(e: Env, claim: dict[str, Any]) -> str:
    spec = json.loads((e.agent.cdi_dir / f"gpu.tessera.io-{claim['metadata']['uid']}.json")
                      .read_text())
    (env_line,) = spec["containerEdits"]["env"]
    assert "LD_PRELOAD" not in json.dumps(spec)  # MIG isolates in hardware: no library
    key, _, value = env_line.partition("=")
    assert key == "NVIDIA_VISIBLE_DEVICES"
    return value


def journal(e: Env) -> dict[str, Any]:
    return dict(json.loads((e.agent.containers_dir / "mig-journal.json").read_text()))


def partitions(e: Env) -> list[dict[str, Any]]:
    """The partitions tessera-node publishes in the node's inventory (waited for a sync)."""
    node = e.client.get(Node, e.agent.node)
    inv = json.loads((node.metadata.annotations or {})[names.NODE_GPU_INVENTORY])
    return [p for g in inv["gpus"] for p in g.get("partitions") or ()]


def test_slices_claims_and_partitions(env: Env) -> None:
    e = env
    node = e.agent.node
    # -- the pool: GPUs' slice, counters' slice, MIG devices' slice; accepted as written.
    def pool() -> dict[str, Any] | None:
        got = {s.metadata.name: s.spec for s in e.client.list(
            ResourceSlice, fields={"spec.nodeName": node})}
        return got if len(got) == 3 else None
    slices = wait_until("the node's pool of 3 slices", pool)
    base = slice_name(node)
    assert set(slices) == {base, f"{base}-counters-0", f"{base}-mig-0"}
    assert {s["pool"]["resourceSliceCount"] for s in slices.values()} == {3}
    (counters,) = slices[f"{base}-counters-0"]["sharedCounters"]
    assert counters["name"] == "gpu-0-mig"
    assert {k: str(v["value"]) for k, v in counters["counters"].items()} == {
        **{f"memory-slice-{s}": "1" for s in range(8)}, "compute-slices": "7"}
    devs = {d["name"]: d for d in slices[f"{base}-mig-0"]["devices"]}
    # NVIDIA's instance counts on the A100-40GB: 7 + 4 + 3 + 2 + 1 + 1 placements.
    assert len(devs) == 18
    d = devs["gpu-0-mig-3g20gb-4"]
    assert d["attributes"]["profile"] == {"string": "3g.20gb"}
    assert d["attributes"]["placementStart"] == {"int": 4}
    assert d["attributes"]["parentUUID"] == {"string": e.agent.uuids[0]}
    assert d["consumesCounters"] == [{"counterSet": "gpu-0-mig", "counters": {
        **{f"memory-slice-{s}": {"value": "1"} for s in range(4, 8)},
        "compute-slices": {"value": "3"}}}]  # stored: the API server has the feature on

    # -- kube-scheduler: two 3g.20gb fit on one A100-40GB, a third does not.
    mig_claim(e.client, "a", "3g.20gb")
    mig_claim(e.client, "b", "3g.20gb")
    a, b = bound(e, "a"), bound(e, "b")
    assert {device(a), device(b)} == {"gpu-0-mig-3g20gb-0", "gpu-0-mig-3g20gb-4"}
    mig_claim(e.client, "c", "3g.20gb")
    msg = wait_until("c-pod unschedulable", lambda: unschedulable(e, "c-pod"), 60)
    assert "cannot allocate all claims" in msg, msg
    assert "allocation" not in (e.client.get(ResourceClaim, "c", namespace=NS).to_dict()
                                .get("status") or {})

    # -- the kubelet plugin: prepare makes the partition at the allocated placement.
    got = prepare(e, a)
    assert got.error == "", got.error
    assert [x.device_name for x in got.devices] == [device(a)]
    first = cdi_uuid(e, a)
    assert first.startswith("MIG-")
    start = int(device(a).rsplit("-", 1)[1])
    assert wait_until("a's partition in the inventory", lambda: [
        p for p in partitions(e) if p["uuid"] == first] or None) == [
        {"profile": "3g.20gb", "start": start, "uuid": first, "managed": True,
         "claim": a["metadata"]["uid"]}]
    assert prepare(e, a).error == "" and cdi_uuid(e, a) == first  # the kubelet retries: same
    assert prepare(e, b).error == ""
    # An allocation over slots a claim holds (written by hand: the counters keep kube-scheduler
    # from making one): refused naming the holder, nothing made or removed.
    e.client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "over", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.tessera.io"}}]}}}))
    e.client.patch(ResourceClaim.Status, "over", {"status": {"allocation": {
        "devices": {"results": [{"request": "mig", "driver": "gpu.tessera.io", "pool": node,
                                 "device": "gpu-0-mig-7g40gb-0"}]},
        "nodeSelector": a["status"]["allocation"]["nodeSelector"]}}},
        namespace=NS, patch_type=PatchType.MERGE)
    over = dict(e.client.get(ResourceClaim, "over", namespace=NS).to_dict())
    got = prepare(e, over)
    assert "MIG 7g.40gb at memory slot 0 of GPU 0" in got.error, got.error
    assert "overlap the 3g.20gb partition at slot 0, held by claim" in got.error, got.error
    held = {p["owner"] for p in journal(e)["partitions"]}
    assert held == {f"claim:{a['metadata']['uid']}", f"claim:{b['metadata']['uid']}"}
    e.client.patch(ResourceClaim.Status, "over", [{"op": "remove", "path": "/status"}],
                   namespace=NS, patch_type=PatchType.JSON)
    e.client.delete(ResourceClaim, "over", namespace=NS)

    # -- unprepare leaves it idle; the next claim on that placement reuses it.
    unprepare(e, a)
    wait_until("a's partition idle", lambda: [p for p in partitions(e) if p["uuid"] == first]
               == [{"profile": "3g.20gb", "start": start, "uuid": first, "managed": True}])
    release(e, "a")
    c = bound(e, "c")
    assert device(c) == device(a)
    assert prepare(e, c).error == ""
    assert cdi_uuid(e, c) == first

    # -- a 7g.40gb once both are released: the idle partitions are removed for it.
    for name, claim in (("b", b), ("c", c)):
        unprepare(e, claim)
        release(e, name)
    mig_claim(e.client, "whole", "7g.40gb")
    whole = bound(e, "whole")
    assert device(whole) == "gpu-0-mig-7g40gb-0"
    assert prepare(e, whole).error == ""
    uuid = cdi_uuid(e, whole)
    assert uuid not in (first, "") and uuid.startswith("MIG-")
    assert wait_until("only the 7g.40gb left", lambda: [
        (p["profile"], p["uuid"]) for p in partitions(e)] == [("7g.40gb", uuid)] or None)
    unprepare(e, whole)
    release(e, "whole")

    # -- a profile no GPU here has: Pending with kube-scheduler's reason, nothing allocated.
    mig_claim(e.client, "big", "3g.40gb")
    msg = wait_until("big-pod unschedulable", lambda: unschedulable(e, "big-pod"), 60)
    assert "cannot allocate all claims" in msg, msg
    e.client.delete(Pod, "big-pod", namespace=NS, grace_period=0)
    e.client.delete(ResourceClaim, "big", namespace=NS)


def test_nvml_error_is_the_prepare_error_and_nothing_is_left(env: Env) -> None:
    """The compute instance fails (NVML error injected into the fake): prepare answers the
    error naming the step; no partition is left (the GPU instance made for it is removed) and
    no CDI spec is written."""
    e = env
    normal = dict(e.agent.env)
    e.agent.process.stop()
    e.agent.env = {**normal, "FAKE_NVML_FAIL": "nvmlGpuInstanceCreateComputeInstance=23"}
    e.agent.restart()
    try:
        mig_claim(e.client, "fail", "2g.10gb")
        claim = bound(e, "fail")
        got = wait_until("the restarted plugin ready", lambda: (
            r := prepare(e, claim)) and "not ready" not in r.error and r)
        assert f"claim {NS}/fail: MIG 2g.10gb at memory slot" in got.error, got.error
        assert "creating the compute instance of 2g.10gb" in got.error, got.error
        assert "NVML error" in got.error, got.error
        assert not (e.agent.cdi_dir / f"gpu.tessera.io-{claim['metadata']['uid']}.json").exists()
        wait_until("no 2g.10gb", lambda: not [p for p in partitions(e)
                                              if p["profile"] == "2g.10gb"])
        doc = journal(e)
        assert doc["intents"] == [] and not [
            p for p in doc["partitions"] if p["profile"] == "2g.10gb"]
        release(e, "fail")
    finally:
        e.agent.process.stop()
        e.agent.env = normal
        e.agent.restart()


def test_an_operators_partition_is_not_offered(env: Env) -> None:
    """A partition tessera did not make (an operator's, made through NVML by another process on
    the node): the placements overlapping it leave the slice; it is never used or removed."""
    e = env
    base = slice_name(e.agent.node)

    def offered() -> set[str]:
        try:
            s = e.client.get(ResourceSlice, f"{base}-mig-0")
        except ApiError:
            return set()
        return {d["name"] for d in (s.spec or {}).get("devices") or []}
    wait_until("the 1g.5gb at slot 6 offered", lambda: "gpu-0-mig-1g5gb-6" in offered())
    nvml(e.agent.env, "nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, place(6, 1))\nout = 0")
    gone = {"gpu-0-mig-1g5gb-6", "gpu-0-mig-1g10gb-6", "gpu-0-mig-7g40gb-0"}
    left = wait_until("its placements out of the slice",
                      lambda: (o := offered()) and not (o & gone) and o)
    assert {"gpu-0-mig-1g5gb-5", "gpu-0-mig-3g20gb-0"} <= left
    assert [(p["profile"], p["managed"]) for p in partitions(e)
            if p["start"] == 6] == [("1g.5gb", False)]


def test_agent_killed_mid_prepare_adopts_the_partition(env: Env) -> None:
    """tessera-node killed (SIGKILL, fault point ``mig-create-gi``) right after it made the GPU
    instance of a claim's partition during NodePrepareResources: restarted, its journal adopts
    the instance as idle and the kubelet's retry of prepare gets it; one partition only."""
    e = env
    normal = dict(e.agent.env)
    e.agent.kill9()
    e.agent.env = {**normal, "TESSERA_FAULT_POINT": "mig-create-gi"}
    e.agent.restart()
    try:
        mig_claim(e.client, "crash", "2g.10gb")
        claim = bound(e, "crash")
        wait_until("the agent killed at the fault point while preparing", lambda: (
            prepare_or_none(e, claim) is None and e.agent.process.popen is not None
            and e.agent.process.popen.poll() is not None))
    finally:
        e.agent.env = normal
        if e.agent.process.popen is None or e.agent.process.popen.poll() is not None:
            e.agent.restart()
    got = wait_until("prepare after the restart", lambda: prepare_or_none(e, claim))
    assert got.error == "", got.error
    uuid = cdi_uuid(e, claim)
    start = int(device(claim).rsplit("-", 1)[1])
    mine = [p for p in journal(e)["partitions"] if p["profile"] == "2g.10gb"]
    assert [(p["start"], p["uuid"], p["owner"]) for p in mine] == [
        (start, uuid, f"claim:{claim['metadata']['uid']}")]
    assert "adopted the 2g.10gb partition" in e.agent.process.log_path.read_text()


def prepare_or_none(e: Env, claim: dict[str, Any]) -> Any:
    """Prepare's answer; None while the plugin is not there or not ready (a restart)."""
    try:
        got = prepare(e, claim)
    except grpc.RpcError:
        return None
    return None if "not ready" in got.error else got
