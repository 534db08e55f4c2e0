"""The engines' own controllers (JobSet, LeaderWorkerSet, KubeRay; built from the Go module proxy,
CRDs and webhooks of the same versions: tessera.testing.engines) make the pods of their own
manifests, as the engines' docs show them with a GPU share added; tessera's webhook finds each
pod's gang from its owners and the scheduler starts each gang together or not at all.

Each test is named after its engine: ``pytest -k jobset``, ``-k leaderworkerset``,
``-k raycluster``, ``-k rayjob``. An engine is started only for its own tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource

from tessera.kube import names
from tessera.testing import engines
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import (
    pods,
    project_namespace,
    scheduled_message,
    wait_pods,
)
from tests.waiting import wait_until

SHARE = {"tessera.io/gpu-portion": "0.5"}
for _group, _version, _kind in (("ray.io", "v1", "RayCluster"), ("ray.io", "v1", "RayJob"),
                                ("jobset.x-k8s.io", "v1alpha2", "JobSet"),
                                ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"),
                                ("trainer.kubeflow.org", "v1alpha1", "TrainJob")):
    create_namespaced_resource(_group, _version, _kind, f"{_kind.lower()}s")


@pytest.fixture(scope="module")
def jobset(stack: TestCluster) -> Iterator[None]:
    with engines.running(stack, "jobset"):
        yield


@pytest.fixture(scope="module")
def lws(stack: TestCluster) -> Iterator[None]:
    with engines.running(stack, "leaderworkerset"):
        yield


@pytest.fixture(scope="module")
def trainer(stack: TestCluster, jobset: None) -> Iterator[None]:
    """Kubeflow Trainer v2 (a TrainJob becomes a JobSet: the jobset engine runs too), with the
    torch-distributed ClusterTrainingRuntime of the same module, as its install applies it."""
    import yaml

    from tessera.testing import binaries
    from tessera.testing.webhook import apply

    with engines.running(stack, "trainer"):
        source = engines.module_dir(binaries.TRAINER, binaries.TRAINER_VERSION)
        apply(stack, [d for d in yaml.safe_load_all(
            (source / "manifests/base/runtimes/torch_distributed.yaml").read_text()) if d])
        yield


@pytest.fixture(scope="module")
def kuberay(stack: TestCluster) -> Iterator[None]:
    with engines.running(stack, "kuberay"):
        yield


def bound(p: Any) -> bool:
    return bool(p.spec and p.spec.nodeName)


def all_bound(client: Client, ns: str, count: int, **labels: str) -> list[Any]:
    def check() -> list[Any] | None:
        got = [p for p in pods(client, ns, **labels) if p.metadata.deletionTimestamp is None]
        return got if len(got) == count and all(bound(p) for p in got) else None
    found: list[Any] = wait_until(f"{count} pods bound in {ns}", check, timeout=90)
    return found


def container(name: str, gpu: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "gcr.io/k8s-staging-jobset/pytorch-resnet:latest",
                         "command": ["bash", "-xc", "torchrun --nnodes=4 resnet.py"]}
    if gpu:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpu}}
    return c


def jobset_manifest(name: str, workers: int, per_job: int, pod_ann: dict[str, str],
                    gpu: str | None = None) -> Any:
    # jobset's examples/pytorch/resnet (a leader and workers Jobs), a GPU share added.
    def rjob(rname: str, replicas: int, parallelism: int) -> dict[str, Any]:
        return {"name": rname, "replicas": replicas, "template": {"spec": {
            "parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
            "template": {"metadata": {"annotations": pod_ann},
                         "spec": {"restartPolicy": "Never",
                                  # whole GPUs are tessera's when it schedules the pod
                                  **({"schedulerName": "tessera"} if gpu else {}),
                                  "containers": [container("pytorch", gpu)]}}}}}
    return codecs.from_dict({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"replicatedJobs": [rjob("leader", 1, 1), rjob("workers", workers, per_job)]}})


def test_jobset_gang_starts_together(client: Client, jobset: None) -> None:
    ns, _ = project_namespace(client, "jobset")
    client.create(jobset_manifest("pytorch", 2, 3, SHARE), namespace=ns)
    wait_pods(client, ns, 7, **{"jobset.sigs.k8s.io/jobset-name": "pytorch"})
    got = pods(client, ns, **{"jobset.sigs.k8s.io/jobset-name": "pytorch"})
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in got} == {"jobset-pytorch"}
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in got} == {"7"}
    wait_until("all 7 bound", lambda: all(bound(p) for p in pods(
        client, ns, **{"jobset.sigs.k8s.io/jobset-name": "pytorch"})), timeout=90)


def test_jobset_too_big_starts_no_pod(client: Client, jobset: None) -> None:
    ns, _ = project_namespace(client, "jobset-big", deserved=16)
    # 1 + 3 x 3 pods of one whole GPU: 10 GPUs on 8.
    client.create(jobset_manifest("wide", 3, 3, {}, gpu="1"), namespace=ns)
    wait_pods(client, ns, 10, **{"jobset.sigs.k8s.io/jobset-name": "wide"})

    def waiting() -> bool:
        got = pods(client, ns, **{"jobset.sigs.k8s.io/jobset-name": "wide"})
        return len(got) == 10 and all("gang" in scheduled_message(p) for p in got)
    wait_until("every member waits for its gang", waiting, timeout=60)
    assert not any(bound(p) for p in pods(client, ns))


def lws_manifest(name: str, replicas: int, size: int, policy: str | None = None) -> Any:
    # lws's docs/examples/vllm (a leader and workers per group), a GPU share added.
    tmpl = {"metadata": {"annotations": SHARE}, "spec": {"containers": [
        {"name": "vllm", "image": "vllm/vllm-openai:latest",
         "command": ["sh", "-c", "ray start --block"]}]}}
    spec: dict[str, Any] = {"replicas": replicas, "leaderWorkerTemplate": {
        "size": size, "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": tmpl, "workerTemplate": tmpl}}
    if policy:
        spec["startupPolicy"] = policy
    return codecs.from_dict({"apiVersion": "leaderworkerset.x-k8s.io/v1",
                             "kind": "LeaderWorkerSet", "metadata": {"name": name}, "spec": spec})


def test_leaderworkerset_groups_start_together(client: Client, lws: None) -> None:
    ns, _ = project_namespace(client, "leaderworkerset")
    client.create(lws_manifest("vllm", 2, 4), namespace=ns)
    got = all_bound(client, ns, 8, **{"leaderworkerset.sigs.k8s.io/name": "vllm"})
    groups: dict[str, list[Any]] = {}
    for p in got:
        ann = p.metadata.annotations or {}
        groups.setdefault(ann[names.POD_GROUP], []).append(ann[names.GANG_MIN_MEMBER])
    assert groups == {"lws-vllm-0": ["4"] * 4, "lws-vllm-1": ["4"] * 4}


def raycluster_spec(workers: int, min_workers: int) -> dict[str, Any]:
    # kuberay's ray-operator/config/samples/ray-cluster.autoscaler.yaml, trimmed; the head is
    # scheduled by tessera too (schedulerName), the workers ask for half a GPU.
    return {
        "rayVersion": "2.46.0", "enableInTreeAutoscaling": True,
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
            "schedulerName": "tessera",
            "containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0",
                            "resources": {"requests": {"cpu": "1", "memory": "2G"}}}]}}},
        "workerGroupSpecs": [{
            "groupName": "gpu-group", "replicas": workers, "minReplicas": min_workers,
            "maxReplicas": 10, "rayStartParams": {},
            "template": {"metadata": {"annotations": SHARE}, "spec": {"containers": [
                {"name": "ray-worker", "image": "rayproject/ray:2.46.0",
                 "resources": {"requests": {"cpu": "1", "memory": "1G"}}}]}}}],
    }


def test_raycluster_head_and_min_workers_start_together(client: Client, kuberay: None) -> None:
    ns, _ = project_namespace(client, "raycluster")
    client.create(codecs.from_dict({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                    "metadata": {"name": "rc"},
                                    "spec": raycluster_spec(3, 2)}), namespace=ns)
    got = all_bound(client, ns, 4, **{"ray.io/cluster": "rc"})
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in got} == {"raycluster-rc"}
    # head + minReplicas 2: the third worker is elastic (above the minimum).
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in got} == {"3"}


def test_rayjob_cluster_is_one_gang(client: Client, kuberay: None) -> None:
    ns, _ = project_namespace(client, "rayjob")
    client.create(codecs.from_dict({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"},
        "spec": {"entrypoint": "python /home/ray/samples/sample_code.py",
                 "rayClusterSpec": raycluster_spec(2, 2)}}), namespace=ns)
    ray = all_bound(client, ns, 3, **{"ray.io/is-ray-node": "yes"})
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in ray} == {"rayjob-rj"}
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in ray} == {"3"}


def test_trainjob_is_one_gang_through_its_jobset(client: Client, trainer: None) -> None:
    """A TrainJob as Kubeflow Trainer's docs write it (runtimeRef torch-distributed, numNodes),
    a GPU share added through podTemplateOverrides: Trainer's controller makes a JobSet, the
    JobSet controller its Job, the Job controller the pods; tessera's webhook follows the owners
    up to the TrainJob and makes them one gang that starts together."""
    ns, _ = project_namespace(client, "trainjob")
    trainjob = codecs.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "pytorch-mnist"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 4, "command": ["torchrun", "train.py"]},
                 "podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                                           "metadata": {"annotations": SHARE}}]}})

    def created() -> bool:
        # Trainer's validating webhook reads runtimes from its informer cache: until the cache
        # has seen the runtime the fixture applied, it refuses the TrainJob ("must be created
        # before the TrainJob is created"). Any other refusal fails the test at once.
        try:
            client.create(trainjob, namespace=ns)
        except ApiError as exc:
            if "must be created before" in str(exc):
                return False
            raise
        return True
    wait_until("Trainer's webhook to accept the TrainJob", created, timeout=60)
    label = {"jobset.sigs.k8s.io/jobset-name": "pytorch-mnist"}
    wait_pods(client, ns, 4, timeout=120, **label)
    got = pods(client, ns, **label)
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in got} == {
        "trainjob-pytorch-mnist"}
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in got} == {"4"}
    assert all("TrainJob pytorch-mnist" in (p.metadata.annotations or {})[names.GANG]
               for p in got)
    wait_until("all 4 bound", lambda: all(bound(p) for p in pods(client, ns, **label)),
               timeout=90)
