"""Dynamic MIG on Kubernetes (issue 20, item 4; docs/mig.md): a pod asking
``tessera.io/gpu-mig-profile`` is bound by tessera-scheduler to a node whose GPU is in MIG mode,
with the GPU and slot it chose; tessera-node there makes (or reuses) the partition through NVML
and writes its MIG UUID into the pod's ConfigMap. Real API server, the real scheduler process,
the real tessera-node on the fake NVML with its GPU in MIG mode (``FAKE_GPU_MIG_0=1``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, PodSpec, Toleration
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from tessera.kube import names
from tessera.kube.api_backend import KubeBackend
from tessera.kube.objects import ProjectResource
from tessera.testing.cluster import TestCluster
from tessera.testing.node_agents import NodeAgents
from tests.kube.mig_nodes import agent_env, mig_node_agents, pod_gone
from tests.kube.mig_nodes import partitions as mig_partitions
from tests.kube.scheduler_env import (
    SchedulerEnv,
    bound,
    events,
    get_pod,
    make_project,
    scheduled_false,
)
from tests.waiting import wait_until

NODE = "migk-node-0"
TAINT = "tessera.io/migk-test"


@pytest.fixture(scope="module")
def mig_node(kube_cluster: TestCluster, kube_client: Client) -> Iterator[NodeAgents]:
    """One A100-40GB in MIG mode and its tessera-node (tests.kube.mig_nodes)."""
    with mig_node_agents(kube_cluster, kube_client, NODE, 210, TAINT) as agents:
        yield agents


def mig_pod(client: Client, ns: str, name: str, profile: str,
            annotations: dict[str, str] | None = None) -> None:
    client.create(Pod(
        metadata=ObjectMeta(name=name, namespace=ns,
                            annotations={names.MIG_PROFILE: profile, **(annotations or {})}),
        spec=PodSpec(schedulerName=names.SCHEDULER_NAME,
                     tolerations=[Toleration(key=TAINT, operator="Exists", effect="NoSchedule")],
                     containers=[Container(name="main", image="example.invalid/cuda:12")]),
    ))


def mig_uuid(client: Client, ns: str, pod: str) -> str:
    """The MIG UUID tessera-node wrote into the pod's ConfigMap (waited for)."""
    def get() -> str | None:
        try:
            cm = client.get(ConfigMap, f"{pod}-tessera-gpu", namespace=ns)
        except ApiError:
            return None
        return (cm.data or {}).get("NVIDIA_VISIBLE_DEVICES")
    return wait_until(f"MIG UUID of {pod}", get)


CI_FAILS = "nvmlGpuInstanceCreateComputeInstance=23"
"""FAKE_NVML_FAIL: NVML's compute-instance create fails (Insufficient resources)."""


def partitions(client: Client) -> list[dict[str, Any]]:
    return mig_partitions(client, NODE)


def event_message(client: Client, ns: str, pod: str, reason: str) -> str | None:
    """The message of the pod's first Event of ``reason``, or None."""
    return next((e.message for e in events(client, ns, pod) if e.reason == reason), None)


def gone(client: Client, ns: str, pod: str) -> None:
    pod_gone(client, ns, pod)


