"""Differential check of tessera's Kubernetes predicates against kube-scheduler itself.

On a private test cluster (kube-apiserver + etcd + kwok), a real ``kube-scheduler`` (built from
the Go module proxy like the other test binaries) places generated pods. Each *world* is a set
of nodes with random labels, taints, cordons and extended resources, plus existing pods bound
to them (labels, anti-affinity, host ports, extended resources); each *case* is one pending pod
with random constraints (nodeSelector, node affinity with every operator, tolerations, pod
affinity/anti-affinity with namespaces and namespaceSelector, topology spread, host ports,
extended resources; no GPU share). The pod is created, kube-scheduler binds it or marks it
Unschedulable, and tessera's predicates (``tessera.kube.predicates``, fed through the same
object parsing the scheduler uses) are asked about the same world:

- a pod kube-scheduler binds to node X: tessera must find X feasible;
- a pod kube-scheduler leaves unschedulable: tessera must find no node feasible.

Where they disagree, kube-scheduler is right. The pod is deleted before the next case, so every
case sees exactly its world. ``python -m tessera.bench.kube_differential`` runs the full check.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Namespace, Node, Pod

from tessera.core.model import Node as CoreNode
from tessera.kube.objects import foreign_pod, node_info, pod_info
from tessera.kube.predicates.cluster import ClusterView
from tessera.kube.predicates.constraint import constraint_for
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.snapshot import foreign_others
from tessera.kube.snapshot_facts import nodes_facts
from tessera.testing import binaries
from tessera.testing.cluster import TestCluster

NAMESPACES = {"d1": {"team": "a"}, "d2": {"team": "b"}}
APPS = ("web", "db", "cache")
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
FPGA = "example.com/fpga"
TAINTS = (
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "maintenance", "value": "true", "effect": "NoExecute"},
    {"key": "spot", "value": "yes", "effect": "PreferNoSchedule"},
    {"key": "special", "effect": "NoSchedule"},
)


@dataclass
class Disagreement:
    world: int
    case: int
    kube: str
    """The node kube-scheduler chose, or '' for unschedulable."""
    tessera: list[str]
    pod: dict[str, Any]
    message: str = ""


@dataclass
class Result:
    cases: int = 0
    bound: int = 0
    unschedulable: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    seconds: float = 0.0


# ---- generation -------------------------------------------------------------------------------

def _node(rng: random.Random, name: str) -> dict[str, Any]:
    labels = {HOST: name, "kubernetes.io/os": "linux", "type": "kwok"}
    if rng.random() < 0.85:
        labels[ZONE] = rng.choice(("z1", "z2", "z3"))
    if rng.random() < 0.7:
        labels["disktype"] = rng.choice(("ssd", "hdd"))
    if rng.random() < 0.7:
        labels["rank"] = rng.choice(("1", "3", "5", "8", "x"))
    if rng.random() < 0.6:
        labels["gpu"] = rng.choice(("A100", "H100"))
    taints = [dict(t) for t in rng.sample(TAINTS, rng.choice((0, 0, 0, 1, 1, 2)))]
    alloc = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    if rng.random() < 0.4:
        alloc[FPGA] = str(rng.choice((1, 2)))
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": taints, "unschedulable": rng.random() < 0.1},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


def _selector(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.6:
        return {"matchLabels": {"app": rng.choice(APPS)}}
    op = rng.choice(("In", "NotIn", "Exists"))
    e: dict[str, Any] = {"key": "app", "operator": op}
    if op != "Exists":
        e["values"] = rng.sample(APPS, rng.choice((1, 2)))
    return {"matchExpressions": [e]}


def _pod_term(rng: random.Random) -> dict[str, Any]:
    t: dict[str, Any] = {"labelSelector": _selector(rng), "topologyKey": rng.choice((HOST, ZONE, ZONE))}
    r = rng.random()
    if r < 0.15:
        t["namespaceSelector"] = {}
    elif r < 0.3:
        t["namespaceSelector"] = {"matchLabels": {"team": rng.choice(("a", "b"))}}
    elif r < 0.4:
        t["namespaces"] = [rng.choice(list(NAMESPACES))]
    return t


def _node_expr(rng: random.Random) -> dict[str, Any]:
    key = rng.choice(("disktype", "rank", "gpu", ZONE))
    ops = ["In", "NotIn", "Exists", "DoesNotExist"] + (["Gt", "Lt"] if key == "rank" else [])
    op = rng.choice(ops)
    e: dict[str, Any] = {"key": key, "operator": op}
    values = {"disktype": ("ssd", "hdd"), "gpu": ("A100", "H100"), ZONE: ("z1", "z2", "z3"),
              "rank": ("1", "3", "5", "8")}[key]
    if op in ("In", "NotIn"):
        e["values"] = rng.sample(values, rng.choice((1, 2)))
    elif op in ("Gt", "Lt"):
        e["values"] = [str(rng.randint(0, 9))]
    return e


def _container(rng: random.Random, ports: bool, fpga: bool) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "example.invalid/app:1",
                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    if ports:
        c["ports"] = [{"containerPort": 80, "hostPort": rng.choice((8080, 8081)),
                       "protocol": rng.choice(("TCP", "TCP", "UDP"))}]
    if fpga:
        c["resources"]["requests"][FPGA] = "1"
        c["resources"]["limits"] = {FPGA: "1"}
    return c


def existing_pod(rng: random.Random, name: str, node: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": [
        _container(rng, rng.random() < 0.15, rng.random() < 0.15)],
        "tolerations": [{"operator": "Exists"}]}
    if rng.random() < 0.25:
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_pod_term(rng)]}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": rng.choice(list(NAMESPACES)),
                         "labels": {"app": rng.choice(APPS)}},
            "spec": spec}


def pending_pod(rng: random.Random, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(rng, rng.random() < 0.15, rng.random() < 0.15)]}
    if rng.random() < 0.3:
        spec["nodeSelector"] = dict(rng.sample([("disktype", rng.choice(("ssd", "hdd"))),
                                                (ZONE, rng.choice(("z1", "z2", "z3"))),
                                                ("gpu", rng.choice(("A100", "H100")))], rng.choice((1, 2))))
    affinity: dict[str, Any] = {}
    if rng.random() < 0.4:
        terms = [{"matchExpressions": [_node_expr(rng) for _ in range(rng.choice((1, 2)))]}
                 for _ in range(rng.choice((1, 1, 2)))]
        if rng.random() < 0.1:
            terms.append({"matchFields": [{"key": "metadata.name", "operator": rng.choice(("In", "NotIn")),
                                           "values": [f"dn-{rng.randint(0, 5)}"]}]})
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    if rng.random() < 0.2:
        affinity.setdefault("nodeAffinity", {})["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": rng.randint(1, 100), "preference": {"matchExpressions": [_node_expr(rng)]}}]
    if rng.random() < 0.3:
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_pod_term(rng)]}
    if rng.random() < 0.35:
        affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_pod_term(rng)]}
    if affinity:
        spec["affinity"] = affinity
    if rng.random() < 0.5:
        tols = []
        for _ in range(rng.choice((1, 2))):
            t: dict[str, Any] = dict(rng.choice(TAINTS))
            r = rng.random()
            if r < 0.2:
                t = {"operator": "Exists"}
            elif r < 0.45:
                t = {"key": t["key"], "operator": "Exists"}
                if rng.random() < 0.5:
                    t["effect"] = rng.choice(("NoSchedule", "NoExecute"))
            elif r < 0.55:
                t["value"] = "other"
            if t.get("effect") == "NoExecute" and rng.random() < 0.5:
                t["tolerationSeconds"] = 30
            tols.append(t)
        if rng.random() < 0.1:
            tols.append({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"})
        spec["tolerations"] = tols
    if rng.random() < 0.3:
        c: dict[str, Any] = {"maxSkew": rng.choice((1, 1, 2)), "topologyKey": rng.choice((HOST, ZONE)),
                             "whenUnsatisfiable": rng.choice(("DoNotSchedule", "DoNotSchedule", "ScheduleAnyway")),
                             "labelSelector": _selector(rng)}
        if c["whenUnsatisfiable"] == "DoNotSchedule" and rng.random() < 0.25:
            c["minDomains"] = rng.choice((2, 3, 4))
        if rng.random() < 0.2:
            c["nodeAffinityPolicy"] = "Ignore"
        if rng.random() < 0.2:
            c["nodeTaintsPolicy"] = "Honor"
        spec["topologySpreadConstraints"] = [c]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": rng.choice(list(NAMESPACES)),
                         "labels": {"app": rng.choice(APPS)}},
            "spec": spec}


# ---- running ----------------------------------------------------------------------------------

def start_kube_scheduler(cluster: TestCluster) -> subprocess.Popen[bytes]:
    path = binaries.ensure(["kube-scheduler"])["kube-scheduler"]
    assert cluster.workdir is not None
    log = (cluster.workdir / "logs" / "kube-scheduler.log").open("ab")
    proc = subprocess.Popen(
        [str(path), f"--kubeconfig={cluster.kubeconfig}", "--leader-elect=false", "--secure-port=0",
         "--v=1"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc


def _outcome(client: Client, ns: str, name: str, timeout: float) -> tuple[str, str] | None:
    """(node, '') once bound, ('', message) once marked Unschedulable, None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = client.get(Pod, name, namespace=ns)
        if p.spec and p.spec.nodeName:
            return p.spec.nodeName, ""
        for c in (p.status.conditions if p.status else None) or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return "", c.message or ""
        time.sleep(0.02)
    return None


