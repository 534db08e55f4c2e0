"""Kubernetes objects of a tessera workload <-> the REST API's documents.

A workload submitted through the API is one ``PodGroup`` (the record: it outlives its pods, so a
suspended workload is still listed) plus ``workers`` pods named ``NAME-0 .. NAME-(N-1)`` that
join it with ``tessera.io/pod-group``. The PodGroup's annotations keep what is needed to build
the pods again (``resume``, requeue after an eviction) and to show the spec.

Pure functions: no API calls here.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube.models.core_v1 import (
    Container,
    EnvVar,
    PodSpec,
    ResourceRequirements,
)
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Pod

from tessera.api.models import compute_doc
from tessera.core.model import GpuKind, GpuRequest, Node
from tessera.core.request_text import devices_text, mig_placement_text
from tessera.core.requests import gpu_request_from_dict
from tessera.kube import names
from tessera.kube.mig import hold_from_json
from tessera.kube.objects import placement_from_json, timestamp

MANAGER = "tessera-api"
"""Value of ``app.kubernetes.io/managed-by`` on PodGroups and pods the API creates."""
WORKLOAD = "tessera.io/workload"
WORKLOAD_ID = "tessera.io/workload-id"
WORKLOAD_TYPE = "tessera.io/workload-type"
POD_INDEX = "tessera.io/pod-index"
RECORD = "tessera.io/workload-spec"
"""PodGroup annotation: JSON of what the pods are built from."""
SUSPENDED = "tessera.io/suspended"
FAILED = "tessera.io/failed"
"""PodGroup annotation: why the workload failed when its pods cannot tell (evicted with
``onEviction: fail``)."""
CONTAINER = "main"
DEFAULT_IMAGE = "busybox:1.36"


def gpu_annotations(gpu: GpuRequest) -> tuple[dict[str, str], int]:
    """The canonical ``tessera.io/...`` annotations of a request, and the whole GPUs to put in
    the container's ``nvidia.com/gpu`` limit (0 for a share)."""
    ann: dict[str, str] = {}
    if gpu.models:
        ann[names.GPU_MODEL] = "|".join(sorted(gpu.models))
    if gpu.kind is GpuKind.WHOLE:
        return ann, gpu.devices
    if gpu.kind is GpuKind.PORTION:
        ann[names.GPU_PORTION] = str(gpu.portion)
        if gpu.portion_limit is not None:
            ann[names.GPU_PORTION_LIMIT] = str(gpu.portion_limit)
    elif gpu.kind is GpuKind.MEMORY:
        ann[names.GPU_MEMORY] = str(gpu.memory)
        if gpu.memory_limit is not None:
            ann[names.GPU_MEMORY_LIMIT] = str(gpu.memory_limit)
    else:
        return ann, 0
    if gpu.devices > 1:
        ann[names.GPU_DEVICES] = str(gpu.devices)
    return ann, 0


