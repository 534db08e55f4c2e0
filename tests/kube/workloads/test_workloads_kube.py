"""Gangs from owners on a real control plane: kube-controller-manager makes the pods of a Job,
an Indexed Job and a Deployment; tessera's webhook reads their owners (chart RBAC) and the
scheduler starts each gang together or not at all, reclaims a gang whole, and says why a gang
waits (pod condition, Event, ``tessera describe``'s document).

Name: each test is named after the engine it drives (``indexed_job``, ``deployment``...), so
``pytest -k indexed_job`` runs one engine alone. kwok completes a Job's pods as soon as they run
(its fast stages), so "together" is read from the bindings."""

from __future__ import annotations

from typing import Any

from lightkube import Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import (
    events_of,
    pods,
    project_namespace,
    scheduled_message,
    wait_pods,
)
from tests.waiting import wait_until


def template(gpu: dict[str, str], labels: dict[str, str] | None = None,
             restart: str = "Never") -> dict[str, Any]:
    """A pod template; ``gpu``: annotations, or ``{"whole": "N"}`` for N whole GPUs."""
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    ann = dict(gpu)
    spec: dict[str, Any] = {"restartPolicy": restart, "containers": [container]}
    if "whole" in ann:  # whole GPUs are tessera's when it schedules the pod
        container["resources"] = {"limits": {"nvidia.com/gpu": ann.pop("whole")}}
        spec["schedulerName"] = "tessera"
    return {"metadata": {"labels": labels or {}, "annotations": ann}, "spec": spec}


def job(name: str, parallelism: int, completions: int, gpu: dict[str, str],
        mode: str = "Indexed") -> Any:
    # The Kubernetes docs' Indexed Job ("Indexed Job for Parallel Processing with Static Work
    # Assignment") with a GPU share added to its pod template.
    return codecs.from_dict({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": parallelism, "completionMode": mode,
                 "backoffLimit": 0, "template": template(gpu)}})


def bound(p: Pod) -> bool:
    return bool(p.spec and p.spec.nodeName)


def test_indexed_job_gang_starts_together(client: Client) -> None:
    ns, _ = project_namespace(client, "indexed-job")
    client.create(job("train", 4, 4, {"tessera.io/gpu-portion": "0.5"}), namespace=ns)
    members = wait_pods(client, ns, 4, **{"job-name": "train"})
    ann = members[0].metadata.annotations or {}
    assert ann[names.POD_GROUP] == "job-train"
    assert ann[names.GANG_MIN_MEMBER] == "4"
    assert "4 pods start together" in ann[names.GANG]
    wait_until("all 4 bound", lambda: all(bound(p) for p in pods(
        client, ns, **{"job-name": "train"})), timeout=60)
    indexes = sorted(int((p.metadata.annotations or {})[
        "batch.kubernetes.io/job-completion-index"]) for p in pods(client, ns))
    assert indexes == [0, 1, 2, 3]
    wait_until("the Job succeeded", lambda: (client.get(Job, "train", namespace=ns).status
                                             .succeeded or 0) == 4, timeout=60)


def test_indexed_job_gang_too_big_starts_no_pod_and_says_why(stack: TestCluster,
                                                              client: Client) -> None:
    ns, _ = project_namespace(client, "indexed-job-big", deserved=16)
    # 9 pods of one whole GPU on 2 nodes x 4 GPUs: the gang can never fit, so none starts.
    client.create(job("wide", 9, 9, {"whole": "1"}), namespace=ns)
    wait_pods(client, ns, 9, **{"job-name": "wide"})

    def all_waiting() -> bool:
        got = pods(client, ns, **{"job-name": "wide"})
        return len(got) == 9 and all("gang" in scheduled_message(p) for p in got)
    wait_until("every member says it waits for its gang", all_waiting, timeout=60)
    got = pods(client, ns, **{"job-name": "wide"})
    assert not any(bound(p) for p in got)
    message = scheduled_message(got[0])
    assert "9" in message, message
    said = [e.message or "" for p in got for e in events_of(client, ns, p.metadata.name)
            if e.reason == "FailedScheduling"]
    assert any("gang" in m for m in said), said
    # tessera describe's document for the manifest workload carries the same reason.
    from tessera.kube.cluster_workloads import ClusterWorkloads

    cw = ClusterWorkloads(client)
    entry = next(e for e in cw.entries() if e.rec.name == "job-wide")
    doc = cw.doc(entry, {}, {}, brief=False)
    assert doc["minWorkers"] == 9 and doc["phase"] == "Pending"
    assert "gang" in doc["phaseMessage"], doc["phaseMessage"]
    # Garbage collection (kube-controller-manager) removes the pods with their Job.
    client.delete(Job, "wide", namespace=ns, cascade=CascadeType.BACKGROUND)
    wait_until("the Job's pods deleted", lambda: not pods(client, ns, **{"job-name": "wide"}),
               timeout=60)