def test_partitions_made_reused_and_removed_on_demand(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents, tmp_path: Path) -> None:
    mig_pod(kube_client, project, "mig-a", "MIG 3g.20gb")
    [a] = bound(kube_client, project, "mig-a")
    assert a.spec is not None and a.spec.nodeName == NODE
    ann = a.metadata.annotations if a.metadata else {}
    hold = json.loads(ann[names.MIG_PARTITION])
    assert hold["profile"] == "3g.20gb" and hold["start"] in (0, 4) and hold["remove"] == []
    assert hold["gpu"] == mig_node.agents[NODE].uuids[0]
    placement = json.loads(ann[names.PLACEMENT])
    assert placement["devices"] == [] and placement["gpus"] == pytest.approx(3 / 7, abs=1e-3)
    first = mig_uuid(kube_client, project, "mig-a")
    assert first.startswith("MIG-")
    made = wait_until("the partition in the inventory", lambda: [
        p for p in partitions(kube_client) if p["uuid"] == first] or None)
    assert made == [{"profile": "3g.20gb", "start": hold["start"], "uuid": first,
                     "managed": True}]

    # The first pod ends: its partition stays, idle, and the next pod of that profile gets it.
    gone(kube_client, project, "mig-a")
    mig_pod(kube_client, project, "mig-b", "3g.20gb")
    bound(kube_client, project, "mig-b")
    assert mig_uuid(kube_client, project, "mig-b") == first
    # The API's cluster document (tessera top) lists the MIG GPU and who holds the partition.
    backend = KubeBackend(kube_client, tmp_path)
    try:
        want = [{"index": 0, "uuid": hold["gpu"], "model": "A100-40GB", "partitions": [{
            "profile": "3g.20gb", "start": hold["start"], "slots": 4, "uuid": first,
            "managed": True, "workload": "mig-b",
            # the holder's project label, as for shares (this test's pods carry none)
            "project": (kube_client.get(Pod, "mig-b", namespace=project).metadata.labels  # type: ignore[union-attr]
                        or {}).get(names.PROJECT, "")}]}]

        def mig_doc() -> list[dict[str, Any]] | None:
            node = next((n for n in backend.cluster()["nodes"] if n["name"] == NODE), None)
            return node.get("migGpus") if node else None
        wait_until("the MIG GPU in the cluster document", lambda: mig_doc() == want or None)
    finally:
        backend.stop()

    # No room for a whole-GPU profile while mig-b holds half of it: Pending, saying what exists.
    mig_pod(kube_client, project, "mig-c", "7g.40gb")
    why = wait_until("mig-c pending", lambda: scheduled_false(kube_client, project, "mig-c"))
    assert (f"no room for MIG 7g.40gb on their MIG GPUs ({NODE} A100-40GB: "
            f"3g.20gb@{hold['start']} busy)") in why, why

    # mig-b ends: the idle 3g.20gb is removed only now, for the 7g.40gb.
    gone(kube_client, project, "mig-b")
    [c] = bound(kube_client, project, "mig-c")
    c_hold = json.loads((c.metadata.annotations or {})[names.MIG_PARTITION])
    assert c_hold["start"] == 0 and c_hold["remove"] == [hold["start"]]
    whole = mig_uuid(kube_client, project, "mig-c")
    assert whole.startswith("MIG-") and whole != first
    assert wait_until("only the 7g.40gb left", lambda: [
        p["profile"] for p in partitions(kube_client)] == ["7g.40gb"] or None)


def test_profile_no_gpu_has_waits_with_a_reason(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents) -> None:
    mig_pod(kube_client, project, "mig-80", "3g.40gb")  # an A100-80GB / H100 profile
    why = wait_until("mig-80 pending", lambda: scheduled_false(kube_client, project, "mig-80"))
    assert ("no GPU in MIG mode has profile 3g.40gb (MIG profiles here: A100-40GB: 1g.5gb, "
            "1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)") in why, why
    assert get_pod(kube_client, project, "mig-80").spec.nodeName is None


def test_profile_counts_as_its_fraction_in_quota(
        env: SchedulerEnv, kube_client: Client, kube_namespace: str,
        mig_node: NodeAgents) -> None:
    """A project limited to 0.5 GPU: a 3g.20gb (0.429) runs, a 1g.5gb (0.143) more waits."""
    ns = kube_namespace
    make_project(kube_client, ns, ns, deserved=0.5, limit=0.5)
    try:
        mig_pod(kube_client, ns, "q-a", "3g.20gb")
        bound(kube_client, ns, "q-a")
        mig_pod(kube_client, ns, "q-b", "1g.5gb")
        why = wait_until("q-b pending", lambda: scheduled_false(kube_client, ns, "q-b"))
        assert f"project {ns} is at its limit of 0.5 GPU: 0.43 in use, this needs 0.14 more" \
            in why, why
        assert get_pod(kube_client, ns, "q-b").spec.nodeName is None
    finally:
        for pod in ("q-a", "q-b"):
            gone(kube_client, ns, pod)


def test_agent_killed_mid_create_adopts_the_partition(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents) -> None:
    """tessera-node killed (SIGKILL) right after it made the GPU instance of a pod's partition:
    restarted, it adopts that instance from its journal and gives it to the pod; never a
    second one."""
    agent = mig_node.agents[NODE]
    normal = dict(agent.env)
    agent.kill9()
    agent.env = {**normal, "TESSERA_FAULT_POINT": "mig-create-gi"}
    agent.restart()
    try:
        mig_pod(kube_client, project, "mig-crash", "2g.10gb")
        bound(kube_client, project, "mig-crash")
        assert agent.process.popen is not None
        wait_until("the agent killed at the fault point",
                   lambda: agent.process.popen is not None and agent.process.popen.poll()
                   is not None)
    finally:
        agent.env = normal
        if agent.process.popen is None or agent.process.popen.poll() is not None:
            agent.restart()
    uuid = mig_uuid(kube_client, project, "mig-crash")
    made = wait_until("one 2g.10gb in the inventory", lambda: [
        p for p in partitions(kube_client) if p["profile"] == "2g.10gb"] or None)
    assert [p["uuid"] for p in made] == [uuid]
    assert "adopted the 2g.10gb partition" in agent.process.log_path.read_text()