@dataclass
class Record:
    """What a workload's pods are built from (the PodGroup's ``tessera.io/workload-spec``)."""

    id: str
    name: str
    namespace: str
    project: str
    type: str
    argv: list[str]
    env: dict[str, str]
    image: str
    working_dir: str | None
    priority_class: str
    preemptible: bool
    workers: int
    min_workers: int
    request: dict[str, Any]
    on_eviction: str = "requeue"
    spec: dict[str, Any] | None = None
    mig_profile: str | None = None
    """A MIG partition per pod instead of ``request`` (canonical profile; docs/mig.md)."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        return cls(**json.loads(text))

    @property
    def gpu(self) -> GpuRequest:
        return gpu_request_from_dict(self.request)


def build_pod(rec: Record, index: int, owner_uid: str | None) -> Pod:
    ann, whole = gpu_annotations(rec.gpu)
    ann[names.POD_GROUP] = rec.name
    ann[names.PRIORITY_CLASS] = rec.priority_class
    if rec.mig_profile is not None:
        ann[names.MIG_PROFILE] = rec.mig_profile
    env = [EnvVar(name=k, value=v) for k, v in rec.env.items()]
    env += [
        EnvVar(name="TESSERA_WORKLOAD_NAME", value=rec.name),
        EnvVar(name="TESSERA_WORKLOAD_ID", value=rec.id),
        EnvVar(name="TESSERA_PROJECT", value=rec.project),
        EnvVar(name="TESSERA_POD_INDEX", value=str(index)),
        EnvVar(name="TESSERA_WORKERS", value=str(rec.workers)),
    ]
    owners = None
    if owner_uid:
        owners = [OwnerReference(apiVersion=f"{names.GROUP}/{names.VERSION}", kind="PodGroup",
                                 name=rec.name, uid=owner_uid, controller=True,
                                 blockOwnerDeletion=False)]
    return Pod(
        metadata=ObjectMeta(
            name=f"{rec.name}-{index}", namespace=rec.namespace, annotations=ann,
            labels={names.MANAGED_BY: MANAGER, WORKLOAD: rec.name, WORKLOAD_ID: rec.id,
                    POD_INDEX: str(index), WORKLOAD_TYPE: rec.type},
            ownerReferences=owners,
        ),
        spec=PodSpec(
            schedulerName=names.SCHEDULER_NAME,
            restartPolicy="Never",
            containers=[Container(
                name=CONTAINER, image=rec.image or DEFAULT_IMAGE, command=list(rec.argv) or None,
                env=env, workingDir=rec.working_dir or None,
                resources=ResourceRequirements(
                    limits={names.GPU_RESOURCE: str(whole)}) if whole else None,
            )],
        ),
    )


def iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _meta(obj: Any) -> Any:
    return obj.metadata


def pod_exit_code(pod: Any) -> int | None:
    for cs in (pod.status.containerStatuses if pod.status else None) or []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            return int(term.exitCode)
    return None


def pod_scheduled_message(pod: Any) -> str | None:
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return str(c.message or c.reason or "")
    return None


def pod_doc(pod: Any, nodes: Mapping[str, Node], uuids: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    meta = pod.metadata
    ann = dict(meta.annotations or {})
    node = pod.spec.nodeName if pod.spec else None
    devices: list[dict[str, Any]] = []
    exclusive = False
    mig_gpus: float | None = None
    raw = ann.get(names.PLACEMENT)
    if raw and node:
        try:
            p = placement_from_json(raw)
        except (ValueError, KeyError, TypeError):
            p = None
        if p is not None:
            exclusive = p.exclusive
            mig_gpus = p.gpus if names.MIG_PARTITION in ann else None
            node_uuids = ann.get(names.NODE_GPU_UUIDS, "").split(",")
            known = uuids.get(p.node, ())
            for i, (d, r, lim) in enumerate(
                    zip(p.devices, p.request_bytes, p.limit_bytes, strict=True)):
                # Whole GPUs are given by the device plugin: the index is only bookkeeping.
                uuid = None if p.exclusive else (
                    node_uuids[i] if i < len(node_uuids) and node_uuids[i] else (
                        known[d] if d < len(known) else None))
                devices.append({"index": d, "uuid": uuid, "requestBytes": r, "limitBytes": lim})
    phase = (pod.status.phase if pod.status else None) or "Pending"
    if meta.deletionTimestamp is not None:
        phase = "Terminating"
    mig = _mig_partition(ann.get(names.MIG_PARTITION), mig_gpus)
    return {
        # A sweep's trial: its Indexed Job's completion index (tessera.kube.sweeps).
        "index": int((meta.labels or {}).get(POD_INDEX) or (meta.labels or {}).get(
            "batch.kubernetes.io/job-completion-index") or 0),
        "name": meta.name,
        "namespace": meta.namespace,
        "phase": phase,
        "nodeName": node,
        "gpuDevices": devices,
        "exclusive": exclusive,
        "migPartition": mig,
        "gpuPlacement": _placement_text(devices, exclusive, mig),
        "pid": None,
        "exitCode": pod_exit_code(pod),
        "logPath": None,
        "configMap": ann.get(names.CONFIGMAP),
        "scheduledMessage": pod_scheduled_message(pod),
    }


def _placement_text(devices: list[dict[str, Any]], exclusive: bool,
                    mig: Mapping[str, Any] | None) -> str:
    """A pod's GPUs in words, as the console and ``describe`` show them."""
    if mig:
        return mig_placement_text({**mig, "gpuIndex": mig.get("gpu")})
    return devices_text(devices, exclusive)


def _mig_partition(raw: str | None, gpus: float | None) -> dict[str, Any] | None:
    """The MIG partition a pod was given at bind (profile, GPU, memory slot), with the GPU
    fraction it counts as; None for other pods or an unreadable annotation."""
    if not raw:
        return None
    try:
        hold = hold_from_json(raw)
    except (ValueError, KeyError, TypeError):
        return None
    return {"profile": hold.profile, "gpu": hold.gpu, "start": hold.start, "gpus": gpus}


def pod_gpus(doc: Mapping[str, Any], nodes: Mapping[str, Node]) -> float:
    """GPUs a bound pod holds: whole devices, its share of each device's memory, or its MIG
    partition's fraction."""
    if doc["phase"] in ("Succeeded", "Failed"):
        return 0.0
    if doc.get("migPartition"):
        return float(doc["migPartition"]["gpus"] or 0.0)
    if not doc["gpuDevices"]:
        return 0.0
    if doc["exclusive"]:
        return float(len(doc["gpuDevices"]))
    node = nodes.get(doc["nodeName"] or "")
    if node is None:
        return 0.0
    mem = {g.index: g.schedulable for g in node.gpus}
    return float(sum(d["requestBytes"] / mem[d["index"]] for d in doc["gpuDevices"]
                     if mem.get(d["index"])))