def tessera_feasible(client: Client, pod: Any) -> list[str]:
    """Nodes tessera's predicates allow for ``pod``, in the world as the API server has it."""
    nodes = {str(n.metadata.name): node_info(n) for n in client.list(Node)}  # type: ignore[union-attr]
    facts = nodes_facts(nodes)
    foreign = [foreign_pod(p) for p in client.list(Pod, namespace="*")
               if p.spec and p.spec.nodeName and p.metadata.name != pod.metadata.name]  # type: ignore[union-attr]
    view = ClusterView()
    namespaces = {str(n.metadata.name): dict(n.metadata.labels or {})  # type: ignore[union-attr]
                  for n in client.list(Namespace)}
    view.reset(facts, namespaces, foreign_others(foreign, facts))
    info = pod_info(pod)
    assert info.sched_error is None, info.sched_error
    labels = tuple(sorted(info.labels.items()))
    sp = info.sched or SchedulingSpec(info.namespace, labels)
    symmetric = bool(view.symmetric_anti(info.namespace, sp.labels))
    c = constraint_for(sp, False, view, symmetric)
    out = []
    for name, ni in sorted(nodes.items()):
        if ni.node is None:
            continue
        core = CoreNode(name, labels=ni.labels)
        if c.allows(core) and (not c.dynamic or c.admits(core, _NOWHERE)):
            out.append(name)
    return out


