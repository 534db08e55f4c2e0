"""Kubernetes objects turned into the plain data the scheduler keeps: parsed once per event.

Over 400 lines because it holds one small parser per kind the scheduler watches (pods, other
schedulers' pods, nodes, Projects, PodGroups); each is short and they share the helpers."""

from __future__ import annotations

import itertools
import json
import logging
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from tessera.core import nvlink
from tessera.core.errors import InvalidRequest
from tessera.core.gpu_models import default_headroom, model_of_product
from tessera.core.mig import profile_fraction
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.projects import Project, Quota
from tessera.core.state import Placement
from tessera.core.units import MiB, parse_memory
from tessera.core.workloads import PRIORITY_CLASSES
from tessera.kube import names
from tessera.kube.mig import MigHold, NodeMigGpu, hold_from_json, mig_gpus
from tessera.kube.podspec import (
    ContainerResources,
    mig_profile,
    parse_cpu_milli,
    pod_request,
    whole_gpus,
)
from tessera.kube.predicates.spec import (
    SchedulingSpec,
    Taint,
    resources_of,
    scheduling_spec,
    taints_of,
)
from tessera.kube.predicates.topology import TopologyRequest, topology_request
from tessera.wire import placement_from_json as placement_from_json
from tessera.wire import placement_to_json as placement_to_json

ProjectResource = create_global_resource(names.GROUP, names.VERSION, "Project", "projects")
PodGroupResource = create_namespaced_resource(names.GROUP, names.VERSION, "PodGroup", "podgroups")

log = logging.getLogger(__name__)

_versions = itertools.count(1)


def new_version() -> int:
    """A fresh ``PodInfo.version`` for a copy whose derived fields were changed."""
    return next(_versions)

PodKey = tuple[str, str]
DeviceKey = tuple[str, int]


def timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str | None
    phase: str
    deleting: bool
    created: float
    started: float | None
    annotations: dict[str, str]
    labels: dict[str, str]
    spec_priority_class: str | None
    request: ResourceRequest | None = None
    error: str | None = None
    placement: Placement | None = None
    placement_error: str | None = None
    scheduled_message: str | None = None
    """Message of an existing PodScheduled=False condition (so we do not write it again)."""
    reservation: DeviceKey | None = None
    gpu_uuid: str | None = None
    group: str | None = None
    """The PodGroup it belongs to (annotation or label ``tessera.io/pod-group``)."""
    sched: SchedulingSpec | None = None
    """What it states about its node beyond GPU/CPU/memory (None: nothing)."""
    sched_error: str | None = None
    topology: TopologyRequest | None = None
    """tessera.io/topology-required|preferred (or KAI's spelling) on the pod."""
    owner: str | None = None
    """Kind of its controller (ownerReferences with controller: true), e.g. ReplicaSet."""
    claim_names: tuple[str, ...] = ()
    """ResourceClaims it names (spec.resourceClaims[].resourceClaimName; docs/dra.md)."""
    mig_profile: str | None = None
    """The MIG profile it asks for (``tessera.io/gpu-mig-profile``, canonical)."""
    mig_hold: MigHold | None = None
    """The partition it was given at bind (``tessera.io/mig-partition``)."""
    mig_claim: bool = False
    """``mig_profile`` is its ResourceClaim's (class mig.tessera.io; the claims hook derives it
    each cycle, tessera.kube.hooks.claims), not its annotation's: its partition is the claim's allocation."""
    mig_served: bool = False
    """A share served by a MIG partition (docs/mig.md): pending, ``mig_profile`` is the profile
    the scheduler serves it with this cycle; bound, its ``tessera.io/mig-partition`` names it
    and its request counts as that profile's fraction."""
    version: int = field(default_factory=lambda: next(_versions))
    """Changes with every event, so cached derivations know when to recompute: a number drawn
    once per object from one counter, never reused (unlike ``id()``, which a new object may
    inherit from a collected one)."""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")