def test_nvml_error_is_the_reason_and_nothing_is_left(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents) -> None:
    """The compute instance fails (NVML error injected into the fake): the pod gets a Warning
    Event with NVML's error, no GPU instance is left, its container gets no UUID; once the
    error is gone tessera-node makes the partition at the next sync."""
    with agent_env(mig_node.agents[NODE], FAKE_NVML_FAIL=CI_FAILS):
        mig_pod(kube_client, project, "mig-fail", "1g.5gb")
        bound(kube_client, project, "mig-fail")
        message = wait_until("MIGPartitionFailed",
                             lambda: event_message(kube_client, project, "mig-fail",
                                                   "MIGPartitionFailed"))
        assert "MIG 1g.5gb on GPU" in message and \
            "creating the compute instance of 1g.5gb" in message, message
        assert not [p for p in partitions(kube_client) if p["profile"] == "1g.5gb"]
        cm = kube_client.get(ConfigMap, "mig-fail-tessera-gpu", namespace=project)
        assert "NVIDIA_VISIBLE_DEVICES" not in (cm.data or {})
    uuid = mig_uuid(kube_client, project, "mig-fail")
    assert wait_until("the 1g.5gb made", lambda: [
        p["uuid"] for p in partitions(kube_client) if p["profile"] == "1g.5gb"] == [uuid] or None)


def test_submitted_through_the_api(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents, tmp_path: Path) -> None:
    """``tessera submit --gpu-mig-profile`` on the Kubernetes backend: the pod carries the
    annotation, is given a partition, and the workload counts the profile's fraction; a profile
    no GPU here has, and one over the project's limit, are refused naming the field."""
    from tessera.api.backend import WorkloadSubmission
    from tessera.core.errors import InvalidRequest
    from tessera.core.model import GpuRequest
    from tessera.kube.objects import ProjectResource

    def submission(name: str, profile: str, workers: int = 1) -> WorkloadSubmission:
        return WorkloadSubmission(
            name=name, project=project, type="Training", gpu=GpuRequest.none(),
            command=["python", "train.py"], workers=workers,
            spec={"command": "python", "compute": {"gpuMigProfile": profile}},
            mig_profile=profile)

    backend = KubeBackend(kube_client, tmp_path)
    # The MIG node's taint keeps other tests' pods off; an API-made pod has no toleration.
    node = kube_client.get(Node, NODE)
    taints = node.spec.taints if node.spec else None
    kube_client.patch(Node, NODE, {"spec": {"taints": None}})
    try:
        for profile, says in [
            ("3g.40gb", "spec.compute.gpuMigProfile: no GPU in MIG mode on this cluster has "
                        "this profile (MIG profiles here: A100-40GB: 1g.5gb, 1g.10gb, 2g.10gb, "
                        "3g.20gb, 4g.20gb, 7g.40gb)"),
        ]:
            with pytest.raises(InvalidRequest) as err:
                backend.submit(submission("api-bad", profile))
            assert says in str(err.value), str(err.value)
        kube_client.patch(ProjectResource, project,
                          {"spec": {"resources": {"gpu": {"deserved": 0.5, "limit": 0.5}}}},
                          patch_type=PatchType.MERGE)
        with pytest.raises(InvalidRequest) as err:
            backend.submit(submission("api-two", "3g.20gb", workers=2))
        assert (f"spec.compute.gpuMigProfile: counts as 0.858 GPU (2 x 0.429), more than "
                f"project {project}'s limit 0.5") in str(err.value), str(err.value)
        kube_client.patch(ProjectResource, project,
                          {"spec": {"resources": {"gpu": {"deserved": 4, "limit": None}}}},
                          patch_type=PatchType.MERGE)
        doc = backend.submit(submission("api-mig", "3g.20gb"))
        assert doc["gpus"]["request"] == "MIG 3g.20gb"
        assert doc["gpus"]["requested"] == pytest.approx(3 / 7, abs=1e-3)
        assert doc["spec"]["compute"] == {"gpuMigProfile": "3g.20gb"}
        [pod] = bound(kube_client, project, "api-mig-0")
        assert (pod.metadata.annotations or {})[names.MIG_PROFILE] == "3g.20gb"
        assert mig_uuid(kube_client, project, "api-mig-0").startswith("MIG-")
        got = backend.workload(doc["workloadId"])
        assert got["gpus"]["allocated"] == pytest.approx(3 / 7, abs=1e-3)
        [p] = got["pods"]
        assert p["migPartition"]["profile"] == "3g.20gb" and p["migPartition"]["gpu"] == \
            mig_node.agents[NODE].uuids[0]
        backend.delete_workload(doc["workloadId"])
    finally:
        kube_client.patch(Node, NODE, {"spec": {"taints": [t.to_dict() for t in taints or []]}})
        backend.stop()


