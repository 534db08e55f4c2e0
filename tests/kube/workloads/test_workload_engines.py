"""The engines' own controllers (JobSet, LeaderWorkerSet, KubeRay; built from the Go module proxy,
CRDs and webhooks of the same versions: tessera.testing.engines) make the pods of their own
manifests, as the engines' docs show them with a GPU share added; tessera's webhook finds each
pod's gang from its owners and the scheduler starts each gang together or not at all.

Each test is named after its engine: ``pytest -k jobset``, ``-k leaderworkerset``,
``-k raycluster``, ``-k rayjob``. An engine is started only for its own tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Pod
from lightkube.types import PatchType

from tessera.kube import names
from tessera.testing import engines
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import (
    events_of,
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


RC = create_namespaced_resource("ray.io", "v1", "RayCluster", "rayclusters")


def elastic_raycluster(name: str, replicas: int, low: int, high: int) -> Any:
    """kuberay's ray-cluster.autoscaler.yaml, trimmed: a head tessera schedules (no GPU) and a
    worker group of one whole GPU per worker between minReplicas and maxReplicas."""
    spec = raycluster_spec(replicas, low)
    group = spec["workerGroupSpecs"][0]
    group["maxReplicas"] = high
    group["template"] = {"spec": {"schedulerName": "tessera", "containers": [
        {"name": "ray-worker", "image": "rayproject/ray:2.46.0",
         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    return codecs.from_dict({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                             "metadata": {"name": name}, "spec": spec})


def autoscale(client: Client, ns: str, name: str, replicas: int,
              delete: Sequence[str] = ()) -> None:
    """What the Ray autoscaler (in the head pod) does: a JSON patch of the worker group's
    replicas and, to scale down, of the workers it chose to delete."""
    ops: list[dict[str, Any]] = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                  "value": replicas}]
    if delete:
        ops.append({"op": "replace", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                    "value": {"workersToDelete": list(delete)}})
    client.patch(RC, name, ops, namespace=ns, patch_type=PatchType.JSON)


def live(client: Client, ns: str, **labels: str) -> list[Any]:
    return [p for p in pods(client, ns, **labels) if p.metadata.deletionTimestamp is None]


def test_raycluster_autoscaling_grows_shrinks_and_follows_within_min_max(
        client: Client, kuberay: None) -> None:
    """Head + minReplicas 2 start as one gang; the autoscaler's replicas 12 (maxReplicas 10)
    makes KubeRay add 8 workers (never past 10), placed one by one into the 6 idle GPUs as
    elastic members of the same gang (2 wait, the rest run: no new gang, not all-or-nothing);
    a project within its fair share asking for 2 GPUs makes tessera shrink the two newest workers
    (Event Shrunk), never the head or the minimum; the autoscaler's scale-down to 4 leaves the
    head and 4 workers running and none waiting."""
    ns_a, _ = project_namespace(client, "raycluster-elastic", deserved=0)
    cluster = {"ray.io/cluster": "rc"}
    worker = {**cluster, "ray.io/node-type": "worker"}
    client.create(elastic_raycluster("rc", 2, 2, 10), namespace=ns_a)
    first = all_bound(client, ns_a, 3, **cluster)
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in first} == {"raycluster-rc"}
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in first} == {"3"}
    [head] = [p for p in first if (p.metadata.labels or {})["ray.io/node-type"] == "head"]
    assert (head.metadata.annotations or {}).get(names.GANG_ANCHOR) == "true"

    autoscale(client, ns_a, "rc", 12)  # above maxReplicas 10

    def grown() -> list[Any] | None:
        got = live(client, ns_a, **worker)
        placed = [p for p in got if bound(p)]
        return got if len(got) == 10 and len(placed) == 8 else None
    workers = wait_until("8 of the 10 workers placed", grown, timeout=60)
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in workers} == {"raycluster-rc"}
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in workers} == {"3"}
    waiting = [p for p in workers if not bound(p)]
    wait_until("the 2 unplaced workers wait as elastic pods", lambda: all(
        "elastic pod(s) wait" in scheduled_message(client.get(Pod, p.metadata.name, namespace=ns_a))
        for p in waiting), timeout=30)
    assert len(live(client, ns_a, **worker)) == 10  # KubeRay kept to maxReplicas

    placed = sorted((p for p in workers if bound(p)),
                    key=lambda p: (p.metadata.creationTimestamp, p.metadata.name))
    ns_b, _ = project_namespace(client, "raycluster-other", deserved=4)
    for name in ("b0", "b1"):  # one GPU each: any two workers make room, whatever their nodes
        client.create(Pod(metadata=ObjectMeta(name=name, namespace=ns_b), spec=PodSpec(
            schedulerName="tessera", containers=[Container(
                name="c", image="busybox", resources=ResourceRequirements(
                    limits={"nvidia.com/gpu": "1"}))])))
    wait_until("the other project's pods bound", lambda: all(
        bound(client.get(Pod, n, namespace=ns_b)) for n in ("b0", "b1")), timeout=45)
    told = [e for e in client.list(Event, namespace=ns_a) if e.reason == "Shrunk"]
    shrunk = {e.involvedObject.name for e in told}
    assert len(shrunk) == 2, shrunk
    assert all("elastic pod(s)" in (e.message or "") and "minimum 3)" in (e.message or "")
               for e in told), [e.message for e in told]
    # Never the head, never one of the two oldest (the minimum): the newest elastic workers.
    assert head.metadata.name not in shrunk
    assert not shrunk & {p.metadata.name for p in placed[:2]}
    assert bound(client.get(Pod, head.metadata.name, namespace=ns_a))

    # KubeRay recreates the two (replicas is still 10): they wait as elastic pods. The
    # autoscaler then scales down to 4, deleting the waiting ones and two running ones.
    def after_shrink() -> list[Any] | None:
        got = live(client, ns_a, **worker)
        return got if len(got) == 10 and sum(map(bound, got)) == 6 else None
    now = wait_until("6 workers running, 4 waiting", after_shrink, timeout=30)
    running = sorted((p for p in now if bound(p)),
                     key=lambda p: (p.metadata.creationTimestamp, p.metadata.name))
    gone = [p.metadata.name for p in now if not bound(p)] + [
        p.metadata.name for p in running[-2:]]
    autoscale(client, ns_a, "rc", 4, delete=gone)

    def followed() -> list[Any] | None:
        got = live(client, ns_a, **cluster)
        return got if len(got) == 5 and all(map(bound, got)) else None
    left = wait_until("the head and 4 workers, all running", followed, timeout=30)
    assert head.metadata.name in {p.metadata.name for p in left}


def test_raycluster_min_above_max_is_scheduled_per_pod_with_an_event(
        client: Client, kuberay: None) -> None:
    """minReplicas 3 above maxReplicas 1: KubeRay runs 1 worker ("Please fix this"), so head +
    3 could never start; tessera schedules the pods one by one and says why on the RayCluster,
    naming the field."""
    ns, _ = project_namespace(client, "raycluster-bad")
    client.create(elastic_raycluster("bad", 3, 3, 1), namespace=ns)
    got = all_bound(client, ns, 2, **{"ray.io/cluster": "bad"})
    assert all(names.POD_GROUP not in (p.metadata.annotations or {}) for p in got)
    rule = "spec.workerGroupSpecs[0].minReplicas 3 is above spec.workerGroupSpecs[0].maxReplicas 1"
    assert all(rule in (p.metadata.annotations or {})[names.GANG] for p in got)
    wait_until("a GangNotInferred Event on the RayCluster", lambda: any(
        e.reason == "GangNotInferred" and rule in (e.message or "")
        for e in events_of(client, ns, "bad")), timeout=15)


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


def test_raycluster_whose_head_does_not_fit_starts_no_worker_until_it_does(
        client: Client, kuberay: None) -> None:
    """The head is the gang's anchor (tessera.io/gang-anchor), required, not only placed first:
    a head of 4 GPUs (a whole node) finds one GPU taken on each node by pods nothing may evict,
    so although the 3 workers (one GPU each; minimum head + 1) would fit, none starts, and each
    pod says which anchor is missing and why. Once a node is free the gang starts whole."""
    ns_blk, _ = project_namespace(client, "anchor-blk", deserved=2)
    for node in ("wl-0", "wl-1"):
        client.create(Pod(metadata=ObjectMeta(name=f"blk-{node}", namespace=ns_blk,
                                              annotations={names.PRIORITY_CLASS: "inference"}),
                          spec=PodSpec(schedulerName="tessera",
                                       nodeSelector={"kubernetes.io/hostname": node},
                                       containers=[Container(
                                           name="c", image="busybox", resources=ResourceRequirements(
                                               limits={"nvidia.com/gpu": "1"}))])))
    all_bound(client, ns_blk, 2)
    ns, _ = project_namespace(client, "raycluster-anchor", deserved=6)
    rc = elastic_raycluster("rc", 3, 1, 3).to_dict()
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "4"}}
    client.create(codecs.from_dict(rc), namespace=ns)
    cluster = {"ray.io/cluster": "rc"}
    got = wait_pods(client, ns, 4, **cluster)
    [head] = [p for p in got if (p.metadata.labels or {})["ray.io/node-type"] == "head"]
    assert (head.metadata.annotations or {}).get(names.GANG_ANCHOR) == "true"
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in got} == {"2"}
    assert {(p.metadata.annotations or {})[names.GANG_ANCHORS] for p in got} == {"1"}
    anchor = f"anchor pod {head.metadata.name} does not fit: "

    def told() -> list[str] | None:
        msgs = [scheduled_message(p) for p in live(client, ns, **cluster)]
        return msgs if len(msgs) == 4 and all(anchor in m for m in msgs) else None
    msgs = wait_until("every pod of the gang names its missing anchor", told, timeout=60)
    assert "no node has 4 idle GPUs" in msgs[0], msgs[0]
    # The Event is posted just after the condition is written: wait for it, not only the condition.
    wait_until("the head's FailedScheduling Event names it", lambda: any(
        e.reason == "FailedScheduling" and anchor in (e.message or "")
        for e in events_of(client, ns, head.metadata.name)), timeout=30)
    assert not any(bound(p) for p in live(client, ns, **cluster))  # no worker without the head

    client.delete(Pod, "blk-wl-0", namespace=ns_blk, grace_period=0)
    started = all_bound(client, ns, 4, **cluster)
    by_name = {p.metadata.name: p.spec.nodeName for p in started}
    assert by_name[head.metadata.name] == "wl-0"
    assert set(by_name.values()) == {"wl-0", "wl-1"}


def test_gang_waits_for_its_anchor_pod_to_exist(client: Client, stack: TestCluster) -> None:
    """Bare pods naming their gang themselves (tessera.io/pod-group, gang-min-member) and that it
    has one anchor (tessera.io/gang-anchors, as the webhook writes for an owner's pods): the three
    workers reach the minimum of 2 but wait, told the anchor's pod does not exist; once it is
    created (tessera.io/gang-anchor) the four start together."""
    ns, _ = project_namespace(client, "anchor-missing")
    gang = {names.POD_GROUP: "g", names.GANG_MIN_MEMBER: "2", names.GANG_ANCHORS: "1"}

    def make(name: str, **extra: str) -> None:
        client.create(Pod(metadata=ObjectMeta(name=name, namespace=ns, annotations={**gang, **extra}),
                          spec=PodSpec(schedulerName="tessera", containers=[Container(
                              name="c", image="busybox", resources=ResourceRequirements(
                                  limits={"nvidia.com/gpu": "1"}))])))
    for i in range(3):
        make(f"w{i}")
    wait_until("the workers wait for their anchor pod", lambda: all(
        "waits for its anchor pod(s) to exist: 1 expected" in scheduled_message(p)
        for p in live(client, ns)) and len(live(client, ns)) == 3, timeout=30)
    assert not any(bound(p) for p in live(client, ns))
    make("head", **{names.GANG_ANCHOR: "true"})
    all_bound(client, ns, 4)
