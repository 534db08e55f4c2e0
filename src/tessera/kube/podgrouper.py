"""Gangs from owners: which pods of an engine's workload must start together, and how many.

A pod made by a controller names its owner (``metadata.ownerReferences``, ``controller: true``);
that owner may have its own, up to a top owner a user created (a JobSet, a PyTorchJob, a
RayCluster...). :func:`infer` reads that chain, as the API server returns the objects (camelCase
JSON, the engines' own manifest shapes), and says which gang the pod belongs to and the gang's
minimum: the pods that must be placed together or not at all (KAI's pod grouper does the same).

=======================  ==========================================================  =========
top owner                minimum (pods tessera schedules only)                        gang name
=======================  ==========================================================  =========
Job (batch/v1)           ``parallelism`` when all pods run at once (``completions``   job-N
                         unset or ≤ parallelism), less the completions already
                         succeeded; 1 for a sweep (completions > parallelism: trials
                         are independent)
JobSet                   Σ replicatedJobs: replicas × the Job's pods at once;         jobset-N
                         ``startupPolicyOrder: InOrder``: one gang per replicated
                         job (each waits for the previous to be ready)
TrainJob (Trainer v2)    as the JobSet it made                                        trainjob-N
PyTorchJob, TFJob, …     Σ replicaSpecs' replicas; ``elasticPolicy.minReplicas``      pytorchjob-N
(kubeflow.org)           workers (those up to ``maxReplicas`` are elastic);
                         ``runPolicy.schedulingPolicy.minAvailable`` wins
RayCluster               head + Σ workerGroupSpecs ``minReplicas × numOfHosts``;      raycluster-N
                         workers above it, up to ``maxReplicas``, are elastic
RayJob                   as its RayCluster                                            rayjob-N
LeaderWorkerSet          per group (label ``leaderworkerset.sigs.k8s.io/group-index``):  lws-N-I
                         leader + size-1 workers; ``startupPolicy: LeaderReady``: the
                         leader alone (workers are made once it is ready)
Deployment, ReplicaSet,  no gang: each pod on its own                                 —
StatefulSet, DaemonSet,
CronJob's Job as a Job
=======================  ==========================================================  =========

Pods tessera does not schedule (no GPU request, another scheduler; ``ours`` decides from a pod
template) are not counted, so a CPU-only Ray head or JobSet driver never holds a gang back.

The annotation ``tessera.io/gang-min-member: "N"`` on the top owner (or on the pod template)
overrides the minimum, and makes a gang of any top owner, even one tessera does not know. An
owner kind tessera cannot infer, without it, is scheduled per pod, and the caller says so in an
Event (never silently half a gang); so is one whose elastic bounds contradict each other
(``minReplicas`` above ``maxReplicas``, replicas outside them where the engine does not clamp):
its engine would run fewer pods than the minimum, or more than its program accepts.

A member its gang cannot run without (a Ray head; a kubeflow job's Master, Chief or Launcher;
worker 0 of an elastic PyTorchJob with neither a Master nor ``rdzvHost``, the rendezvous host
the operator names) is its gang's *anchor*: the webhook marks it (``tessera.io/gang-anchor``),
the scheduler orders it first among the gang's pods (then oldest first), so it is placed first
and never given back as an elastic pod. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.kube import names

Obj = Mapping[str, Any]

MIN_MEMBER_OVERRIDE = names.GANG_MIN_MEMBER
"""On a top owner or a pod (template): the gang's minimum, overriding what tessera infers."""
MAX_MIN_MEMBER = 100_000
"""The largest minimum accepted (as the PodGroup CRD's ``minMember``)."""

INT32_MAX = 2**31 - 1
"""KubeRay's default ``maxReplicas``."""
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
RAY_NODE_TYPE = "ray.io/node-type"
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
KUBEFLOW_ANCHOR_ROLES = frozenset({"master", "chief", "launcher"})
"""Replica types (the operator's label, lower case) a kubeflow job cannot run without."""
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"