def test_mig_mode_switched_under_a_running_agent_is_followed(
        kube_cluster: TestCluster, kube_client: Client, tmp_path: Path) -> None:
    """An operator switches a GPU into MIG mode (``nvidia-smi -mig 1`` and a reset; the fake
    reads the mode from a file) while tessera-node runs: the node's inventory says so within a
    few syncs, with no restart, and back again when MIG mode goes off."""
    name = "migk-node-switch"
    modes = tmp_path / "mig-modes"
    modes.mkdir()
    node = mig_node_agents(kube_cluster, kube_client, name, 211, TAINT,
                           env={"FAKE_GPU_MIG_MODE_DIR": str(modes)})

    def mig_mode() -> bool | None:
        ann = kube_client.get(Node, name).metadata.annotations or {}
        raw = ann.get(names.NODE_GPU_INVENTORY)
        return None if raw is None else bool(json.loads(raw)["gpus"][0]["mig"])
    with node as agents:
        assert wait_until("the inventory", lambda: mig_mode() is not None or None)
        assert mig_mode() is False
        (modes / "0").write_text("1")
        wait_until("MIG mode on in the inventory", lambda: mig_mode() is True or None)
        log = agents.agents[name].process.log_path.read_text()
        assert "MIG mode is now on (an operator's change)" in log, log
        (modes / "0").write_text("0")
        wait_until("MIG mode off again", lambda: mig_mode() is False or None)


# ---- reclaim and preemption make MIG room (tessera.core.cycle.mig_room) -------------------------