def phase_of(workers: int, ann: Mapping[str, str], deleting: bool,
             pods: Sequence[dict[str, Any]]) -> tuple[str, str, int | None]:
    """(phase, message, exit code) of a workload from its record's annotations and its pods'
    documents."""
    if deleting:
        return "Deleting", "deleted by user", None
    if ann.get(FAILED):
        return "Failed", ann[FAILED], None
    if ann.get(SUSPENDED) == "true":
        if pods:
            return "Stopping", "suspended by user; deleting its pods", None
        return "Stopped", "suspended by user", None
    failed = [p for p in pods if p["phase"] == "Failed"]
    if failed:
        p = failed[0]
        code = p["exitCode"]
        return "Failed", f"pod {p['index']} failed" + (
            f" with exit code {code}" if code is not None else ""), code
    if pods and len(pods) >= workers and all(p["phase"] == "Succeeded" for p in pods):
        return "Completed", "all pods exited with code 0", 0
    if any(p["phase"] == "Terminating" for p in pods):
        return "Stopping", "pods are being deleted", None
    if len(pods) < workers:
        return "Pending", (f"{workers - len(pods)} of {workers} pod(s) are missing "
                           "(evicted or deleted); they are being created again"), None
    unbound = [p for p in pods if not p["nodeName"]]
    if not unbound:
        nodes = sorted({p["nodeName"] for p in pods})
        return "Running", f"bound to {', '.join(nodes)} by {names.SCHEDULER_NAME}", None
    why = next((p["scheduledMessage"] for p in unbound if p["scheduledMessage"]), None)
    return "Pending", why or f"waiting for {names.COMPONENT}", None


def spec_doc(rec: Record) -> dict[str, Any]:
    spec = {k: v for k, v in (rec.spec or {}).items() if not k.startswith("_")}
    spec["command"] = rec.argv[0] if rec.argv else ""
    spec["args"] = shlex.join(rec.argv[1:])
    spec["environmentVariables"] = [{"name": k, "value": v} for k, v in rec.env.items()]
    spec["image"] = rec.image or DEFAULT_IMAGE
    spec["compute"] = ({"gpuMigProfile": rec.mig_profile} if rec.mig_profile is not None
                       else compute_doc(rec.gpu))
    return spec


@dataclass
class Entry:
    """One workload as found in the cluster: a record and its pods. ``managed``: submitted through
    the API (a PodGroup with a record); otherwise pods applied as manifests (kubectl, a
    StatefulSet), grouped by ``tessera.io/pod-group`` or alone, shown read-only."""

    rec: Record
    annotations: dict[str, str]
    deleting: bool
    created: float
    pods: list[Any]
    managed: bool
    controller: str | None = None
    """``Kind/name`` of the controller owning a manifest workload's pods, if any."""
    group: Any = None
    """The PodGroup object of a managed workload."""


def created_at(obj: Any) -> float:
    return timestamp(obj.metadata.creationTimestamp) or 0.0


def bound_at(pod: Any) -> float:
    """When a bound pod started, as far as tessera is concerned: its binding, which the API
    server stamps as the PodScheduled condition's transition to True; else the kubelet's start
    time; else its creation."""
    status = pod.status
    for c in (status.conditions if status else None) or []:
        if c.type == "PodScheduled" and c.status == "True" and c.lastTransitionTime:
            return timestamp(c.lastTransitionTime) or created_at(pod)
    return (timestamp(status.startTime) if status else None) or created_at(pod)


def pending_since(created: float, pods: Sequence[Any]) -> float:
    """The workload's last transition to Pending: its current pods' creation (a requeue, a
    resume or a replaced pod makes new pods, which wait again), not the workload's submission;
    the workload's creation while it has no pods yet."""
    return max(created, min(created_at(p) for p in pods)) if pods else created


def owned_meta(rec: Record, owner_uid: str) -> dict[str, Any]:
    """Metadata of an object a workload owns through its PodGroup (a Service, an Ingress, a
    sweep's Job, a scaling inference's Deployment; the garbage collector removes it with the
    workload): the workload's name and tessera's labels, the owner reference."""
    return {"name": rec.name, "namespace": rec.namespace,
            "labels": {names.MANAGED_BY: MANAGER, WORKLOAD: rec.name, WORKLOAD_ID: rec.id},
            "ownerReferences": [{
                "apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": "PodGroup",
                "name": rec.name, "uid": owner_uid, "controller": True,
                "blockOwnerDeletion": False}]}


def service_url(name: str, namespace: str, port: int) -> str:
    """The in-cluster URL of a workload's Service port."""
    return f"http://{name}.{namespace}.svc.cluster.local:{port}"