def same_for_scheduling(old: PodInfo, new: PodInfo) -> bool:
    """A status-only change (kwok or a kubelet reporting Running, IPs, start time) that no
    decision depends on."""
    return (old.node == new.node and old.deleting == new.deleting
            and old.finished == new.finished and old.annotations == new.annotations
            and old.labels == new.labels and old.scheduled_message == new.scheduled_message
            and old.uid == new.uid and old.request == new.request and old.error == new.error
            and old.sched == new.sched and old.sched_error == new.sched_error
            and old.claim_names == new.claim_names)


@dataclass(frozen=True, slots=True)
class ForeignPod:
    """A pod of another scheduler bound to a node: what it holds there."""

    node: str
    gpus: int
    cpu_milli: int
    memory: int
    namespace: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    sched: SchedulingSpec | None = None


def sched_dict(spec: Any) -> dict[str, Any]:
    """The parts of a lightkube PodSpec the predicates read, in the API's JSON form (only
    what is there: most pods state none of it)."""
    out: dict[str, Any] = {}
    if spec is None:
        return out
    if spec.nodeSelector:
        out["nodeSelector"] = dict(spec.nodeSelector)
    if spec.affinity is not None:
        out["affinity"] = spec.affinity.to_dict()
    if spec.tolerations:
        out["tolerations"] = [t.to_dict() for t in spec.tolerations]
    if spec.topologySpreadConstraints:
        out["topologySpreadConstraints"] = [t.to_dict() for t in spec.topologySpreadConstraints]
    if spec.overhead:
        out["overhead"] = dict(spec.overhead)
    for key, items in (("containers", spec.containers), ("initContainers", spec.initContainers)):
        cs = []
        for c in items or ():
            entry: dict[str, Any] = {"name": c.name}
            if c.ports and any(p.hostPort for p in c.ports):
                entry["ports"] = [p.to_dict() for p in c.ports]
            if c.resources is not None:
                entry["resources"] = {"requests": dict(c.resources.requests or {}),
                                      "limits": dict(c.resources.limits or {})}
            cs.append(entry)
        if cs:
            out[key] = cs
    if spec.volumes:
        claims = [v.to_dict() for v in spec.volumes if v.persistentVolumeClaim is not None]
        if claims:
            out["volumes"] = claims
    return out


def _sched(namespace: str, labels: dict[str, str], spec: Any) -> SchedulingSpec | None:
    return scheduling_spec(namespace, labels, sched_dict(spec))


def foreign_pod(pod: Any) -> ForeignPod | None:
    """None for pods that hold nothing (finished); whatever cannot be read counts as 0."""
    phase = pod.status.phase if pod.status else None
    node = pod.spec.nodeName if pod.spec else None
    if not node or phase in ("Succeeded", "Failed"):
        return None
    containers = _containers(pod.spec.containers)
    try:
        gpus = whole_gpus(containers)
    except InvalidRequest:
        gpus = 0
    try:
        req = pod_request({}, [ContainerResources(c.name, c.requests, {}) for c in containers])
        cpu, mem = req.cpu_milli, req.memory
    except InvalidRequest:
        cpu = mem = 0
    labels = dict(pod.metadata.labels or {})
    try:
        sched = _sched(pod.metadata.namespace or "", labels, pod.spec)
    except (InvalidRequest, ValueError, TypeError, KeyError):
        sched = None
    return ForeignPod(node, gpus, cpu, mem, pod.metadata.namespace or "",
                      tuple(sorted(labels.items())), sched)


def _containers(items: Any) -> list[ContainerResources]:
    out = []
    for c in items or []:
        res = c.resources
        out.append(ContainerResources(
            c.name,
            dict((res.requests if res else None) or {}),
            dict((res.limits if res else None) or {}),
        ))
    return out


