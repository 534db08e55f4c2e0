"""Gangs from owners (tessera.kube.podgrouper), one test per engine, from the manifests as the
engines' docs show them (GPU fractions added with ``tessera.io/gpu-portion``), with the objects
their controllers make (the owner chain the webhook reads from the API server)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.kube.admission.policy import WebhookConfig, asks_for_gpu
from tessera.kube.podgrouper import Gang, PerPod, infer

SHARE = {"tessera.io/gpu-portion": "0.5"}


def ours(template: Any) -> bool:
    return asks_for_gpu(template, WebhookConfig())


def tmpl(gpu: bool = True) -> dict[str, Any]:
    return {"metadata": {"annotations": dict(SHARE) if gpu else {}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def obj(api: str, kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "uid": f"uid-{name}",
                                                          **meta}, "spec": spec}


def pod(labels: dict[str, str] | None = None, **ann: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": labels or {}, "annotations": {**SHARE, **ann}},
            "spec": {}}


def job(name: str, parallelism: int | None, completions: int | None, mode: str = "NonIndexed",
        **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"completionMode": mode, "template": tmpl()}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return obj("batch/v1", "Job", name, spec, **meta)


def test_indexed_job_all_at_once_is_a_gang_of_parallelism() -> None:
    got = infer(pod(), [job("train", 4, 4, "Indexed")], ours)
    assert got == Gang("job-train", 4, got.why) and "4 pods start together" in got.why


def test_indexed_job_retried_member_needs_only_what_is_left() -> None:
    j = job("train", 4, 4, "Indexed")
    j["status"] = {"succeeded": 3}
    got = infer(pod(), [j], ours)
    assert isinstance(got, Gang) and got.min_member == 1


def test_indexed_job_sweep_runs_trials_on_their_own() -> None:
    got = infer(pod(), [job("sweep", 8, 100, "Indexed")], ours)
    assert isinstance(got, Gang) and got.min_member == 1 and "sweep" in got.why


def test_job_default_parallelism_is_one() -> None:
    got = infer(pod(), [job("one", None, None)], ours)
    assert isinstance(got, Gang) and got.min_member == 1


def test_cronjob_job_is_grouped_as_its_job() -> None:
    cron = obj("batch/v1", "CronJob", "nightly", {"jobTemplate": {}})
    got = infer(pod(), [job("nightly-123", 2, 2), cron], ours)
    assert got == Gang("job-nightly-123", 2, got.why)


def jobset(order: str | None = None) -> dict[str, Any]:
    # jobset's examples/pytorch: a leader and workers; completions = parallelism.
    spec: dict[str, Any] = {"replicatedJobs": [
        {"name": "leader", "replicas": 1,
         "template": {"spec": {"parallelism": 1, "completions": 1, "template": tmpl()}}},
        {"name": "workers", "replicas": 3,
         "template": {"spec": {"parallelism": 4, "completions": 4, "template": tmpl()}}},
        {"name": "driver", "replicas": 1,  # CPU only, default scheduler: not counted
         "template": {"spec": {"template": tmpl(gpu=False)}}},
    ]}
    if order:
        spec["startupPolicy"] = {"startupPolicyOrder": order}
    return obj("jobset.x-k8s.io/v1alpha2", "JobSet", "pytorch", spec)


def test_jobset_is_one_gang_of_every_replicated_job() -> None:
    child = job("pytorch-workers-0", 4, 4, labels={"jobset.sigs.k8s.io/replicatedjob-name":
                                                   "workers"})
    got = infer(pod(), [child, jobset()], ours)
    assert got == Gang("jobset-pytorch", 13, got.why)


def test_jobset_in_order_is_one_gang_per_replicated_job() -> None:
    labels = {"jobset.sigs.k8s.io/replicatedjob-name": "workers"}
    got = infer(pod(labels), [job("pytorch-workers-0", 4, 4), jobset("InOrder")], ours)
    assert got == Gang("jobset-pytorch-workers", 12, got.why) and "InOrder" in got.why


def test_trainjob_is_grouped_through_its_jobset() -> None:
    # Trainer v2: TrainJob -> JobSet (replicated job "node", parallelism = numNodes) -> Job.
    train = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "mnist",
                {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 4}})
    js = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "mnist", {"replicatedJobs": [
        {"name": "node", "replicas": 1,
         "template": {"spec": {"parallelism": 4, "completions": 4, "template": tmpl()}}}]})
    got = infer(pod(), [job("mnist-node-0", 4, 4), js, train], ours)
    assert got == Gang("trainjob-mnist", 4, got.why) and "TrainJob mnist" in got.why


def pytorchjob(**extra: Any) -> dict[str, Any]:
    # training-operator's examples/pytorch/simple.yaml
    return obj("kubeflow.org/v1", "PyTorchJob", "pytorch-simple", {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": tmpl()},
            "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": tmpl()}},
        **extra})


def test_pytorchjob_master_and_workers_start_together() -> None:
    got = infer(pod(), [pytorchjob()], ours)
    assert got == Gang("pytorchjob-pytorch-simple", 4, got.why, anchors=1)  # its Master


def test_pytorchjob_elastic_and_min_available() -> None:
    elastic = infer(pod(), [pytorchjob(elasticPolicy={"minReplicas": 1, "maxReplicas": 3})], ours)
    assert isinstance(elastic, Gang) and elastic.min_member == 2
    explicit = infer(pod(), [pytorchjob(runPolicy={"schedulingPolicy": {"minAvailable": 3}})],
                     ours)
    assert isinstance(explicit, Gang) and explicit.min_member == 3


def raycluster(head_gpu: bool = False) -> dict[str, Any]:
    # kuberay's ray-cluster.autoscaler.yaml shape
    return obj("ray.io/v1", "RayCluster", "raycluster-autoscaler", {
        "enableInTreeAutoscaling": True,
        "headGroupSpec": {"rayStartParams": {}, "template": tmpl(head_gpu)},
        "workerGroupSpecs": [
            {"groupName": "gpu-group", "replicas": 1, "minReplicas": 2, "maxReplicas": 10,
             "rayStartParams": {}, "template": tmpl()},
            {"groupName": "tpu-like", "minReplicas": 1, "numOfHosts": 2, "template": tmpl()}]})


def test_raycluster_head_and_min_replicas() -> None:
    got = infer(pod(), [raycluster(head_gpu=True)], ours)
    assert got == Gang("raycluster-raycluster-autoscaler", 5, got.why, anchors=1)  # its head
    cpu_head = infer(pod(), [raycluster()], ours)
    assert isinstance(cpu_head, Gang) and cpu_head.min_member == 4
    assert cpu_head.anchors == 0  # a head tessera does not schedule is not waited for


def test_rayjob_is_grouped_through_its_raycluster() -> None:
    rayjob = obj("ray.io/v1", "RayJob", "rayjob-sample", {"entrypoint": "python x.py"})
    got = infer(pod(), [raycluster(), rayjob], ours)
    assert got == Gang("rayjob-rayjob-sample", 4, got.why)


def lws(policy: str | None = None) -> dict[str, Any]:
    # lws's config/samples: replicas 3 groups of size 4
    spec: dict[str, Any] = {"replicas": 3, "leaderWorkerTemplate": {
        "size": 4, "restartPolicy": "RecreateGroupOnPodRestart", "workerTemplate": tmpl()}}
    if policy:
        spec["startupPolicy"] = policy
    return obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "vllm", spec)


def test_leaderworkerset_group_is_leader_and_workers() -> None:
    labels = {"leaderworkerset.sigs.k8s.io/group-index": "1"}
    leader_sts = obj("apps/v1", "StatefulSet", "vllm", {})
    worker_sts = obj("apps/v1", "StatefulSet", "vllm-1", {})
    leader_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-1"}}
    as_worker = infer(pod(labels), [worker_sts, leader_pod, leader_sts, lws()], ours)
    as_leader = infer(pod(labels), [leader_sts, lws()], ours)
    assert as_worker == as_leader == Gang("lws-vllm-1", 4, as_worker.why)
    ready = infer(pod(labels), [leader_sts, lws("LeaderReady")], ours)
    assert isinstance(ready, Gang) and ready.min_member == 1


def test_deployment_statefulset_replicaset_pods_are_on_their_own() -> None:
    dep = obj("apps/v1", "Deployment", "serve", {})
    rs = obj("apps/v1", "ReplicaSet", "serve-abc", {})
    sts = obj("apps/v1", "StatefulSet", "db", {})
    for chain in ([rs, dep], [rs], [sts]):
        got = infer(pod(), chain, ours)
        assert isinstance(got, PerPod) and not got.unknown


def test_unknown_owner_is_per_pod_and_says_so() -> None:
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
          "metadata": {"name": "wf", "uid": "u"}}
    got = infer(pod(), [wf], ours)
    assert isinstance(got, PerPod) and got.unknown
    assert "Workflow (argoproj.io/v1alpha1)" in got.why and "gang-min-member" in got.why
    # A known kind under an unknown top owner is not half a gang either.
    got = infer(pod(), [job("step", 4, 4), wf], ours)
    assert isinstance(got, PerPod) and got.unknown


def test_override_annotation_on_the_top_owner() -> None:
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
          "metadata": {"name": "wf", "annotations": {"tessera.io/gang-min-member": "3"}}}
    assert infer(pod(), [wf], ours) == Gang("workflow-wf", 3, infer(pod(), [wf], ours).why)
    js = jobset()
    js["metadata"]["annotations"] = {"tessera.io/gang-min-member": "2"}
    got = infer(pod(), [job("pytorch-workers-0", 4, 4), js], ours)
    assert isinstance(got, Gang) and got.min_member == 2 and got.name == "jobset-pytorch"


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "100001"])
def test_bad_override_names_the_field(bad: str) -> None:
    js = jobset()
    js["metadata"]["annotations"] = {"tessera.io/gang-min-member": bad}
    with pytest.raises(InvalidRequest) as exc:
        infer(pod(), [job("pytorch-workers-0", 4, 4), js], ours)
    assert exc.value.field == "JobSet pytorch.metadata.annotations[tessera.io/gang-min-member]"


def test_bad_manifest_field_is_named() -> None:
    bad = pytorchjob()
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "three"
    with pytest.raises(InvalidRequest) as exc:
        infer(pod(), [bad], ours)
    assert exc.value.field == "spec.pytorchReplicaSpecs.Worker.replicas"


def test_raycluster_head_is_the_anchor_and_workers_up_to_max_are_elastic() -> None:
    head = infer(pod({"ray.io/node-type": "head"}), [raycluster(head_gpu=True)], ours)
    worker = infer(pod({"ray.io/node-type": "worker"}), [raycluster(head_gpu=True)], ours)
    assert isinstance(head, Gang) and head.anchor and head.min_member == 5
    assert isinstance(worker, Gang) and not worker.anchor and worker.min_member == 5
    assert "up to maxReplicas" in head.why


def test_raycluster_min_above_max_is_per_pod_naming_the_field() -> None:
    # KubeRay v1.5.0 runs maxReplicas workers then ("Please fix this"): fewer than the minimum,
    # so a gang of head + minReplicas would wait for ever.
    rc = raycluster()
    rc["spec"]["workerGroupSpecs"][0].update(minReplicas=5, maxReplicas=3)
    got = infer(pod(), [rc], ours)
    assert isinstance(got, PerPod) and got.unknown
    assert ("spec.workerGroupSpecs[0].minReplicas 5 is above "
            "spec.workerGroupSpecs[0].maxReplicas 3") in got.why
    rayjob = obj("ray.io/v1", "RayJob", "rj", {"entrypoint": "python x.py"})
    via_job = infer(pod(), [rc, rayjob], ours)
    assert isinstance(via_job, PerPod) and via_job.unknown and "RayJob rj" in via_job.why
    # The user's own minimum (the override annotation) still makes a gang.
    rc["metadata"]["annotations"] = {"tessera.io/gang-min-member": "2"}
    forced = infer(pod(), [rc], ours)
    assert isinstance(forced, Gang) and forced.min_member == 2
    assert infer(pod({"ray.io/node-type": "head"}), [rc], ours).anchor  # type: ignore[union-attr]
    assert forced.name == "raycluster-raycluster-autoscaler" and "minReplicas 5" in forced.why


def test_pytorchjob_elastic_bounds_default_as_the_operator_does() -> None:
    # training-operator v1.9.3 pytorch_defaults.go: one bound missing takes the other's value.
    only_max = infer(pod(), [pytorchjob(elasticPolicy={"maxReplicas": 3})], ours)
    assert isinstance(only_max, Gang) and only_max.min_member == 4  # Master 1 + Worker 3
    neither = infer(pod(), [pytorchjob(elasticPolicy={"rdzvBackend": "c10d"})], ours)
    assert isinstance(neither, Gang) and neither.min_member == 4
    assert "Worker 3 (elastic up to 3)" in neither.why


@pytest.mark.parametrize(("policy", "words"), [
    ({"minReplicas": 4, "maxReplicas": 2},
     "spec.elasticPolicy.minReplicas 4 is above spec.elasticPolicy.maxReplicas 2"),
    ({"minReplicas": 1, "maxReplicas": 2},
     "spec.pytorchReplicaSpecs.Worker.replicas 3 is outside spec.elasticPolicy "
     "[minReplicas 1, maxReplicas 2]"),
    ({"minReplicas": 4, "maxReplicas": 8},
     "spec.pytorchReplicaSpecs.Worker.replicas 3 is outside spec.elasticPolicy "
     "[minReplicas 4, maxReplicas 8]"),
])
def test_pytorchjob_contradicting_elastic_policy_is_per_pod_naming_the_field(
        policy: dict[str, int], words: str) -> None:
    got = infer(pod(), [pytorchjob(elasticPolicy=policy)], ours)
    assert isinstance(got, PerPod) and got.unknown and words in got.why, got


def test_pytorchjob_anchor_is_the_master_or_the_rendezvous_worker() -> None:
    def role(kind: str, index: str) -> dict[str, Any]:
        return pod({"training.kubeflow.org/replica-type": kind,
                    "training.kubeflow.org/replica-index": index})
    with_master = pytorchjob(elasticPolicy={"minReplicas": 1, "maxReplicas": 3})
    assert infer(role("master", "0"), [with_master], ours).anchor  # type: ignore[union-attr]
    assert not infer(role("worker", "0"), [with_master], ours).anchor  # type: ignore[union-attr]
    workers_only = pytorchjob(elasticPolicy={"minReplicas": 1, "maxReplicas": 3})
    del workers_only["spec"]["pytorchReplicaSpecs"]["Master"]
    got = infer(role("worker", "0"), [workers_only], ours)
    assert isinstance(got, Gang) and got.anchor and got.min_member == 1
    assert not infer(role("worker", "2"), [workers_only], ours).anchor  # type: ignore[union-attr]
    workers_only["spec"]["elasticPolicy"]["rdzvHost"] = "etcd"
    assert not infer(role("worker", "0"), [workers_only], ours).anchor  # type: ignore[union-attr]


def test_the_gang_counts_its_anchors_and_waits_while_an_anchor_pod_does_not_exist() -> None:
    """``tessera.io/gang-anchors`` on every member; the scheduler holds a gang none of whose
    pods runs while fewer of its pods are anchors (the anchor's pod is not created yet)."""
    from types import SimpleNamespace

    from tessera.kube.admission.owners import gang_annotations_of
    from tessera.kube.podgrouper import anchor_pods_missing

    def role(kind: str, index: str) -> dict[str, Any]:
        return pod({"training.kubeflow.org/replica-type": kind,
                    "training.kubeflow.org/replica-index": index})
    rc = raycluster(head_gpu=True)
    worker = infer(pod({"ray.io/node-type": "worker"}), [rc], ours)
    assert isinstance(worker, Gang) and worker.anchors == 1 and not worker.anchor
    assert gang_annotations_of(worker)["tessera.io/gang-anchors"] == "1"
    elastic = pytorchjob(elasticPolicy={"minReplicas": 1, "maxReplicas": 3})
    del elastic["spec"]["pytorchReplicaSpecs"]["Master"]
    got = infer(role("worker", "2"), [elastic], ours)
    assert isinstance(got, Gang) and got.anchors == 1  # worker 0, the rendezvous host
    elastic["spec"]["elasticPolicy"]["rdzvHost"] = "etcd"
    got = infer(role("worker", "2"), [elastic], ours)
    assert isinstance(got, Gang) and got.anchors == 0
    assert "tessera.io/gang-anchors" not in gang_annotations_of(got)
    chief = obj("kubeflow.org/v1", "TFJob", "tf", {"tfReplicaSpecs": {
        "Chief": {"replicas": 1, "template": tmpl()}, "Worker": {"replicas": 2, "template": tmpl()}}})
    got = infer(role("worker", "0"), [chief], ours)
    assert isinstance(got, Gang) and got.anchors == 1

    def member(name: str, anchors: str | None, anchor: bool = False) -> Any:
        ann = {"tessera.io/gang-anchor": "true"} if anchor else {}
        if anchors is not None:
            ann["tessera.io/gang-anchors"] = anchors
        return SimpleNamespace(name=name, annotations=ann)
    workers = [member("w1", "1"), member("w2", "1")]
    assert anchor_pods_missing("raycluster-rc", workers, 0) == (
        "gang raycluster-rc waits for its anchor pod(s) to exist: 1 expected "
        "(tessera.io/gang-anchors), 0 exist (tessera.io/gang-anchor)")
    assert anchor_pods_missing("raycluster-rc", [member("h", "1", True), *workers], 1) is None
    assert anchor_pods_missing("g", [member("a", None), member("b", "x")], 0) is None