class _Nowhere:
    def node_of(self, workload_id: str, pod: int) -> str | None:
        return None


_NOWHERE = _Nowhere()


def run(cluster: TestCluster, *, worlds: int, cases_per_world: int, seed: int = 13, nodes: int = 6,
        report: Callable[[str], None] | None = None, timeout: float = 20.0) -> Result:
    """Generate ``worlds`` x ``cases_per_world`` cases and compare; kube-scheduler must run."""
    rng = random.Random(seed)
    client = cluster.client()
    for name, labels in NAMESPACES.items():
        with contextlib.suppress(ApiError):
            client.create(codecs.from_dict({"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": name, "labels": labels}}))
    result = Result()
    t0 = time.perf_counter()
    for w in range(worlds):
        node_names = [f"dn-{i}" for i in range(nodes)]
        for n in node_names:
            with contextlib.suppress(ApiError):
                client.delete(Node, n)
        for ns in NAMESPACES:
            for p in client.list(Pod, namespace=ns):
                with contextlib.suppress(ApiError):
                    client.delete(Pod, p.metadata.name, namespace=ns, grace_period=0)
        for n in node_names:
            manifest = _node(rng, n)
            created = client.create(codecs.from_dict(manifest))
            if not (created.status and created.status.allocatable):
                client.patch(Node.Status, n, {"status": manifest["status"]})
        cluster.wait_nodes_ready(node_names)
        for i in range(rng.randint(0, 7)):
            client.create(codecs.from_dict(existing_pod(rng, f"e{w}-{i}", rng.choice(node_names))))
        for case in range(cases_per_world):
            body = pending_pod(rng, f"p{w}-{case}")
            ns = body["metadata"]["namespace"]
            pod = client.create(codecs.from_dict(body))
            outcome = _outcome(client, ns, body["metadata"]["name"], timeout)
            if outcome is None:
                raise TimeoutError(f"kube-scheduler decided nothing on {ns}/{body['metadata']['name']} "
                                   f"in {timeout:.0f}s (is it running?)")
            kube_node, message = outcome
            ours = tessera_feasible(client, pod)
            result.cases += 1
            if kube_node:
                result.bound += 1
                ok = kube_node in ours
            else:
                result.unschedulable += 1
                ok = not ours
            if not ok:
                result.disagreements.append(Disagreement(w, case, kube_node, ours, body, message))
                if report:
                    report(f"disagreement world {w} case {case}: kube-scheduler {kube_node or 'unschedulable'}"
                           f" ({message}), tessera {ours}: {json.dumps(body['spec'])}")
            client.delete(Pod, body["metadata"]["name"], namespace=ns, grace_period=0)
            with contextlib.suppress(TimeoutError):
                _gone(client, ns, body["metadata"]["name"])
    result.seconds = time.perf_counter() - t0
    return result


def _gone(client: Client, ns: str, name: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.get(Pod, name, namespace=ns)
        except ApiError as exc:
            if exc.status.code == 404:
                return
            raise
        time.sleep(0.02)
    raise TimeoutError(name)