def pod_info(pod: Any) -> PodInfo:
    meta = pod.metadata
    spec = pod.spec
    status = pod.status
    annotations = dict(meta.annotations or {})
    labels = dict(meta.labels or {})
    message = None
    for c in (status.conditions if status else None) or []:
        if c.type == "PodScheduled" and c.status == "False":
            message = c.message
    info = PodInfo(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid or "",
        node=spec.nodeName if spec else None,
        phase=(status.phase if status else None) or "Pending",
        deleting=meta.deletionTimestamp is not None,
        created=timestamp(meta.creationTimestamp) or 0.0,
        started=timestamp(status.startTime) if status else None,
        annotations=annotations,
        labels=labels,
        spec_priority_class=spec.priorityClassName if spec else None,
        scheduled_message=message,
        group=annotations.get(names.POD_GROUP) or labels.get(names.POD_GROUP),
        owner=next((r.kind for r in meta.ownerReferences or () if r.controller), None),
    )
    if labels.get(names.RESERVATION_LABEL) == "true":
        try:
            node = info.node or annotations[names.RESERVATION_NODE]
            info.reservation = (node, int(labels[names.RESERVATION_DEVICE]))
        except (KeyError, ValueError):
            info.error = "reservation pod without node/device labels"
        info.gpu_uuid = annotations.get(names.GPU_UUID)
        return info
    try:
        info.request = pod_request(
            annotations, _containers(spec.containers), _containers(spec.initContainers)
        )
        info.mig_profile = mig_profile(annotations)
    except InvalidRequest as exc:
        info.error = str(exc)
    raw_hold = annotations.get(names.MIG_PARTITION)
    if raw_hold and info.node:
        try:
            info.mig_hold = hold_from_json(raw_hold)
            if info.mig_profile is None and info.request is not None \
                    and info.request.gpu.shared:  # a share a partition serves
                info.mig_served = True
                info.request = replace(info.request, gpu=GpuRequest.none(),
                                       gpus=profile_fraction(info.mig_hold.profile))
        except (ValueError, KeyError, TypeError):
            log.warning("pod %s/%s: %s is not readable", info.namespace, info.name,
                        names.MIG_PARTITION)
    made = {c.name: c.resourceClaimName for c in
            (status.resourceClaimStatuses if status else None) or [] if c.resourceClaimName}
    for i, rc in enumerate((spec.resourceClaims if spec else None) or []):
        if rc.resourceClaimName:
            info.claim_names += (rc.resourceClaimName,)
        elif rc.name in made:  # from a template, by kube-controller-manager's claim controller
            info.claim_names += (made[rc.name],)
        elif info.error is None:
            info.error = (f"spec.resourceClaims[{i}].resourceClaimTemplateName: waiting for the "
                          f"ResourceClaim of template {rc.resourceClaimTemplateName} "
                          "(kube-controller-manager's resourceclaim controller makes it and "
                          "records it in status.resourceClaimStatuses)")
            info.request = None
    try:
        info.sched = _sched(info.namespace, labels, spec)
        info.topology = topology_request(annotations)
    except (InvalidRequest, ValueError, TypeError, KeyError) as exc:
        info.sched_error = str(exc)
    raw = annotations.get(names.PLACEMENT)
    if raw and info.node:
        try:
            info.placement = placement_from_json(raw)
            if info.placement.node != info.node:
                info.placement_error = f"{names.PLACEMENT} names node {info.placement.node}, pod is on {info.node}"
                info.placement = None
        except (ValueError, KeyError, TypeError) as exc:
            info.placement_error = f"{names.PLACEMENT} is not readable: {exc}"
    elif info.node and info.request is not None and info.request.gpu.devices == 0:
        info.placement = Placement(info.node, cpu_milli=info.request.cpu_milli,
                                   memory=info.request.memory)
    elif info.node:
        info.placement_error = f"bound to {info.node} without {names.PLACEMENT}"
    return info


def priority_class_of(pod: PodInfo, group_class: str | None) -> str:
    for candidate in (group_class, pod.annotations.get(names.PRIORITY_CLASS), pod.spec_priority_class):
        if candidate:
            return candidate
    return "train"


