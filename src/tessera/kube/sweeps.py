"""Sweeps (HPO) on the Kubernetes backend: an Indexed Job the Job controller runs.

``tessera submit --parallelism P --completions C [--backoff-limit B]`` (REST ``spec.parallelism``,
``spec.completions``, ``spec.backoffLimit``) makes, besides the workload's PodGroup (its record,
minimum 1: trials are independent), a ``batch/v1`` Job owned by that PodGroup with
``completionMode: Indexed``, ``completions: C``, ``parallelism: P`` and ``backoffLimit: B``
(default 6, the Job's own default), whose pod template is the pod tessera would have made (GPU
annotations, ``tessera.io/pod-group``, ``schedulerName: tessera``). Kubernetes' Job controller
(kube-controller-manager) then does what a sweep is: at most P trial pods at once, each with
``JOB_COMPLETION_INDEX`` 0..C-1, a failed trial retried until B failures in all. Deleting the
workload deletes the PodGroup; the garbage collector removes the Job and its pods. Suspending
sets the Job's ``spec.suspend`` (the Job controller removes the running trials).

The workload's phase is read from its trial pods (no extra request): Completed when every index
has a Succeeded pod, Failed when more than B trial pods failed, Running while a trial runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightkube import Client

from tessera.kube import workload_docs as wd

DEFAULT_BACKOFF_LIMIT = 6
"""The Job's own default (batch/v1 ``spec.backoffLimit``), as in embedded mode."""
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The label (and annotation) the Job controller puts on each pod of an Indexed Job."""


def is_sweep(rec: wd.Record) -> bool:
    return bool(rec.spec) and (rec.spec or {}).get("completions") is not None


def sizes(rec: wd.Record) -> tuple[int, int, int]:
    """(completions, parallelism, backoffLimit) of a sweep's record."""
    spec = rec.spec or {}
    completions = int(spec["completions"])
    parallelism = int(spec.get("parallelism") or completions)
    backoff = spec.get("backoffLimit")
    return completions, parallelism, DEFAULT_BACKOFF_LIMIT if backoff is None else int(backoff)


def build_job(rec: wd.Record, owner_uid: str) -> dict[str, Any]:
    """The Indexed Job of a sweep, owned by its PodGroup."""
    pod = wd.build_pod(rec, 0, None).to_dict()
    meta = pod["metadata"]
    for key in ("name", "namespace", "ownerReferences"):
        meta.pop(key, None)
    meta["labels"].pop(wd.POD_INDEX, None)
    container = pod["spec"]["containers"][0]
    container["env"] = [e for e in container.get("env") or []
                        if e["name"] != "TESSERA_POD_INDEX"] + [{
        "name": "TESSERA_POD_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}}]
    completions, parallelism, backoff = sizes(rec)
    job_meta = wd.owned_meta(rec, owner_uid)
    job_meta["labels"][wd.WORKLOAD_TYPE] = rec.type
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta,
        "spec": {"completionMode": "Indexed", "completions": completions,
                 "parallelism": parallelism, "backoffLimit": backoff,
                 "template": {"metadata": meta, "spec": pod["spec"]}},
    }


def create_job(client: Client, rec: wd.Record, owner_uid: str) -> None:
    from lightkube.resources.batch_v1 import Job

    job: Job = Job.from_dict(build_job(rec, owner_uid))  # type: ignore[assignment]
    client.create(job, namespace=rec.namespace)


def suspend_job(client: Client, rec: wd.Record, suspend: bool) -> bool:
    """Sets a sweep's Job's ``spec.suspend``; False (nothing done) when ``rec`` is no sweep."""
    from lightkube.resources.batch_v1 import Job
    from lightkube.types import PatchType

    if not is_sweep(rec):
        return False
    client.patch(Job, rec.name, {"spec": {"suspend": suspend}}, namespace=rec.namespace,
                 patch_type=PatchType.MERGE)
    return True


def trial_index(labels: dict[str, str]) -> int | None:
    raw = labels.get(INDEX_LABEL)
    return int(raw) if raw is not None and raw.isdigit() else None


def phase(rec: wd.Record, ann: dict[str, str], deleting: bool,
          pods: Sequence[dict[str, Any]]) -> tuple[str, str, int | None]:
    """(phase, message, exit code) of a sweep from its trial pods' documents."""
    if deleting:
        return "Deleting", "deleted by user", None
    if ann.get(wd.SUSPENDED) == "true":
        return ("Stopping", "suspended by user; its trials are being removed", None) if any(
            p["phase"] in ("Running", "Pending") for p in pods) else (
            "Stopped", "suspended by user", None)
    completions, parallelism, backoff = sizes(rec)
    done = {p["index"] for p in pods if p["phase"] == "Succeeded"}
    failed = [p for p in pods if p["phase"] == "Failed"]
    running = sum(1 for p in pods if p["phase"] == "Running")
    if len(done) >= completions:
        return "Completed", f"all {completions} trials exited with code 0", 0
    if len(failed) > backoff:
        return "Failed", (f"{len(failed)} trials failed, more than backoffLimit {backoff} "
                          f"({len(done)} of {completions} completed)"), failed[0]["exitCode"]
    progress = (f"{len(done)} of {completions} trials completed, {running} running "
                f"(parallelism {parallelism}), {len(failed)} failed (backoffLimit {backoff})")
    if running:
        return "Running", progress, None
    unbound = [p for p in pods if not p["nodeName"] and p["phase"] == "Pending"]
    why = next((p["scheduledMessage"] for p in unbound if p["scheduledMessage"]), None)
    return "Pending", f"{progress}: {why}" if why else progress, None
