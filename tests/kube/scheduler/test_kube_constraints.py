"""Kubernetes constraints honoured end to end: tessera-scheduler (a real process under the
ServiceAccount of deploy/rbac.yaml) on the real API server, with the manifests a user writes.

The five cases issue 13 found ignored (nodeSelector naming another node, nodeSelector on a
label no node has, a NoSchedule taint without toleration, required node affinity for another
GPU model, required pod anti-affinity per hostname), plus pod affinity, a gang kept apart,
topology spread, unbound claims, and the Scheduled event.

The module's own nodes (prefix ``cst-``) carry a label ``tessera-test: constraints``; pods that
must land on them select it, so other modules' nodes never stand in.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod

from tessera.kube import names
from tessera.kube.objects import ProjectResource
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
MINE = {"tessera-test": "constraints"}




class Env:
    def __init__(self, cluster: TestCluster, client: Client) -> None:
        self.cluster = cluster
        self.client = client
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        # Three CPU nodes in two zones, and one A100 node (its tessera-node started too).
        self.cpu = cluster.create_gpu_nodes(3, NodeShape(gpus=0), prefix="cst-")
        self.a100 = cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="A100-80GB"), prefix="cst-a100-")
        zones = {"cst-0": "z1", "cst-1": "z1", "cst-2": "z2", "cst-a100-0": "z2"}
        for n, z in zones.items():
            cluster.kubectl("label", "node", n, f"topology.kubernetes.io/zone={z}", "tessera-test=constraints",
                            "disktype=hdd")
        # Topology: rack r1 = cst-a100-0 (2 GPUs), rack r2 = three more A100 nodes (6 GPUs);
        # NVLink cliques c1 = {topo-0, topo-1}, c2 = {topo-2}.
        self.topo = cluster.create_gpu_nodes(3, NodeShape(gpus=2, model="A100-80GB"), prefix="cst-topo-")
        self.a100 += self.topo
        cluster.kubectl("label", "node", "cst-a100-0", "tessera.io/topology-rack=r1")
        for n, clique in zip(self.topo, ("c1", "c1", "c2"), strict=True):
            cluster.kubectl("label", "node", n, "tessera.io/topology-rack=r2", f"nvidia.com/gpu.clique={clique}")
        assert cluster.workdir is not None
        kubeconfig = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-scheduler")
        self.log = (cluster.workdir / "logs" / "constraints-scheduler.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera.kube.scheduler", f"--kubeconfig={kubeconfig}",
             "--lease-duration=6", "--identity=constraints"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
        self.log.close()
        for agents in list(self.cluster.node_agents):
            if any(n in agents.agents for n in self.a100):
                self.cluster.node_agents.remove(agents)
                agents.stop()
        for n in self.cpu + self.a100:
            with contextlib.suppress(ApiError):
                self.client.delete(Node, n)


@pytest.fixture(scope="module")
def env(kube_cluster: TestCluster, kube_client: Client) -> Iterator[Env]:
    e = Env(kube_cluster, kube_client)
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def ns(env: Env, kube_client: Client, kube_namespace: str) -> Iterator[str]:
    kube_client.create(ProjectResource(metadata=ObjectMeta(name=kube_namespace),
                                       spec={"namespace": kube_namespace, "resources": {"gpu": {"deserved": 4}}}))
    yield kube_namespace
    for pod in kube_client.list(Pod, namespace=kube_namespace):
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, pod.metadata.name, namespace=kube_namespace, grace_period=0)
    wait_until("test pods gone", lambda: not list(kube_client.list(Pod, namespace=kube_namespace)))


_files = iter(range(10**6))


def apply(env: Env, ns: str, manifest: str) -> None:
    """kubectl apply, as a user would, of a manifest file."""
    assert env.cluster.workdir is not None
    path = env.cluster.workdir / f"constraints-{next(_files)}.yaml"
    path.write_text(manifest)
    env.cluster.kubectl("apply", "-n", ns, "-f", str(path))


def pod_yaml(name: str, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, cpu: str = "1") -> str:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"schedulerName": "tessera", "containers": [
            {"name": "main", "image": "example.invalid/app:1", "resources": {"requests": {"cpu": cpu}}}],
            **(spec or {})},
    }
    return yaml.safe_dump(body)


def node_of(client: Client, ns: str, name: str, timeout: float = 30.0) -> str:
    def check() -> str | None:
        p = client.get(Pod, name, namespace=ns)
        return p.spec.nodeName if p.spec else None
    return str(wait_until(f"{name} bound", check, timeout))


def pending_reason(client: Client, ns: str, name: str, timeout: float = 30.0, contains: str = "") -> str:
    """The pod's PodScheduled=False message (once it holds ``contains``); never bound meanwhile."""
    def check() -> str | None:
        p = client.get(Pod, name, namespace=ns)
        assert not (p.spec and p.spec.nodeName), f"{name} was bound to {p.spec.nodeName}"
        for c in (p.status.conditions if p.status else None) or []:
            if c.type == "PodScheduled" and c.status == "False" and c.message and contains in c.message:
                return str(c.message)
        return None
    return str(wait_until(f"{name} pending with a reason", check, timeout))