def test_indexed_job_sweep_runs_trials_at_parallelism(client: Client) -> None:
    ns, _ = project_namespace(client, "indexed-job-sweep")
    client.create(job("sweep", 3, 9, {"tessera.io/gpu-portion": "0.25"}), namespace=ns)
    wait_until("the sweep completed", lambda: (client.get(Job, "sweep", namespace=ns).status
                                               .succeeded or 0) == 9, timeout=90)
    got = pods(client, ns, **{"job-name": "sweep"})
    assert {(p.metadata.annotations or {})[names.GANG_MIN_MEMBER] for p in got} == {"1"}


def deployment(name: str, replicas: int, gpu: dict[str, str],
               annotations: dict[str, str] | None = None) -> Any:
    return codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": template(gpu, {"app": name}, restart="Always")}})


def test_deployment_pods_are_scheduled_on_their_own(client: Client) -> None:
    ns, _ = project_namespace(client, "deployment")
    client.create(deployment("serve", 3, {"tessera.io/gpu-portion": "0.5"}), namespace=ns)
    wait_until("3 replicas bound", lambda: len([p for p in pods(client, ns, app="serve")
                                                if bound(p)]) == 3, timeout=60)
    for p in pods(client, ns, app="serve"):
        ann = p.metadata.annotations or {}
        assert names.POD_GROUP not in ann and ann[names.GANG].startswith("no gang")
    client.delete(Deployment, "serve", namespace=ns)
    wait_until("the replicas gone", lambda: not pods(client, ns, app="serve"), timeout=60)


def test_deployment_gang_override_is_reclaimed_whole(client: Client) -> None:
    """A Deployment made a gang (tessera.io/gang-min-member) runs over its project's quota; a
    project within its quota reclaims room, and the gang is evicted whole, never in part."""
    low, _ = project_namespace(client, "deployment-gang", deserved=0)
    high, _ = project_namespace(client, "deployment-reclaimer", deserved=8)
    whole = {"whole": "2"}
    # 3 members x 2 GPUs on 2 nodes x 4 GPUs.
    client.create(deployment("gang", 3, whole, {"tessera.io/gang-min-member": "3"}),
                  namespace=low)
    first = wait_until("the gang of 3 bound", lambda: (lambda got: got if len(got) == 3 else None)(
        [p for p in pods(client, low, app="gang") if bound(p)]), timeout=60)
    assert {(p.metadata.annotations or {})[names.POD_GROUP] for p in first} == {"deployment-gang"}
    uids = {p.metadata.uid for p in first}
    # A gang of 2 x 3 GPUs of a project within its quota (a pod of 3 per node): reclaim evicts
    # the over-quota gang, every member of it, and its recreated members wait as a gang.
    client.create(deployment("reclaimer", 2, {"whole": "3"},
                             {"tessera.io/gang-min-member": "2"}), namespace=high)
    try:
        wait_until("the reclaimer bound", lambda: len([
            p for p in pods(client, high, app="reclaimer") if bound(p)]) == 2, timeout=90)
    except AssertionError:
        raise AssertionError([scheduled_message(p) for p in pods(client, high, app="reclaimer")]
                             ) from None

    def all_gone() -> bool:
        return not uids & {p.metadata.uid for p in pods(client, low, app="gang")
                           if p.metadata.deletionTimestamp is None}
    wait_until("every member of the gang evicted", all_gone, timeout=60)
    # The ReplicaSet makes the members again: 6 GPUs for the gang, 2 free: none starts.
    wait_until("the new members wait as a gang", lambda: (lambda got: len(got) == 3 and all(
        "gang" in scheduled_message(p) for p in got))(
        [p for p in pods(client, low, app="gang") if p.metadata.deletionTimestamp is None]),
        timeout=60)
    assert not any(bound(p) for p in pods(client, low, app="gang")
                   if p.metadata.deletionTimestamp is None)
    client.delete(Deployment, "gang", namespace=low)
    client.delete(Deployment, "reclaimer", namespace=high)


def test_unknown_owner_kind_is_per_pod_with_an_event(client: Client) -> None:
    ns, _ = project_namespace(client, "unknown-owner")
    owner = client.create(codecs.from_dict({"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "my-engine"}}), namespace=ns)
    client.create(codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "member", "annotations": {"tessera.io/gpu-portion": "0.5"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "my-engine",
                             "uid": owner.metadata.uid, "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}), namespace=ns)
    pod = wait_until("the pod bound on its own", lambda: (lambda p: p if bound(p) else None)(
        client.get(Pod, "member", namespace=ns)), timeout=60)
    assert "ConfigMap (v1) is not one tessera infers gangs for" in \
        (pod.metadata.annotations or {})[names.GANG]
    wait_until("a GangNotInferred Event on the owner", lambda: any(
        e.reason == "GangNotInferred" for e in events_of(client, ns, "my-engine")), timeout=30)
