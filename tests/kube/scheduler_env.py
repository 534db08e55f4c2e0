"""The tessera-scheduler of tests/kube (a real process under deploy/rbac.yaml's rules on the
shared test cluster) and the helpers its tests read pods, claims and Events with: a fixture
module, imported by each test module that needs it (module scope: one scheduler per module)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Pod

from tessera.kube import names
from tessera.kube.objects import ProjectResource
from tessera.testing.cluster import TestCluster
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
H100_BYTES = 81559 * 2**20




class SchedulerEnv:
    def __init__(self, cluster: TestCluster, client: Client) -> None:
        self.cluster = cluster
        self.client = client
        assert cluster.workdir is not None
        self.logs = cluster.workdir / "logs"
        self.procs: list[subprocess.Popen[bytes]] = []
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        self.sa_kubeconfig = cluster.service_account_kubeconfig(
            names.SYSTEM_NAMESPACE, "tessera-scheduler")
        self.scheduler = self.start_scheduler("scheduler-0")
        self.replicas = 1

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def start_scheduler(self, name: str, *flags: str) -> subprocess.Popen[bytes]:
        return self._spawn(name, [
            "-m", "tessera.kube.scheduler", f"--kubeconfig={self.sa_kubeconfig}",
            "--lease-duration=6", f"--identity={name}", *flags])

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()


@pytest.fixture(scope="module")
def env(kube_cluster: TestCluster, kube_client: Client) -> Iterator[SchedulerEnv]:
    e = SchedulerEnv(kube_cluster, kube_client)
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def project(env: SchedulerEnv, kube_client: Client, kube_namespace: str) -> Iterator[str]:
    """A Project owning the test's namespace (deserved 4 GPUs); pods are deleted afterwards so
    the shared nodes are free for the next test."""
    make_project(kube_client, kube_namespace, kube_namespace, deserved=4)
    yield kube_namespace
    for pod in kube_client.list(Pod, namespace=kube_namespace):
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, pod.metadata.name, namespace=kube_namespace, grace_period=0)
    wait_until("test pods gone", lambda: not list(kube_client.list(Pod, namespace=kube_namespace)))


def make_project(client: Client, name: str, namespace: str, deserved: float,
                 limit: float | None = None) -> None:
    gpu: dict[str, Any] = {"deserved": deserved}
    if limit is not None:
        gpu["limit"] = limit
    client.create(ProjectResource(metadata=ObjectMeta(name=name),
                                  spec={"namespace": namespace, "resources": {"gpu": gpu}}))


def make_pod(client: Client, ns: str, name: str, annotations: dict[str, str] | None = None,
             gpus: int = 0, model: str | None = None, group: str | None = None) -> None:
    ann = dict(annotations or {})
    if model:
        ann[names.GPU_MODEL] = model
    if group:
        ann[names.POD_GROUP] = group
    limits = {names.GPU_RESOURCE: str(gpus)} if gpus else None
    client.create(Pod(
        metadata=ObjectMeta(name=name, namespace=ns, annotations=ann),
        spec=PodSpec(schedulerName=names.SCHEDULER_NAME, containers=[Container(
            name="main", image="example.invalid/cuda:12", resources=ResourceRequirements(limits=limits))]),
    ))


def get_pod(client: Client, ns: str, name: str) -> Pod:
    return client.get(Pod, name, namespace=ns)


def bound(client: Client, ns: str, *pods: str, timeout: float = 30.0) -> list[Pod]:
    def check() -> list[Pod] | None:
        got = [get_pod(client, ns, p) for p in pods]
        return got if all(p.spec and p.spec.nodeName for p in got) else None

    return wait_until(f"pods {pods} bound", check, timeout)


def placement(pod: Pod) -> dict[str, Any]:
    assert pod.metadata is not None and pod.metadata.annotations is not None
    return json.loads(pod.metadata.annotations[names.PLACEMENT])


def uuids(pod: Pod) -> list[str]:
    assert pod.metadata is not None and pod.metadata.annotations is not None
    return pod.metadata.annotations[names.NODE_GPU_UUIDS].split(",")


def reservations(client: Client, node: str | None = None) -> list[Pod]:
    out = []
    for p in client.list(Pod, namespace=names.SYSTEM_NAMESPACE,
                         labels={names.RESERVATION_LABEL: "true"}):
        if node is None or (p.spec and p.spec.nodeName == node):
            out.append(p)
    return out


def configmap_data(client: Client, ns: str, pod: str) -> dict[str, str]:
    return dict(client.get(ConfigMap, f"{pod}-tessera-gpu", namespace=ns).data or {})


def events(client: Client, ns: str, pod: str) -> list[Event]:
    return [e for e in client.list(Event, namespace=ns)
            if e.involvedObject and e.involvedObject.name == pod]


def scheduled_false(client: Client, ns: str, pod: str) -> str | None:
    p = get_pod(client, ns, pod)
    for c in (p.status.conditions if p.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message
    return None


# ---- DRA: pods with ResourceClaims (issue 19, docs/dra.md) -------------------------------------
def make_claim(client: Client, ns: str, name: str, cls: str, count: int = 1,
               capacity: dict[str, str] | None = None) -> None:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}))


def make_claim_pod(client: Client, ns: str, name: str, *claims: str) -> None:
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": names.SCHEDULER_NAME,
                 "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c}
                                    for i, c in enumerate(claims)],
                 "containers": [{"name": "main", "image": "example.invalid/cuda:12",
                                 "resources": {"claims": [{"name": f"c{i}"}
                                                          for i in range(len(claims))]}}]}}))


def claim_status(client: Client, ns: str, name: str) -> dict[str, Any]:
    from tessera.kube.claims import ResourceClaim
    return dict(client.get(ResourceClaim, name, namespace=ns).to_dict().get("status") or {})
