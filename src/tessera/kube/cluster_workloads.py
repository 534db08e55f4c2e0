"""Reading workloads from the cluster: PodGroups the API created (with the record it keeps in
an annotation) and their pods, pods applied as manifests (grouped as the scheduler groups them),
their Events, and the API's document for each."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from lightkube.resources.core_v1 import Event, Pod

from tessera.api.backend import NotFound
from tessera.core.mig import profile_fraction
from tessera.core.model import GpuRequest
from tessera.core.model import Node as CoreNode
from tessera.core.request_text import request_text
from tessera.core.requests import estimate_gpus, gpu_request_to_dict
from tessera.core.workloads import PRIORITY_CLASSES
from tessera.kube import names, sweeps
from tessera.kube import workload_docs as wd
from tessera.kube.admission import compute_spellings
from tessera.kube.objects import PodGroupResource, ProjectResource, pod_info
from tessera.kube.podgrouper import min_member_of

log = logging.getLogger(__name__)


ISOLATION = ("per node: the admission webhook preloads the isolation library and the node "
             "agent enforces each pod's ConfigMap limits")
"""What the API says about isolation on Kubernetes."""


class ClusterWorkloads:
    def __init__(self, client: Any) -> None:
        self.client: Any = client

    def groups(self, namespace: str = "*") -> list[Any]:
        return list(self.client.list(PodGroupResource, namespace=namespace,
                                     labels={names.MANAGED_BY: wd.MANAGER}))

    def pods_of(self, namespace: str, wid: str) -> list[Any]:
        return list(self.client.list(Pod, namespace=namespace, labels={wd.WORKLOAD_ID: wid}))

    def managed(self, group: Any, pods: list[Any]) -> wd.Entry:
        meta = group.metadata
        return wd.Entry(wd.Record.from_json(meta.annotations[wd.RECORD]),
                        dict(meta.annotations or {}), meta.deletionTimestamp is not None,
                        wd.created_at(group), pods, True, group=group)

    def entries(self) -> list[wd.Entry]:
        """Every workload: PodGroups the API made with their pods, then the other pods with
        ``schedulerName: tessera`` (manifests), grouped as the scheduler groups them."""
        groups = list(self.client.list(PodGroupResource, namespace="*"))
        pods = list(self.client.list(Pod, namespace="*",
                                     fields={"spec.schedulerName": names.SCHEDULER_NAME}))
        owners = {(p.get("spec") or {}).get("namespace"): p.metadata.name
                  for p in self.client.list(ProjectResource)}
        by_wid: dict[str, list[Any]] = {}
        foreign: dict[tuple[str, str, str], list[Any]] = {}
        for pod in pods:
            labels = pod.metadata.labels or {}
            if labels.get(names.RESERVATION_LABEL) == "true":
                continue
            wid = labels.get(wd.WORKLOAD_ID)
            if wid:
                by_wid.setdefault(wid, []).append(pod)
                continue
            group = (pod.metadata.annotations or {}).get(names.POD_GROUP) or labels.get(
                names.POD_GROUP)
            key = ("g", pod.metadata.namespace, group) if group else (
                "p", pod.metadata.namespace, pod.metadata.name)
            foreign.setdefault(key, []).append(pod)
        entries = []
        min_member: dict[tuple[str, str], int] = {}
        for g in groups:
            if (g.metadata.labels or {}).get(names.MANAGED_BY) != wd.MANAGER:
                min_member[(g.metadata.namespace, g.metadata.name)] = int(
                    (g.get("spec") or {}).get("minMember", 1))
                continue
            wid = (g.metadata.labels or {}).get(wd.WORKLOAD_ID, "")
            try:
                entries.append(self.managed(g, by_wid.get(wid, [])))
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("PodGroup %s/%s has no readable record: %r",
                            g.metadata.namespace, g.metadata.name, exc)
        for key, members in foreign.items():
            entries.append(manifest_entry(key, members, owners, min_member))
        return entries

    def find(self, workload_id: str, kind: str | None) -> wd.Entry:
        found = list(self.client.list(PodGroupResource, namespace="*",
                                      labels={wd.WORKLOAD_ID: workload_id}))
        entry = None
        if found:
            rec = wd.Record.from_json(found[0].metadata.annotations[wd.RECORD])
            entry = self.managed(found[0], self.pods_of(rec.namespace, rec.id))
        else:
            entry = next((e for e in self.entries() if e.rec.id == workload_id), None)
        if entry is None or (kind is not None and entry.rec.type != kind):
            raise NotFound(f"workload {workload_id} not found")
        return entry

    def doc(self, entry: wd.Entry, nodes: dict[str, CoreNode],
                      uuids: dict[str, tuple[str, ...]], brief: bool,
                      simulated: bool = False, events: bool = True) -> dict[str, Any]:
        """The API's document; ``events`` (a LIST of the namespace's Events) only for
        ``describe``: a submit's answer needs none."""
        rec = entry.rec
        pod_docs = [wd.pod_doc(p, nodes, uuids) for p in entry.pods]
        if entry.managed:
            pod_docs.sort(key=lambda d: d["index"])
        else:
            pod_docs.sort(key=lambda d: d["name"])
            for i, d in enumerate(pod_docs):
                d["index"] = i
        if sweeps.is_sweep(rec):
            phase, message, code = sweeps.phase(rec, entry.annotations, entry.deleting, pod_docs)
        else:
            phase, message, code = wd.phase_of(rec.workers, entry.annotations, entry.deleting,
                                               pod_docs)
        bound = [d for d in pod_docs if d["nodeName"]]
        starts = [wd.bound_at(p) for p in entry.pods if p.spec and p.spec.nodeName]
        gpu = rec.gpu
        out: dict[str, Any] = {
            "workloadId": rec.id,
            "name": rec.name,
            "requestedName": rec.name,
            "type": rec.type,
            "projectId": rec.project,
            "projectName": rec.project,
            "phase": phase,
            "phaseMessage": message,
            "createdAt": wd.iso(entry.created),
            "startedAt": wd.iso(min(starts)) if starts and phase != "Pending" else None,
            "pendingSince": wd.iso(wd.pending_since(entry.created, entry.pods)),
            "completedAt": None,
            "exitCode": code,
            "priorityClass": rec.priority_class,
            "preemptible": rec.preemptible,
            "nodeName": ",".join(sorted({d["nodeName"] for d in bound})) or None,
            "gpuDevices": ",".join(str(x["index"]) for d in bound for x in d["gpuDevices"]),
            "workers": rec.workers,
            "minWorkers": rec.min_workers,
            "runningPods": sum(1 for d in pod_docs if d["phase"] == "Running"),
            "gpus": {
                "requested": round(_requested(rec, nodes), 4),
                "allocated": round(sum(wd.pod_gpus(d, nodes) for d in bound), 4),
                "request": request_text(gpu, rec.workers, rec.mig_profile),
            },
            "simulated": simulated,
            "image": rec.image,
            "serviceUrls": list((rec.spec or {}).get("_serviceUrls") or []),
            "namespace": rec.namespace,
        }
        if brief:
            return out
        out["source"] = "tessera" if entry.managed else "manifest"
        out["controller"] = entry.controller
        gang = next((str(a[names.GANG]) for p in entry.pods
                     if names.GANG in (a := p.metadata.annotations or {})), None)
        if gang is not None:
            out["gang"] = gang
        share = compute_spellings.share_doc(entry.pods[0].metadata.annotations or {}) if entry.pods else None
        if share is not None:
            out["computeShare"] = share
        out["spec"] = wd.spec_doc(rec)
        out["pods"] = pod_docs
        if events:
            out["events"] = self.events(rec.namespace,
                                         {rec.name, *(d["name"] for d in pod_docs)})
        out["isolation"] = ISOLATION
        out["scheduler"] = f"{names.COMPONENT} (schedulerName: {names.SCHEDULER_NAME})"
        return out

    def events(self, namespace: str, objects: set[str]) -> list[dict[str, Any]]:
        out = []
        for ev in self.client.list(Event, namespace=namespace):
            involved = ev.involvedObject
            if involved is None or involved.name not in objects:
                continue
            when: Any = ev.lastTimestamp or ev.eventTime or ev.firstTimestamp or (
                ev.metadata.creationTimestamp if ev.metadata else None)
            stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ") if hasattr(when, "strftime") else str(when)
            who = "" if involved.kind == "PodGroup" else f"pod {involved.name}: "
            out.append({"time": stamp, "kind": ev.reason or "", "message": who + (ev.message or "")})
        out.sort(key=lambda e: e["time"])
        return out

