"""A cluster for the workload-type tests: etcd + kube-apiserver + kwok + kube-controller-manager
(Jobs, ReplicaSets, garbage collection), two kwok nodes of 4 GPUs, and tessera's webhook and
scheduler running as the chart's ServiceAccounts with only the chart's RBAC.

Engines' controllers (JobSet, LeaderWorkerSet, KubeRay) are started by the tests that need them
(tessera.testing.engines). (Test harness, used by tests/kube/workloads/test_workload*.py and
tessera.bench.workloads.)"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod

from tessera.kube.objects import ProjectResource
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tessera.testing.controller_manager import start_controller_manager
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.processes import stop_processes

SYSTEM_NS = "tessera-system"
GPUS_PER_NODE = 4
NODES = 2


@contextlib.contextmanager
def workload_stack(gpus_per_node: int = GPUS_PER_NODE, nodes: int = NODES,
                   controller_manager: bool = True, scheduler_args: Sequence[str] = ()
                   ) -> Iterator[TestCluster]:
    cluster = TestCluster()
    cluster.start()
    procs: list[subprocess.Popen[bytes]] = []
    hook = None
    try:
        if controller_manager:
            start_controller_manager(cluster)
        cluster.create_gpu_nodes(nodes, NodeShape(gpus=gpus_per_node, model="H100-80GB"),
                                 prefix="wl-")
        docs = local.helm_template(include_crds=True)
        local.apply(cluster, [d for d in docs if d["kind"] == "CustomResourceDefinition"])
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        sched_kc = cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-scheduler")
        hook_kc = cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-webhook")
        local.apply(cluster, [d for d in docs if d["kind"] in (
            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")])
        assert cluster.workdir is not None
        with (cluster.workdir / "logs" / "scheduler.log").open("ab") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tessera.kube.scheduler", f"--kubeconfig={sched_kc}",
                 # The chart's lease (15 s): a 3 s lease was lost under load (the renewal
                 # timing out at 1 s), which stopped the only scheduler mid-gang.
                 "--identity=workloads", *scheduler_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        hook = local.start_webhook(cluster, name="workloads-webhook", kubeconfig=hook_kc)
        local.register(cluster, hook)
        yield cluster
    finally:
        if hook is not None:
            hook.stop()
        stop_processes(procs, grace=10)
        cluster.stop()


_seq = iter(range(10**6))


def project_namespace(client: Client, base: str, deserved: float = 8) -> tuple[str, str]:
    """A namespace owned by a new Project (GPU quota ``deserved``); waits until the webhook
    knows it."""
    ns = f"{base}-{next(_seq)}"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    project = f"{ns}-proj"
    client.create(ProjectResource(metadata=ObjectMeta(name=project), spec={
        "namespace": ns, "resources": {"gpu": {"deserved": deserved}}}))
    probe: Any = codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "probe", "annotations": {"tessera.io/gpu-portion": "0.5"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    deadline = time.monotonic() + 15
    while True:
        try:
            client.create(probe, namespace=ns, dry_run=True)
            return ns, project
        except Exception as exc:
            if "no tessera Project" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def pods(client: Client, ns: str, **labels: str) -> list[Pod]:
    selector: dict[str, Any] = dict(labels)
    return list(client.list(Pod, namespace=ns, labels=selector or None))


def wait_pods(client: Client, ns: str, count: int, timeout: float = 60, **labels: str
              ) -> list[Pod]:
    deadline = time.monotonic() + timeout
    while True:
        got = pods(client, ns, **labels)
        if len(got) >= count:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {count} pods in {ns} ({len(got)})")
        time.sleep(0.1)


def events_of(client: Client, ns: str, name: str) -> list[Any]:
    return [e for e in client.list(Event, namespace=ns)
            if e.involvedObject and e.involvedObject.name == name]


def scheduled_message(pod: Pod) -> str:
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message or ""
    return ""