PER_POD_KINDS = frozenset({
    ("apps", "Deployment"), ("apps", "ReplicaSet"), ("apps", "StatefulSet"),
    ("apps", "DaemonSet"), ("batch", "CronJob"), ("", "Pod"),
})
KUBEFLOW_REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs", "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs", "MPIJob": "mpiReplicaSpecs",
}
"""kubeflow.org v1 training operator kinds (and MPIJob v2beta1) -> their replica-spec field."""
GANG_KINDS = frozenset({
    ("batch", "Job"), ("jobset.x-k8s.io", "JobSet"), ("trainer.kubeflow.org", "TrainJob"),
    ("ray.io", "RayCluster"), ("ray.io", "RayJob"), ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
    *(("kubeflow.org", k) for k in KUBEFLOW_REPLICA_SPECS),
})
KNOWN_KINDS = PER_POD_KINDS | GANG_KINDS


def min_member_of(annotations: Mapping[str, str]) -> int | None:
    """A pod's ``tessera.io/gang-min-member`` (what the webhook wrote), or None if absent or
    not a whole number ≥ 1."""
    raw = annotations.get(MIN_MEMBER_OVERRIDE)
    try:
        n = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return n if n >= 1 else None


def inferred_group(namespace: str, name: str, members: Sequence[Any]) -> Any:
    """The PodGroup (``tessera.kube.objects.PodGroupInfo``) of pods that name a group no
    PodGroup object states, from the minimum their owners gave them (the smallest its current
    members carry: a retried member of a Job lowers it to what is left), or None."""
    from tessera.kube.objects import PodGroupInfo

    mins = [m for p in members if (m := min_member_of(p.annotations)) is not None]
    return PodGroupInfo(namespace, name, min(mins), None, None, version=-1) if mins else None


def member_order(pod: Any) -> tuple[bool, float, str]:
    """Sort key of a gang's pods (``tessera.kube.objects.PodInfo``): its anchors first
    (``tessera.io/gang-anchor``), then oldest first, then by name. Placement tries them in this
    order and shrink gives back the last ones (core/cycle/actions/shrink.py), so the elastic pods
    given back are the newest; the core also requires the anchors (``anchors_of``)."""
    return pod.annotations.get(names.GANG_ANCHOR) != "true", pod.created, pod.name


def anchors_of(members: Sequence[Any]) -> tuple[int, ...]:
    """Indexes of a gang's pods (``PodInfo``, in ``member_order``) that the webhook marked
    ``tessera.io/gang-anchor``: the core's ``Workload.anchors``, which the gang may not start
    without (tessera.core.cycle.anchors)."""
    return tuple(i for i, p in enumerate(members) if p.annotations.get(names.GANG_ANCHOR) == "true")


def api_group(obj: Obj) -> str:
    """The API group of an object's (or owner reference's) ``apiVersion`` ("" for core)."""
    version = str(obj.get("apiVersion") or "")
    return version.split("/")[0] if "/" in version else ""


def kind_key(obj: Obj) -> tuple[str, str]:
    return api_group(obj), str(obj.get("kind") or "")