def _holds(client: Client, ns: str, *pods: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name in pods:
        p = get_pod(client, ns, name)
        out[name] = json.loads((p.metadata.annotations if p.metadata else {})[names.MIG_PARTITION])
    return out


def _left(client: Client, ns: str) -> set[str]:
    return {p.metadata.name for p in client.list(Pod, namespace=ns) if p.metadata and p.metadata.name}


def test_reclaim_frees_a_mig_slot_for_a_project_below_its_deserved_quota(
        env: SchedulerEnv, kube_cluster: TestCluster, kube_client: Client,
        project: str, mig_node: NodeAgents) -> None:
    """A project with no deserved GPUs holds both 3g.20gb of the A100-40GB; a project asking
    its deserved quota for a 3g.20gb gets one: one holder is evicted (Reclaimed) and the new pod
    is bound on the victim's partition, which tessera-node gives it as it is (same MIG UUID)."""
    hog = project
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    for name in ("hog-0", "hog-1"):
        mig_pod(kube_client, hog, name, "3g.20gb")
    bound(kube_client, hog, "hog-0", "hog-1")
    holds = _holds(kube_client, hog, "hog-0", "hog-1")
    made = {name: mig_uuid(kube_client, hog, name) for name in holds}
    starved = f"{hog}-b"
    kube_cluster.kubectl("create", "namespace", starved)
    make_project(kube_client, starved, starved, deserved=1)
    try:
        mig_pod(kube_client, starved, "taker", "3g.20gb")
        bound(kube_client, starved, "taker")
        left = _left(kube_client, hog)
        assert len(left) == 1, left
        (victim,) = {"hog-0", "hog-1"} - left
        wait_until("the Reclaimed event", lambda: [
            e for e in events(kube_client, hog, victim) if e.reason == "Reclaimed"] or None)
        hold = _holds(kube_client, starved, "taker")["taker"]
        assert (hold["gpu"], hold["start"], hold["remove"]) == (
            holds[victim]["gpu"], holds[victim]["start"], [])
        assert mig_uuid(kube_client, starved, "taker") == made[victim]
    finally:
        gone(kube_client, starved, "taker")


def test_preemption_within_a_project_frees_a_mig_slot(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents) -> None:
    """Two train pods hold both 3g.20gb; an inference pod of the same project preempts one
    (Preempted) and is bound on its slot."""
    ns = project
    for name in ("low-0", "low-1"):
        mig_pod(kube_client, ns, name, "3g.20gb")
    bound(kube_client, ns, "low-0", "low-1")
    holds = _holds(kube_client, ns, "low-0", "low-1")
    mig_pod(kube_client, ns, "urgent", "3g.20gb", {names.PRIORITY_CLASS: "inference"})
    bound(kube_client, ns, "urgent")
    left = _left(kube_client, ns)
    assert "urgent" in left and len(left & {"low-0", "low-1"}) == 1, left
    (victim,) = {"low-0", "low-1"} - left
    wait_until("the Preempted event", lambda: [
        e for e in events(kube_client, ns, victim) if e.reason == "Preempted"] or None)
    assert _holds(kube_client, ns, "urgent")["urgent"]["start"] == holds[victim]["start"]


def test_no_pod_is_evicted_when_no_eviction_makes_room(
        env: SchedulerEnv, kube_cluster: TestCluster, kube_client: Client,
        project: str, mig_node: NodeAgents) -> None:
    """A 7g.40gb needs the whole GPU; half of it is held by a pod of the asking project itself
    (same priority: not a victim), so evicting the other project's pod would not make room:
    nobody is evicted and the pod waits with the reason."""
    hog = project
    kube_client.patch(ProjectResource, hog, {"spec": {"resources": {"gpu": {"deserved": 0}}}},
                      patch_type=PatchType.MERGE)
    mig_pod(kube_client, hog, "hog-0", "3g.20gb")
    bound(kube_client, hog, "hog-0")
    starved = f"{hog}-b"
    kube_cluster.kubectl("create", "namespace", starved)
    make_project(kube_client, starved, starved, deserved=4)
    try:
        mig_pod(kube_client, starved, "mine", "3g.20gb")
        bound(kube_client, starved, "mine")
        mig_pod(kube_client, starved, "big", "7g.40gb")
        why = wait_until("big pending", lambda: scheduled_false(kube_client, starved, "big"))
        assert "no room for MIG 7g.40gb" in why, why
        assert _left(kube_client, hog) == {"hog-0"}
        assert not [e for e in events(kube_client, hog, "hog-0")
                    if e.reason in ("Reclaimed", "Preempted")]
    finally:
        for pod in ("mine", "big"):
            gone(kube_client, starved, pod)


def test_a_pod_whose_slot_an_operator_took_is_evicted_to_be_placed_again(
        env: SchedulerEnv, kube_client: Client, project: str,
        mig_node: NodeAgents, tmp_path: Path) -> None:
    """A pod bound to a slot whose partition tessera-node could not make yet (NVML failing),
    where an operator then makes a partition of their own: its partition can never be made, so
    the scheduler evicts it (Event MIGSlotTaken) instead of leaving it bound for ever."""
    import subprocess
    import sys

    # Earlier tests' idle partitions go first: a whole-GPU partition made and left idle, which
    # the pod below has removed for its own (and its own then fails), so the GPU is empty.
    mig_pod(kube_client, project, "mig-whole", "7g.40gb")
    mig_uuid(kube_client, project, "mig-whole")
    gone(kube_client, project, "mig-whole")
    operator = tmp_path / "operator-journal.json"

    def node_mig(env: dict[str, str], *args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "tessera.node", "mig", *args, "--journal",
                            str(operator)], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    made: dict[str, Any] = {}
    with agent_env(mig_node.agents[NODE], FAKE_NVML_FAIL=CI_FAILS) as normal:
        try:
            mig_pod(kube_client, project, "mig-taken", "2g.10gb")
            [pod] = bound(kube_client, project, "mig-taken")
            hold = json.loads((pod.metadata.annotations or {})[names.MIG_PARTITION])
            wait_until("the idle 7g.40gb removed", lambda: not partitions(kube_client) or None)
            made = json.loads(node_mig(normal, "create", "0", "1g.5gb", str(hold["start"]),
                                       "--json"))
            message = wait_until("MIGSlotTaken", lambda: event_message(
                kube_client, project, "mig-taken", "MIGSlotTaken"))
            assert (f"its MIG 2g.10gb at memory slot {hold['start']} of GPU {hold['gpu']} cannot "
                    f"be made: a 1g.5gb partition tessera did not make now sits at memory slot "
                    f"{hold['start']}") in message, message
            wait_until("mig-taken deleted", lambda: not [
                p for p in kube_client.list(Pod, namespace=project)
                if p.metadata.name == "mig-taken"] or None)
        finally:
            if made:
                node_mig(normal, "remove", "0", str(made["gi"]))