def still_pending(client: Client, ns: str, name: str, seconds: float = 2.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        p = client.get(Pod, name, namespace=ns)
        assert not p.spec.nodeName, f"{name} was bound to {p.spec.nodeName}"
        time.sleep(0.2)


def test_node_selector_naming_another_node_and_scheduled_event(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, pod_yaml("pinned", {"nodeSelector": {"kubernetes.io/hostname": "cst-2"}}))
    assert node_of(kube_client, ns, "pinned") == "cst-2"
    events = wait_until("Scheduled event", lambda: [
        e for e in kube_client.list(Event, namespace=ns) if e.reason == "Scheduled"
        and e.involvedObject.name == "pinned"])
    assert events[0].message == f"Successfully assigned {ns}/pinned to cst-2"


def test_node_selector_on_a_label_no_node_has_waits_with_the_reason(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, pod_yaml("ssd", {"nodeSelector": {"disktype": "ssd"}}))
    reason = pending_reason(kube_client, ns, "ssd")
    total = len(list(kube_client.list(Node)))
    assert reason.startswith(f"0/{total} nodes are available: ")
    assert "didn't match nodeSelector disktype=ssd" in reason
    still_pending(kube_client, ns, "ssd")
    warnings = [e for e in kube_client.list(Event, namespace=ns) if e.reason == "FailedScheduling"]
    assert warnings and "disktype=ssd" in (warnings[0].message or "")


def test_no_schedule_taint_without_toleration(env: Env, kube_client: Client, ns: str) -> None:
    env.cluster.kubectl("taint", "node", "cst-1", "maintenance=true:NoSchedule")
    try:
        apply(env, ns, pod_yaml("intolerant", {"nodeSelector": {"kubernetes.io/hostname": "cst-1"}}))
        reason = pending_reason(kube_client, ns, "intolerant")
        assert "1 had untolerated taint maintenance=true:NoSchedule" in reason
        apply(env, ns, pod_yaml("tolerant", {
            "nodeSelector": {"kubernetes.io/hostname": "cst-1"},
            "tolerations": [{"key": "maintenance", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}))
        assert node_of(kube_client, ns, "tolerant") == "cst-1"
        # untainting lets the waiting pod in
        env.cluster.kubectl("taint", "node", "cst-1", "maintenance=true:NoSchedule-")
        assert node_of(kube_client, ns, "intolerant") == "cst-1"
    finally:
        env.cluster.kubectl("taint", "node", "cst-1", "maintenance=true:NoSchedule-", check=False)


def test_required_node_affinity_for_an_a100(env: Env, kube_client: Client, ns: str) -> None:
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}}
    apply(env, ns, pod_yaml("a100", affinity, annotations={names.GPU_PORTION: "0.5"}))
    # any A100 node of the (shared) test cluster is right; what matters is the label it matched
    node = kube_client.get(Node, node_of(kube_client, ns, "a100", timeout=60))
    assert (node.metadata.labels or {})["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    # the same affinity for a model no node has: waits, never bound
    none = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-B200"]}]}]}}}}
    apply(env, ns, pod_yaml("b200", none, annotations={names.GPU_PORTION: "0.5"}))
    assert "didn't match Pod's node affinity (nvidia.com/gpu.product in (NVIDIA-B200))" in \
        pending_reason(kube_client, ns, "b200")


def anti_host(app: str) -> dict[str, Any]:
    return {"nodeSelector": MINE, "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}}


def test_required_pod_anti_affinity_per_hostname(env: Env, kube_client: Client, ns: str) -> None:
    docs = "---\n".join(pod_yaml(f"web-{i}", anti_host("web"), {"app": "web"}) for i in range(4))
    apply(env, ns, docs)
    nodes = [node_of(kube_client, ns, f"web-{i}", timeout=60) for i in range(4)]
    assert len(set(nodes)) == 4, nodes
    apply(env, ns, pod_yaml("web-4", anti_host("web"), {"app": "web"}))
    reason = pending_reason(kube_client, ns, "web-4")
    # as kube-scheduler: the existing pods' (symmetric) anti-affinity is checked first
    assert "4 didn't satisfy existing pods anti-affinity rules" in reason
    assert "may use" not in reason


def test_a_gang_kept_apart_by_anti_affinity(env: Env, kube_client: Client, ns: str) -> None:
    """Two gang members placed in one cycle still see each other."""
    pg = {"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "pair"},
          "spec": {"minMember": 2}}
    docs = [yaml.safe_dump(pg)] + [pod_yaml(f"w{i}", anti_host("pair"), {"app": "pair", names.POD_GROUP: "pair"})
                                   for i in range(2)]
    apply(env, ns, "---\n".join(docs))
    a, b = node_of(kube_client, ns, "w0"), node_of(kube_client, ns, "w1")
    assert a != b


def test_pod_affinity_follows_its_peer_into_the_zone(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, pod_yaml("cache", {"nodeSelector": {"kubernetes.io/hostname": "cst-2"}}, {"app": "cache"}))
    assert node_of(kube_client, ns, "cache") == "cst-2"
    near = {"nodeSelector": MINE, "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}}
    docs = "---\n".join(pod_yaml(f"near-{i}", near, cpu="100m") for i in range(3))
    apply(env, ns, docs)
    assert {node_of(kube_client, ns, f"near-{i}") for i in range(3)} <= {"cst-2", "cst-a100-0"}


def test_topology_spread_across_zones(env: Env, kube_client: Client, ns: str) -> None:
    spec = {"nodeSelector": {"disktype": "hdd", **MINE}, "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"app": "spread"}}}]}
    apply(env, ns, "---\n".join(pod_yaml(f"s{i}", spec, {"app": "spread"}, cpu="100m") for i in range(4)))
    zones = {"cst-0": "z1", "cst-1": "z1", "cst-2": "z2", "cst-a100-0": "z2"}
    placed = [zones[node_of(kube_client, ns, f"s{i}")] for i in range(4)]
    assert placed.count("z1") == placed.count("z2") == 2, placed


def test_unbound_claim_waits_with_a_reason(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, pod_yaml("data", {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}))
    assert pending_reason(kube_client, ns, "data") == 'persistentvolumeclaim "data" not found'


def gang_yaml(name: str, size: int, annotations: dict[str, str], gpus: int = 1) -> str:
    pg = {"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
          "spec": {"minMember": size}}
    docs = [yaml.safe_dump(pg)]
    for i in range(size):
        body = yaml.safe_load(pod_yaml(f"{name}-{i}", annotations={
            **annotations, names.POD_GROUP: name, names.GPU_MODEL: "A100-80GB"}, cpu="1"))
        body["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
        docs.append(yaml.safe_dump(body))
    return "---\n".join(docs)


RACK = {"cst-a100-0": "r1", "cst-topo-0": "r2", "cst-topo-1": "r2", "cst-topo-2": "r2"}


def test_a_gang_of_4_kept_in_one_rack_and_the_next_waits(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, gang_yaml("train", 4, {"tessera.io/topology-required": "rack"}))
    nodes = [node_of(kube_client, ns, f"train-{i}", timeout=60) for i in range(4)]
    assert {RACK[n] for n in nodes} == {"r2"}, nodes
    # 2 GPUs free in r1 and 2 in r2: 4 free, but no rack holds 4
    apply(env, ns, gang_yaml("next", 4, {"tessera.io/topology-required": "rack"}))
    reason = pending_reason(kube_client, ns, "next-0", contains="outside")
    assert "were outside the workload's rack" in reason and "tessera.io/topology-required" in reason, reason
    still_pending(kube_client, ns, "next-3")


def test_kai_spelling_keeps_a_pair_in_one_nvlink_clique(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, gang_yaml("pair", 2, {"kai.scheduler/topology-required-placement": "nvidia.com/gpu.clique"},
                             gpus=2))
    a, b = (node_of(kube_client, ns, f"pair-{i}", timeout=60) for i in range(2))
    clique = {"cst-topo-0": "c1", "cst-topo-1": "c1", "cst-topo-2": "c2"}
    assert a in clique and b in clique and clique[a] == clique[b] == "c1", (a, b)


def test_an_unknown_topology_level_waits_naming_the_annotation(env: Env, kube_client: Client, ns: str) -> None:
    apply(env, ns, pod_yaml("shelf", annotations={"tessera.io/topology-required": "shelf"}))
    reason = pending_reason(kube_client, ns, "shelf")
    assert "tessera.io/topology-required" in reason and "shelf" in reason, reason


# ---- consolidation -------------------------------------------------------------------------------

def owned_pod(env: Env, ns: str, name: str, rs: dict[str, Any], labels: dict[str, str], portion: str) -> None:
    """A pod as a ReplicaSet's controller would create it (the test cluster runs no controllers)."""
    body = yaml.safe_load(pod_yaml(name, {"nodeSelector": {"nvidia.com/gpu.clique": "c1"}}, labels,
                                   annotations={names.GPU_PORTION: portion, names.GPU_MODEL: "A100-80GB"},
                                   cpu="100m"))
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                            "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                                            "controller": True}]
    apply(env, ns, yaml.safe_dump(body))


def replica_set(env: Env, ns: str, name: str, app: str) -> dict[str, Any]:
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"app": app}},
                   "template": {"metadata": {"labels": {"app": app}}, "spec": {
                       "schedulerName": "tessera", "containers": [{"name": "main", "image": "example.invalid/app:1"}]}}}}
    apply(env, ns, yaml.safe_dump(rs))
    out = env.cluster.kubectl("get", "replicaset", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out))


def whole(name: str, host: str) -> str:
    body = yaml.safe_load(pod_yaml(name, {"nodeSelector": {"kubernetes.io/hostname": host}},
                                   annotations={names.GPU_MODEL: "A100-80GB"}, cpu="100m"))
    body["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    return yaml.safe_dump(body)


def events_of(client: Client, ns: str, name: str, reason: str) -> list[Event]:
    return [e for e in client.list(Event, namespace=ns) if e.involvedObject.name == name and e.reason == reason]


def test_consolidation_moves_a_replicaset_pod_unless_a_pdb_forbids(env: Env, kube_client: Client, ns: str) -> None:
    # topo-1 full (two whole-GPU blockers); two 0.6 shares of ReplicaSet pods then take both GPUs of topo-0
    apply(env, ns, whole("block-0", "cst-topo-1") + "---\n" + whole("block-1", "cst-topo-1"))
    assert node_of(kube_client, ns, "block-1", timeout=60) == "cst-topo-1"

    def fill(app: str) -> None:
        rs = replica_set(env, ns, app, app)
        for i in range(2):
            owned_pod(env, ns, f"{app}-{i}", rs, {"app": app}, "0.6")
        assert {node_of(kube_client, ns, f"{app}-{i}", timeout=60) for i in range(2)} == {"cst-topo-0"}

    # (1) a PodDisruptionBudget forbids evicting them: nothing moves, the whole-GPU pod waits
    fill("guarded")
    apply(env, ns, yaml.safe_dump({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                   "metadata": {"name": "guarded"},
                                   "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}))
    kube_client.delete(Pod, "block-0", namespace=ns, grace_period=0)  # a free GPU on topo-1
    apply(env, ns, whole("needs-whole", "cst-topo-0"))
    refused = wait_until("NotMoved event", lambda: [e for i in range(2)
                                                    for e in events_of(kube_client, ns, f"guarded-{i}", "NotMoved")], 60)
    assert "disruption budget" in (refused[0].message or ""), refused[0].message
    still_pending(kube_client, ns, "needs-whole", 3.0)
    assert all(kube_client.get(Pod, f"guarded-{i}", namespace=ns).metadata.deletionTimestamp is None
               for i in range(2))
    for p in ("needs-whole", "guarded-0", "guarded-1"):
        kube_client.delete(Pod, p, namespace=ns, grace_period=0)
    wait_until("guarded pods gone", lambda: not [p for p in kube_client.list(Pod, namespace=ns)
                                                 if p.metadata.name.startswith(("guarded", "needs"))])

    # (2) without a budget: one is evicted (its ReplicaSet would recreate it) and the pod binds
    apply(env, ns, whole("block-2", "cst-topo-1"))
    assert node_of(kube_client, ns, "block-2", timeout=60) == "cst-topo-1"
    fill("web")
    kube_client.delete(Pod, "block-2", namespace=ns, grace_period=0)
    apply(env, ns, whole("needs-whole-2", "cst-topo-0"))
    assert node_of(kube_client, ns, "needs-whole-2", timeout=60) == "cst-topo-0"
    moved = [i for i in range(2) if events_of(kube_client, ns, f"web-{i}", "Moved")]
    assert len(moved) == 1, moved
    message = events_of(kube_client, ns, f"web-{moved[0]}", "Moved")[0].message or ""
    assert "needs-whole-2" in message and "ReplicaSet" in message, message