def _requested(rec: wd.Record, nodes: dict[str, CoreNode]) -> float:
    """GPUs the workload asks for: a MIG profile counts as its fraction per pod."""
    if rec.mig_profile is not None:
        return profile_fraction(rec.mig_profile) * rec.workers
    return estimate_gpus(rec.gpu, nodes.values(), rec.workers) if nodes else 0.0


def _inferred_min(pods: list[Any]) -> int:
    """A gang's minimum from its pods (``tessera.io/gang-min-member``, written by the webhook
    from their owners: docs/workloads.md), else every pod."""
    mins = [min_member_of(p.metadata.annotations or {}) for p in pods]
    known = [m for m in mins if m is not None]
    return min(known) if known else len(pods)


def manifest_entry(key: tuple[str, str, str], pods: list[Any], owners: dict[Any, str],
                    min_member: dict[tuple[str, str], int]) -> wd.Entry:
    """A workload of pods applied as manifests: read-only, built from the pods themselves."""
    kind, namespace, name = key
    pods.sort(key=lambda p: p.metadata.name)
    first = pods[0]
    labels = first.metadata.labels or {}
    ann = first.metadata.annotations or {}
    info = pod_info(first)
    gpu = info.request.gpu if info.request is not None else GpuRequest.none()
    pclass = ann.get(names.PRIORITY_CLASS) or (first.spec.priorityClassName if first.spec
                                               else None) or "train"
    known = PRIORITY_CLASSES.get(pclass)
    container = first.spec.containers[0] if first.spec and first.spec.containers else None
    argv = list((container.command or []) + (container.args or [])) if container else []
    controller = next((f"{o.kind}/{o.name}" for o in first.metadata.ownerReferences or []
                       if o.controller), None)
    rec = wd.Record(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"tessera:{namespace}/{kind}/{name}")),
        name=name, namespace=namespace,
        project=labels.get(names.PROJECT) or owners.get(namespace) or "",
        type=labels.get(wd.WORKLOAD_TYPE) or "Training", argv=argv, env={},
        image=(container.image or "") if container else "", working_dir=None,
        priority_class=pclass, preemptible=known.preemptible if known else True,
        workers=len(pods), min_workers=min_member.get((namespace, name)) or _inferred_min(pods),
        request=gpu_request_to_dict(gpu),
        spec={"invalidRequest": info.error} if info.error else {},
        mig_profile=info.mig_profile,
    )
    return wd.Entry(rec, {}, all(p.metadata.deletionTimestamp is not None for p in pods),
                    min(wd.created_at(p) for p in pods), pods, False, controller)