def _meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def _name(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")


def _spec(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, Mapping) else {}


@dataclass(frozen=True)
class Gang:
    """The pod's gang: the ``tessera.io/pod-group`` value and its minimum."""

    name: str
    min_member: int
    why: str
    """What decided it, for Events and ``tessera describe`` ("JobSet trainer: ...")."""
    anchor: bool = False
    """The pod is one its gang cannot run without (module docstring): placed first, never
    given back as an elastic pod."""
    anchors: int = 0
    """How many such pods the gang has (its owner's spec says): ``tessera.io/gang-anchors``."""


@dataclass(frozen=True)
class PerPod:
    """No gang: the pod is scheduled on its own."""

    why: str
    unknown: bool = False
    """True when the caller posts a Warning Event on the top owner: its kind is one tessera
    cannot infer, or its elastic bounds contradict each other (``why`` names the field)."""


class _NotAGang(Exception):
    """An owner whose fields contradict each other: its pods go one by one, and ``why`` (naming
    the field and the rule) is told in an Event."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


Ours = Callable[[Obj], bool]
"""Whether tessera schedules pods made from this pod template (``{metadata, spec}``)."""


def _int(value: Any, default: int, field: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(field, "must be a whole number ≥ 0", value)
    return value


def override(obj: Obj, where: str) -> int | None:
    """The ``tessera.io/gang-min-member`` annotation of ``obj``, checked, or None."""
    ann = _meta(obj).get("annotations") or {}
    raw = ann.get(MIN_MEMBER_OVERRIDE) if isinstance(ann, Mapping) else None
    if raw is None:
        return None
    field = f"{where}.metadata.annotations[{MIN_MEMBER_OVERRIDE}]"
    try:
        n = int(str(raw).strip())
    except ValueError:
        raise InvalidRequest(field, f"must be a whole number from 1 to {MAX_MIN_MEMBER}",
                             raw) from None
    if not 1 <= n <= MAX_MIN_MEMBER:
        raise InvalidRequest(field, f"must be a whole number from 1 to {MAX_MIN_MEMBER}", raw)
    return n


def _job_at_once(job_spec: Obj, field: str) -> tuple[int, bool]:
    """A Job's pods that run at the same time, and whether it is a gang (all run at once)."""
    parallelism = _int(job_spec.get("parallelism"), 1, f"{field}.parallelism")
    completions = job_spec.get("completions")
    if completions is None:
        return parallelism, True
    completions = _int(completions, 1, f"{field}.completions")
    return min(parallelism, completions), completions <= parallelism


def _template_of_job(job_spec: Obj) -> Obj:
    t = job_spec.get("template")
    return t if isinstance(t, Mapping) else {}


def _job(job: Obj, ours: Ours) -> tuple[int, str]:
    spec = _spec(job)
    name = _name(job)
    if not ours(_template_of_job(spec)):
        return 0, f"Job {name}: its pods are not tessera's"
    at_once, gang = _job_at_once(spec, "spec")
    if not gang:
        return 1, (f"Job {name}: a sweep (completions {spec.get('completions')} > parallelism "
                   f"{spec.get('parallelism', 1)}): each trial on its own")
    status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    succeeded = _int(status.get("succeeded"), 0, "status.succeeded")
    completions = spec.get("completions")
    if completions is not None and succeeded:
        at_once = max(1, min(at_once, int(completions) - succeeded))
    return at_once, f"Job {name}: {at_once} pods start together (parallelism)"


def _jobset(jobset: Obj, ours: Ours, replicated: str | None) -> tuple[int, str, str | None]:
    """(minimum, why, the replicated job the gang is limited to or None)."""
    spec = _spec(jobset)
    name = _name(jobset)
    order = ((spec.get("startupPolicy") or {}).get("startupPolicyOrder") or "AnyOrder")
    in_order = order == "InOrder"
    total = 0
    parts = []
    for i, rj in enumerate(spec.get("replicatedJobs") or []):
        if not isinstance(rj, Mapping):
            continue
        if in_order and rj.get("name") != replicated:
            continue
        field = f"spec.replicatedJobs[{i}]"
        replicas = _int(rj.get("replicas"), 1, f"{field}.replicas")
        job_spec = _spec(rj.get("template") or {})
        if not ours(_template_of_job(job_spec)):
            continue
        at_once, _ = _job_at_once(job_spec, f"{field}.template.spec")
        total += replicas * at_once
        parts.append(f"{rj.get('name')} {replicas}×{at_once}")
    scope = f" (startupPolicyOrder InOrder: replicated job {replicated})" if in_order else ""
    return total, f"JobSet {name}{scope}: {' + '.join(parts) or 'none'} pods start together", \
        replicated if in_order else None


def _elastic_bounds(spec: Obj, workers: int, field: str) -> tuple[int, int]:
    """A kubeflow job's ``elasticPolicy`` (min, max), defaulted as the v1 operator does (one
    missing: the other; both: the Worker replicas), checked against each other and the Worker
    replicas (the operator does not clamp them; torchrun's ``--nnodes=min:max`` accepts no
    more and waits for at least min)."""
    policy = spec.get("elasticPolicy") or {}
    low = policy.get("minReplicas")
    high = policy.get("maxReplicas")
    low = _int(low if low is not None else high, workers, "spec.elasticPolicy.minReplicas")
    high = _int(high if high is not None else low, workers, "spec.elasticPolicy.maxReplicas")
    if low > high:
        raise _NotAGang(f"spec.elasticPolicy.minReplicas {low} is above "
                        f"spec.elasticPolicy.maxReplicas {high}")
    if not low <= workers <= high:
        raise _NotAGang(f"{field} {workers} is outside spec.elasticPolicy "
                        f"[minReplicas {low}, maxReplicas {high}]")
    return low, high


def _anchor(decider: Obj, labels: Obj) -> bool:
    """Whether the pod is one its gang cannot run without (module docstring)."""
    group = api_group(decider)
    if group == "ray.io":
        return labels.get(RAY_NODE_TYPE) == "head"
    if group != "kubeflow.org":
        return False
    spec = _spec(decider)
    specs = spec.get(KUBEFLOW_REPLICA_SPECS.get(str(decider.get("kind")), "")) or {}
    policy = spec.get("elasticPolicy")
    role = str(labels.get(KUBEFLOW_REPLICA_TYPE) or "").lower()
    return role in KUBEFLOW_ANCHOR_ROLES or (
        isinstance(policy, Mapping) and not policy.get("rdzvHost") and role == "worker"
        and str(labels.get(KUBEFLOW_REPLICA_INDEX)) == "0"
        and not any(str(r).lower() in KUBEFLOW_ANCHOR_ROLES for r in specs))


def _kubeflow(job: Obj, ours: Ours) -> tuple[int, str]:
    spec = _spec(job)
    kind = str(job.get("kind"))
    field = KUBEFLOW_REPLICA_SPECS[kind]
    specs = spec.get(field) or {}
    elastic = isinstance(spec.get("elasticPolicy"), Mapping)
    explicit = ((spec.get("runPolicy") or {}).get("schedulingPolicy") or {}).get("minAvailable")
    if explicit is not None:
        n = _int(explicit, 1, "spec.runPolicy.schedulingPolicy.minAvailable")
        return n, f"{kind} {_name(job)}: {n} pods start together (schedulingPolicy.minAvailable)"
    total = 0
    parts = []
    for role, rs in sorted(specs.items()):
        if not isinstance(rs, Mapping) or not ours(rs.get("template") or {}):
            continue
        where = f"spec.{field}.{role}.replicas"
        replicas = _int(rs.get("replicas"), 1, where)
        if role == "Worker" and elastic:
            low, high = _elastic_bounds(spec, replicas, where)
            parts.append(f"{role} {low} (elastic up to {high})")
            total += low
            continue
        total += replicas
        parts.append(f"{role} {replicas}")
    return total, f"{kind} {_name(job)}: {' + '.join(parts) or 'none'} pods start together"


def _raycluster(rc: Obj, ours: Ours) -> tuple[int, str]:
    spec = _spec(rc)
    head = spec.get("headGroupSpec") or {}
    total = 1 if ours(head.get("template") or {}) else 0
    parts = ["head 1"] if total else []
    for i, wg in enumerate(spec.get("workerGroupSpecs") or []):
        if not isinstance(wg, Mapping) or not ours(wg.get("template") or {}):
            continue
        field = f"spec.workerGroupSpecs[{i}]"
        low = _int(wg.get("minReplicas"), 0, f"{field}.minReplicas")
        high = _int(wg.get("maxReplicas"), INT32_MAX, f"{field}.maxReplicas")
        if low > high:
            # KubeRay then runs maxReplicas workers ("Please fix this"): fewer than the minimum.
            raise _NotAGang(f"{field}.minReplicas {low} is above {field}.maxReplicas {high} "
                            "(KubeRay then runs maxReplicas workers)")
        hosts = _int(wg.get("numOfHosts"), 1, f"{field}.numOfHosts")
        total += low * hosts
        parts.append(f"{wg.get('groupName', i)} {low * hosts}")
    return total, (f"RayCluster {_name(rc)}: {' + '.join(parts) or 'none'} pods start together "
                   "(workers above minReplicas, up to maxReplicas, are elastic)")


def _lws(lws: Obj, ours: Ours) -> tuple[int, str]:
    spec = _spec(lws)
    lwt = spec.get("leaderWorkerTemplate") or {}
    size = _int(lwt.get("size"), 1, "spec.leaderWorkerTemplate.size")
    worker = lwt.get("workerTemplate") or {}
    leader = lwt.get("leaderTemplate") or worker
    lead = 1 if ours(leader) else 0
    workers = max(0, size - 1) if ours(worker) else 0
    if spec.get("startupPolicy") == "LeaderReady" and lead:
        return 1, (f"LeaderWorkerSet {_name(lws)}: the leader first (startupPolicy LeaderReady; "
                   f"its {workers} workers join once it is ready)")
    return lead + workers, f"LeaderWorkerSet {_name(lws)}: leader + {workers} workers per group"


def infer(pod: Obj, chain: Sequence[Obj], ours: Ours) -> Gang | PerPod:
    """The gang of ``pod`` whose controllers are ``chain`` (its own controller first, the top
    owner last; an owner tessera could not read may be its owner reference alone). Raises
    InvalidRequest naming the field of a bad override or manifest."""
    if not chain:
        return PerPod("no controller")
    top = chain[-1]
    tkind, tname = str(top.get("kind")), _name(top)
    forced = override(top, f"{tkind} {tname}") or override(pod, "pod")
    unknown = next((o for o in chain if kind_key(o) not in KNOWN_KINDS), None)
    decider = next((o for o in reversed(chain) if kind_key(o) in GANG_KINDS), None)
    if unknown is not None or decider is None:
        if forced is not None:
            return Gang(f"{tkind.lower()}-{tname}", forced,
                        f"{tkind} {tname}: {forced} pods start together ({MIN_MEMBER_OVERRIDE})")
        if unknown is not None:
            return PerPod(f"owner kind {unknown.get('kind')} ({unknown.get('apiVersion')}) is not "
                          f"one tessera infers gangs for: its pods are scheduled one by one; "
                          f"set {MIN_MEMBER_OVERRIDE} on {tkind} {tname} to make a gang",
                          unknown=True)
        return PerPod(f"{tkind} {tname}: each pod on its own")
    anchor = _anchor(decider, _meta(pod).get("labels") or {})
    try:
        found = _infer_gang(pod, chain, ours, decider, forced, anchor)
    except _NotAGang as bad:
        if forced is None:
            return PerPod(f"{tkind} {tname}: {bad.why}: its pods are scheduled one by one",
                          unknown=True)
        # the user's minimum wins over the engine's own bounds
        found = Gang(f"{str(decider.get('kind')).lower()}-{_name(decider)}", forced,
                     f"{tkind} {tname}: {forced} pods start together "
                     f"({MIN_MEMBER_OVERRIDE}; {bad.why})", anchor)
    count = _anchor_count(decider, chain, ours) if isinstance(found, Gang) else 0
    return dataclasses.replace(found, anchors=count) if count and isinstance(found, Gang) else found


def _anchor_count(decider: Obj, chain: Sequence[Obj], ours: Ours) -> int:
    """How many pods of the gang ``_anchor`` marks, from the owner's spec (those tessera
    schedules): a Ray head; a kubeflow job's Master/Chief/Launcher replicas, else worker 0 of
    an elastic one without ``rdzvHost``."""
    group = api_group(decider)
    if group == "ray.io":
        rc = next((o for o in chain if kind_key(o) == ("ray.io", "RayCluster")), {})
        return 1 if ours((_spec(rc).get("headGroupSpec") or {}).get("template") or {}) else 0
    if group != "kubeflow.org":
        return 0
    spec = _spec(decider)
    field = KUBEFLOW_REPLICA_SPECS.get(str(decider.get("kind")), "")
    specs = spec.get(field) or {}
    roles = {str(r).lower(): rs for r, rs in specs.items() if isinstance(rs, Mapping)}
    count = sum(_int(rs.get("replicas"), 1, f"spec.{field}.{r}.replicas") for r, rs in specs.items()
                if isinstance(rs, Mapping) and str(r).lower() in KUBEFLOW_ANCHOR_ROLES
                and ours(rs.get("template") or {}))
    if any(r in KUBEFLOW_ANCHOR_ROLES for r in roles):
        return count
    policy = spec.get("elasticPolicy")
    worker = roles.get("worker")
    return int(isinstance(policy, Mapping) and not policy.get("rdzvHost") and worker is not None
               and ours(worker.get("template") or {}))


def anchor_pods_missing(gang: str, members: Sequence[Any], present: int) -> str | None:
    """Why a gang (``PodInfo`` members, ``present`` of them anchors) waits for an anchor pod
    that does not exist yet (``tessera.io/gang-anchors`` above ``present``), or None."""
    expected = max((_count(p.annotations.get(names.GANG_ANCHORS)) for p in members), default=0)
    if present >= expected:
        return None
    return (f"gang {gang} waits for its anchor pod(s) to exist: {expected} expected "
            f"({names.GANG_ANCHORS}), {present} exist ({names.GANG_ANCHOR})")


def _count(raw: str | None) -> int:
    try:
        return max(0, int(raw)) if raw is not None else 0
    except ValueError:
        return 0


def _infer_gang(pod: Obj, chain: Sequence[Obj], ours: Ours, decider: Obj,
                forced: int | None, anchor: bool) -> Gang | PerPod:
    key = kind_key(decider)
    labels = _meta(pod).get("labels") or {}
    name = f"{str(decider.get('kind')).lower()}-{_name(decider)}"
    if key == ("batch", "Job"):
        n, why = _job(decider, ours)
    elif key == ("jobset.x-k8s.io", "JobSet"):
        job = next((o for o in chain if kind_key(o) == ("batch", "Job")), {})
        rjob = labels.get(JOBSET_REPLICATED_JOB) or \
            (_meta(job).get("labels") or {}).get(JOBSET_REPLICATED_JOB)
        n, why, scope = _jobset(decider, ours, rjob)
        if scope is not None:
            name = f"{name}-{scope}"
    elif key == ("trainer.kubeflow.org", "TrainJob"):
        js = next((o for o in chain if kind_key(o) == ("jobset.x-k8s.io", "JobSet")), None)
        if js is None:
            return PerPod(f"TrainJob {_name(decider)}: its JobSet could not be read", unknown=True)
        n, why, scope = _jobset(js, ours, labels.get(JOBSET_REPLICATED_JOB))
        why = f"TrainJob {_name(decider)} through {why}"
        if scope is not None:
            name = f"{name}-{scope}"
    elif key[0] == "kubeflow.org":
        n, why = _kubeflow(decider, ours)
    elif key == ("ray.io", "RayCluster"):
        n, why = _raycluster(decider, ours)
    elif key == ("ray.io", "RayJob"):
        rc = next((o for o in chain if kind_key(o) == ("ray.io", "RayCluster")), None)
        if rc is None:
            return PerPod(f"RayJob {_name(decider)}: not a pod of its RayCluster")
        n, why = _raycluster(rc, ours)
        why = f"RayJob {_name(decider)} through {why}"
    else:  # LeaderWorkerSet
        index = labels.get(LWS_GROUP_INDEX)
        if index is None:
            raise InvalidRequest(f"metadata.labels[{LWS_GROUP_INDEX}]",
                                 "is set by the LeaderWorkerSet controller on each pod", None)
        name = f"lws-{_name(decider)}-{index}"
        n, why = _lws(decider, ours)
    if forced is not None:
        return Gang(name, forced, f"{why.split(':')[0]}: {forced} pods start together "
                                  f"({MIN_MEMBER_OVERRIDE})", anchor)
    if n <= 1:
        return PerPod(why) if n == 0 else Gang(name, 1, why, anchor)
    return Gang(name, min(n, MAX_MIN_MEMBER), why, anchor)