def known_priority_class(name: str) -> bool:
    return name in PRIORITY_CLASSES


@dataclass(slots=True)
class NodeInfo:
    name: str
    node: Node | None
    error: str | None = None
    uuids: tuple[str, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    agent_ready: bool = True
    """tessera-node reported this node ready for GPU shares (always True for a node without
    GPUs, which needs no agent)."""
    agent_reason: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    resources: tuple[tuple[str, int], ...] = ()
    """Allocatable resources the core does not account (milli-units)."""
    mig: tuple[NodeMigGpu, ...] = ()
    """Its GPUs in MIG mode and their partitions (tessera-node's inventory; docs/mig.md)."""


def _model_of(product: str) -> str:
    return model_of_product(product)


def _headroom(text: str, count: int, default: int) -> list[int]:
    """Per-device headroom from tessera-node's annotation; the model's default where it is
    absent or not one whole number of bytes per device."""
    parts = [p.strip() for p in text.split(",")] if text else []
    if len(parts) != count or not all(p.isascii() and p.isdigit() for p in parts):
        return [default] * count
    return [int(p) for p in parts]


def _nvlink(text: str, count: int) -> tuple[int, ...] | None:
    """NVLink islands from tessera-node's inventory annotation; None (no preference) where it is
    absent, malformed or names another number of GPUs: a bad annotation must not stop placement."""
    if not text or count < 2:
        return None
    try:
        inventory = json.loads(text)
        gpus, links = inventory["gpus"], inventory["links"]
        if not isinstance(gpus, list) or len(gpus) != count or not isinstance(links, list):
            return None
        pairs = [(link["a"], link["b"]) for link in links
                 if isinstance(link, dict) and link.get("nvlink") is True
                 and type(link.get("a")) is int and type(link.get("b")) is int]
    except (ValueError, KeyError, TypeError):
        return None
    return nvlink.islands(count, pairs)


def node_info(obj: Any) -> NodeInfo:
    meta = obj.metadata
    name = meta.name
    labels = dict(meta.labels or {})
    annotations = dict(meta.annotations or {})
    alloc = dict((obj.status.allocatable if obj.status else None) or {})
    uuids = tuple(u for u in annotations.get(names.NODE_GPU_UUIDS, "").split(",") if u)
    unschedulable = bool(obj.spec and obj.spec.unschedulable)
    conditions = (obj.status.conditions if obj.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = taints_of([t.to_dict() for t in (obj.spec.taints if obj.spec else None) or ()])
    others = resources_of(alloc)
    try:
        count = int(str(alloc.get(names.GPU_RESOURCE, "0")))
        gpus: tuple[GpuDevice, ...] = ()
        if count:
            mem_label = labels.get("nvidia.com/gpu.memory")
            if not mem_label or not (mem_label.isascii() and mem_label.isdigit()):
                return NodeInfo(name, None, "label nvidia.com/gpu.memory (MiB per GPU) is missing",
                                uuids, unschedulable, ready)
            product = labels.get("nvidia.com/gpu.product", "")
            model = _model_of(product)
            dev_memory = int(mem_label) * MiB
            room = _headroom(annotations.get(names.NODE_GPU_HEADROOM, ""), count,
                             default_headroom(model, dev_memory))
            gpus = tuple(
                GpuDevice(uuid=uuids[i] if i < len(uuids) else f"{name}/gpu{i}", index=i,
                          memory=dev_memory, model=model, product=product, headroom=room[i])
                for i in range(count)
            )
        cpu = parse_cpu_milli(alloc.get("cpu", "0"), "node.allocatable.cpu")
        mem_text = str(alloc.get("memory", "0"))
        memory = 0 if mem_text == "0" else parse_memory(mem_text, "node.allocatable.memory")
        islands = _nvlink(annotations.get(names.NODE_GPU_INVENTORY, ""), len(gpus))
        info = NodeInfo(name, Node(name, gpus, cpu, memory, labels, nvlink=islands), None, uuids,
                        unschedulable,
                        ready, labels=labels, taints=taints, resources=others,
                        mig=mig_gpus(annotations.get(names.NODE_GPU_INVENTORY, "")))
        if gpus or info.mig:
            info.agent_ready = annotations.get(names.NODE_READY) == "true"
            info.agent_reason = "" if info.agent_ready else (
                annotations.get(names.NODE_READY_REASON)
                or "no tessera-node has reported on this node")
        return info
    except (InvalidRequest, ValueError) as exc:
        return NodeInfo(name, None, str(exc), uuids, unschedulable, ready)


def _quota(d: Any, field: str) -> Quota:
    if not isinstance(d, dict):
        raise InvalidRequest(field, "must be an object with deserved, limit, overQuotaWeight")
    limit = d.get("limit")
    return Quota(
        deserved=float(d.get("deserved", 0)),
        limit=None if limit is None else float(limit),
        over_quota_weight=float(d.get("overQuotaWeight", 1)),
    )


@dataclass(slots=True)
class ProjectInfo:
    name: str
    project: Project | None
    namespace: str | None
    error: str | None = None
    status: dict[str, Any] = field(default_factory=dict)
    version: int = field(default_factory=lambda: next(_versions))
    """A new number for every object read from the API (see ``PodInfo.version``)."""


def project_info(obj: Any) -> ProjectInfo:
    name = obj.metadata.name
    spec = obj.get("spec") or {}
    res = spec.get("resources") or {}
    try:
        cpu = res.get("cpu")
        mem = res.get("memory")
        cpu_q = None if cpu is None else _quota(cpu, f"projects.{name}.cpu")
        if cpu_q is not None:
            cpu_q = Quota(
                deserved=cpu_q.deserved if cpu_q.deserved == -1 else cpu_q.deserved * 1000,
                limit=None if cpu_q.limit is None else cpu_q.limit * 1000,
                over_quota_weight=cpu_q.over_quota_weight,
            )
        project = Project(
            name=name,
            gpu=_quota(res.get("gpu", {"deserved": 0}), f"projects.{name}.gpu"),
            cpu=cpu_q,
            memory=None if mem is None else _quota(mem, f"projects.{name}.memory"),
            priority=int(spec.get("priority", 100)),
            parent=spec.get("parent") or None,
            reclaim_min_runtime=spec.get("reclaimMinRuntimeSeconds"),
            preempt_min_runtime=spec.get("preemptMinRuntimeSeconds"),
            usage_window=spec.get("usageWindowSeconds"), usage_half_life=spec.get("usageHalfLifeSeconds"),
        )
        return ProjectInfo(name, project, spec.get("namespace"), None, dict(obj.get("status") or {}))
    except (InvalidRequest, ValueError, TypeError) as exc:
        return ProjectInfo(name, None, spec.get("namespace"), str(exc))


@dataclass(slots=True)
class PodGroupInfo:
    namespace: str
    name: str
    min_member: int
    project: str | None
    priority_class: str | None
    version: int = field(default_factory=lambda: next(_versions))
    """A new number for every object read from the API (see ``PodInfo.version``)."""


def pod_group_info(obj: Any) -> PodGroupInfo:
    spec = obj.get("spec") or {}
    return PodGroupInfo(
        obj.metadata.namespace, obj.metadata.name, int(spec.get("minMember", 1)),
        spec.get("project") or None, spec.get("priorityClassName") or None,
    )


def amounts(vector: Any) -> dict[str, float]:
    """A core Vector (GPUs, CPU millicores, bytes) as the CRD's status amounts."""
    gpu, cpu, mem = (float(x) for x in vector)
    out = {"gpu": round(gpu, 4)}
    if math.isfinite(cpu):
        out["cpu"] = round(cpu / 1000, 3)
    if math.isfinite(mem):
        out["memory"] = float(int(mem))
    return out
