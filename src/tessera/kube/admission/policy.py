"""The webhook's settings and the rules it enforces on every GPU pod, as pure functions.

Both webhooks call :func:`check_final` on the pod as it will be stored, so the mutating webhook
never lets through a pod the validating one would refuse; spelling errors are refused by the
mutating webhook (:mod:`.spellings`), before anything is translated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera import wire
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest, Node
from tessera.core.podgroups import DEFAULT_REGION_GROUP
from tessera.core.requests import check_against_cluster
from tessera.kube import names
from tessera.kube.admission import spellings as sp
from tessera.kube.admission.claims import uses_claims
from tessera.kube.admission.mig_resources import MigOffer
from tessera.kube.binder import configmap_name
from tessera.kube.podspec import containers_of, gpu_request, mig_fraction, mig_profile
from tessera.kube.predicates.topology import topology_request

VISIBLE_DEVICES = wire.VISIBLE_DEVICES_KEY
NO_DEVICES = ("void", "none")
LIMIT_ENV = wire.MEMORY_LIMIT_KEY
REGION_ENV = "TESSERA_GPU_SHARED_REGION"
CONFIG_ENV = "TESSERA_GPU_CONFIG"
CONFIGMAP_KEYS = (VISIBLE_DEVICES, LIMIT_ENV)
"""Keys of the per-pod ConfigMap (written by the scheduler) that a share container reads; a
memory request's limit is known at admission and is given as a value instead (static_limit)."""
RESERVED_ENV_PREFIX = "TESSERA_GPU_"
RESERVED_PREFIXES = (RESERVED_ENV_PREFIX, "TESSERA_ISOLATION_")
"""Variables the isolation library reads (limits, config path, region, test faults)."""
RESERVED_NAMES = (VISIBLE_DEVICES,)


def device_plugin_gpus(container: Mapping[str, Any]) -> bool:
    """Whether the device plugin gives this container its GPUs: whole ``nvidia.com/gpu`` or a
    GPU operator MIG resource (``nvidia.com/mig-3g.20gb``); it is not given NVIDIA_VISIBLE_DEVICES
    =void then."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return any(k == names.GPU_RESOURCE or str(k).startswith(names.MIG_RESOURCE_PREFIX)
               for k in limits)


def reserved(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)


def prefix_is_safe(prefix: str) -> bool:
    """Whether every variable ``envFrom`` with this prefix can produce is outside tessera's
    reserved names: ``APP_`` is, none or ``TESSERA_`` or ``N`` is not."""
    if not prefix:
        return False
    return not any(r.startswith(prefix) or prefix.startswith(r)
                   for r in (*RESERVED_PREFIXES, *RESERVED_NAMES))


def check_env_from(path: str, container: Mapping[str, Any]) -> None:
    """``envFrom`` may not set tessera's isolation variables in a container with a GPU share.

    The webhook cannot know what a ConfigMap or Secret will hold when the container starts
    (it can be edited after the pod is admitted), so reading it now would prove nothing: an
    ``envFrom`` entry is accepted only when its ``prefix`` makes a reserved name impossible."""
    for i, source in enumerate(container.get("envFrom") or []):
        if not isinstance(source, Mapping):
            raise refuse(f"{path}.envFrom[{i}]", "must be an object")
        prefix = str(source.get("prefix") or "")
        if prefix_is_safe(prefix):
            continue
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        kind = "ConfigMap" if source.get("configMapRef") else "Secret"
        raise refuse(
            f"{path}.envFrom[{i}]",
            f"could set tessera's GPU isolation variables (NVIDIA_VISIBLE_DEVICES, "
            f"TESSERA_GPU_*, TESSERA_ISOLATION_*) from {kind} {ref.get('name', '?')} in a "
            "container with a GPU share: give it a prefix such as APP_ (prefix: APP_), or list "
            "the variables under env",
            prefix or None)

PLACEMENT_ANNOTATIONS = (names.PLACEMENT, names.CONFIGMAP, names.GPU_UUID, names.GPU_CONFIG_KEY,
                         names.MIG_PARTITION)
"""Written only by tessera (the scheduler; the config key by this webhook)."""
REQUEST_ANNOTATIONS = (
    *sp.CANONICAL_ANNOTATIONS, *sp.RUNAI_ANNOTATIONS, names.GPU_MODEL, names.PROJECT,
    names.MIG_PROFILE,
)
PROTECTED_LABELS = (sp.ALIYUN_GPU_COUNT,)

# Volumes the webhook adds to a share pod.
LIBRARY_VOLUME = "tessera-isolation"
PRELOAD_VOLUME = "tessera-ld-so-preload"
CONFIG_VOLUME = "tessera-gpu-config"
REGION_VOLUME = "tessera-gpu-region"
PRELOAD_PATH = "/etc/ld.so.preload"
REGION_DIR = "/run/tessera"
LOANS_VOLUME = "tessera-gpu-loans"
LOANS_DIR = "/run/tessera-loans"
"""The node's loans ledger directory (one file per GPU, written by every share's processes and
read by tessera-node's reclaimer): dynamic fractions borrow only what nobody is guaranteed."""
CONFIG_DIR = "/etc/tessera"
"""The container's isolation config (``gpu-isolation.conf``, written by tessera-node on the host
under ``containers_host_dir/KEY/conf/CONTAINER``), mounted read-only over the image's
/etc/tessera; the library reads it first, so the limits are bound to the container, not to its
environment."""

REPLACEABLE_SCHEDULERS = frozenset({"", "default-scheduler", "runai-scheduler", "kai-scheduler"})


@dataclass(frozen=True)
class WebhookConfig:
    scheduler_name: str = names.SCHEDULER_NAME
    scheduler_user: str = (
        f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.COMPONENT}"
    )
    """The scheduler's identity: the only user that may change tessera's annotations."""
    node_user: str = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:tessera-node-agent"
    """tessera-node's identity: it may only write a made MIG partition's ``MIG-…`` UUID into a
    MIG pod's ConfigMap (``check_configmap``)."""
    library_host_dir: str = "/var/lib/tessera/isolation"
    """hostPath the node agent fills with the isolation library (``libtessera-cuda.so``)."""
    library_mount: str = "/usr/local/tessera"
    preload_host_file: str = "/var/lib/tessera/isolation/ld.so.preload"
    """hostPath file (written by the node agent) naming the library; mounted over
    /etc/ld.so.preload."""
    loans_host_dir: str = "/var/lib/tessera/loans"
    """hostPath of the node's loans ledger directory (tessera-node --loans-dir)."""
    containers_host_dir: str = "/var/lib/tessera/containers"
    """hostPath directory where the node agent writes each share container's isolation config
    (``KEY/conf/CONTAINER``) and the pod's accounting region (``KEY/region``)."""
    default_project: str | None = None
    """Project for pods in a namespace no Project owns; None refuses them."""
    replaceable_schedulers: frozenset[str] = REPLACEABLE_SCHEDULERS
    compute_mode: str = "off"
    """Cluster default compute-share mode (off, fair, strict; docs/compute-share.md)."""
    operator_mig: str = "auto"
    """The GPU operator's ``nvidia.com/mig-…`` resources: ``auto`` (made by tessera where no
    node advertises that resource but a GPU in MIG mode has the profile), ``dynamic``, ``static``
    (:mod:`tessera.kube.admission.mig_resources`)."""
    rewrite_claims: bool = False
    """Rewrite old-style GPU requests (annotations, cGPU, ``nvidia.com/gpu``) into a
    ResourceClaim from a template the webhook creates (:mod:`tessera.kube.admission.claims`)."""
    region_group: int = DEFAULT_REGION_GROUP
    """Supplemental group added to a share pod that states no group (fsGroup,
    supplementalGroups, runAsGroup): tessera-node gives the pod's region to that group
    (:mod:`tessera.core.podgroups`)."""


@dataclass
class ClusterView:
    """What the webhook knows of the cluster (from its informers)."""

    nodes: Callable[[], Iterable[Node]]
    project_of: Callable[[str], str | None]
    """Namespace -> the Project owning it (Project.spec.namespace)."""
    synced: Callable[[], bool] = field(default=lambda: True)
    mig_offer: Callable[[], MigOffer] = field(default=MigOffer)
    """The GPU operator MIG resources nodes advertise and the profiles tessera could make
    (:mod:`tessera.kube.admission.mig_resources`)."""


def refuse(field_: str, rule: str, value: object = None) -> InvalidRequest:
    return InvalidRequest(field_, rule, value)


def containers_with_refs(pod: Mapping[str, Any]
                         ) -> list[tuple[sp.ContainerRef, Mapping[str, Any]]]:
    return sp.all_containers(pod.get("spec") or {})


def check_topology(pod: Mapping[str, Any]) -> None:
    """A topology annotation names a known level (or, KAI's spelling, a node label key)."""
    topology_request((pod.get("metadata") or {}).get("annotations") or {})


def check_user_fields(pod: Mapping[str, Any]) -> None:
    """Rules on the pod as the user wrote it: tessera's placement annotations, device and
    isolation env are tessera's to write."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {})
    check_topology(pod)
    for key in PLACEMENT_ANNOTATIONS:
        if key in ann:
            raise refuse(sp.annotation_field(key),
                         "is written by tessera only; users cannot pick devices or limits", ann[key])
    for ref, c in containers_with_refs(pod):
        for e in c.get("env") or []:
            name = str(e.get("name", ""))
            where = f"{ref.path}.env[{name}]"
            if name == VISIBLE_DEVICES:
                if e.get("valueFrom") is not None or str(e.get("value", "")) not in NO_DEVICES:
                    raise refuse(where, "may only be void or none: tessera gives GPUs to "
                                 "containers (a GPU share or nvidia.com/gpu limits)",
                                 e.get("value", "valueFrom"))
            elif reserved(name):
                raise refuse(where, "is set by tessera (GPU isolation settings)", e.get("value"))


def check_privileged(pod: Mapping[str, Any]) -> None:
    for ref, c in containers_with_refs(pod):
        if ((c.get("securityContext") or {}).get("privileged")) is True:
            raise refuse(f"{ref.path}.securityContext.privileged",
                         "must not be true in a pod with a GPU share: a privileged container "
                         "sees every GPU and escapes isolation", True)


def check_cluster(request: GpuRequest, view: ClusterView,
                  rename: Callable[[InvalidRequest], InvalidRequest]) -> None:
    try:
        check_against_cluster(request, view.nodes())
    except InvalidRequest as exc:
        raise rename(exc) from None


def project_for(namespace: str, view: ClusterView, config: WebhookConfig) -> str:
    project = view.project_of(namespace) or config.default_project
    if not project:
        raise refuse("metadata.namespace",
                     f"namespace {namespace} belongs to no tessera Project (no Project has "
                     f"spec.namespace: {namespace}); ask an admin to create one", namespace)
    return project


def asks_for_gpu(pod: Mapping[str, Any], config: WebhookConfig) -> bool:
    """Whether tessera handles this pod: any share spelling, a MIG profile
    (``tessera.io/gpu-mig-profile``), or scheduled by tessera."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return bool(sp.detect(pod)) or names.MIG_PROFILE in ann or (pod.get("spec") or {}).get(
        "schedulerName") == config.scheduler_name


def check_mig(pod: Mapping[str, Any]) -> str | None:
    """The canonical MIG profile a pod asks for (``tessera.io/gpu-mig-profile``), checked:
    a known profile (the refusal lists them), and the pod's whole GPU request (no share, whole
    GPUs or GPU operator MIG resources with it). None for other pods."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if names.MIG_PROFILE not in ann:
        return None
    field = sp.annotation_field(names.MIG_PROFILE)
    found = sp.detect(pod)
    if found:
        where = next(iter(found.values()))
        raise refuse(field, f"a MIG profile is the pod's whole GPU request; give it or a share "
                            f"({where}), not both", ann[names.MIG_PROFILE])
    mig_fraction(ann, containers_of(pod.get("spec") or {}))
    return mig_profile(ann)


def mig_container(pod: Mapping[str, Any]) -> sp.ContainerRef:
    """The container given a MIG pod's partition: the one whose ``NVIDIA_VISIBLE_DEVICES``
    the webhook wired to the pod's ConfigMap (the first container, or the one that asked for a
    GPU operator MIG resource); the first container when none is (then refused there)."""
    for ref, c in containers_with_refs(pod):
        for e in c.get("env") or []:
            if e.get("name") == VISIBLE_DEVICES and _env_ref(e):
                return ref
    return sp.pick_container(pod, None, "spec.containers")


def static_limit(request: GpuRequest) -> str | None:
    """Bytes the isolation library enforces, when they do not depend on the device: a memory
    request (its limit, else the request) is the same bytes on any GPU. A portion's bytes depend
    on the GPU's size, so they come from the scheduler's ConfigMap. (The ConfigMap holds one
    value per device, comma-separated, which the library reads only for one device.)"""
    if request.kind is GpuKind.MEMORY:
        return str(request.memory_limit or request.memory)
    return None


def _env_ref(entry: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not entry:
        return None
    return ((entry.get("valueFrom") or {}).get("configMapKeyRef")) or None


def check_final(pod: Mapping[str, Any], namespace: str, view: ClusterView,
                config: WebhookConfig) -> GpuRequest:
    """Invariants of a GPU pod as it will be stored (after mutation). Returns its request."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    check_topology(pod)
    try:
        request = gpu_request(ann, containers_of(spec))
    except InvalidRequest as exc:
        raise refuse(sp.annotation_field(exc.field) if exc.field.startswith("tessera.io/")
                     else exc.field, exc.rule, exc.value) from None
    shared = request.kind in (GpuKind.PORTION, GpuKind.MEMORY)
    mig = check_mig(pod)
    for ref, c in containers_with_refs(pod):
        if sp.ALIYUN_GPU_MEM in ((c.get("resources") or {}).get("limits") or {}):
            raise refuse(f"{ref.path}.resources.limits[{sp.ALIYUN_GPU_MEM}]",
                         "is translated by tessera's mutating webhook and must not reach a node")
    if sp.RUNAI in sp.detect(pod):
        runai = sp.translate_runai(pod)
        for key, value in runai.annotations.items():
            if ann.get(key) != value:
                raise refuse(runai.sources.get(key, sp.annotation_field(key)),
                             f"disagrees with {key}={ann.get(key)!r}: use one spelling per pod")
    if spec.get("schedulerName") != config.scheduler_name:
        raise refuse("spec.schedulerName", f"a GPU pod is scheduled by {config.scheduler_name}",
                     spec.get("schedulerName"))
    project = project_for(namespace, view, config)
    if ann.get(names.PROJECT) != project:
        raise refuse(sp.annotation_field(names.PROJECT),
                     f"is set from the namespace: {namespace} belongs to project {project}",
                     ann.get(names.PROJECT))
    gpu_container = None
    mig_ref = mig_container(pod) if mig is not None else None
    configmap = configmap_name(str(meta.get("name") or ""))
    if shared:
        check_privileged(pod)
        gpu_container = sp.pick_container(pod, ann.get(sp.GPU_CONTAINER),
                                           sp.annotation_field(sp.GPU_CONTAINER))
    for ref, c in containers_with_refs(pod):
        env = {str(e.get("name")): e for e in c.get("env") or []}
        where = f"{ref.path}.env[{VISIBLE_DEVICES}]"
        if ref == gpu_container:
            check_env_from(ref.path, c)
            static = static_limit(request)
            for key in CONFIGMAP_KEYS:
                if key == LIMIT_ENV and static is not None:
                    entry = env.get(key) or {}
                    if entry.get("valueFrom") is not None or entry.get("value") != static:
                        raise refuse(f"{ref.path}.env[{key}]", f"must be {static} (the pod's "
                                     "GPU memory limit in bytes)", entry.get("value"))
                    continue
                got = _env_ref(env.get(key))
                if not got or got.get("name") != configmap or got.get("key") != key \
                        or got.get("optional"):
                    raise refuse(f"{ref.path}.env[{key}]",
                                 f"must come from the pod's ConfigMap {configmap} (key {key})")
            mounts = {m.get("mountPath"): m for m in c.get("volumeMounts") or []}
            preload = mounts.get(PRELOAD_PATH)
            if not preload or preload.get("name") != PRELOAD_VOLUME:
                raise refuse(f"{ref.path}.volumeMounts[{PRELOAD_PATH}]",
                             "must preload tessera's isolation library (no share without isolation)")
            region = f"{REGION_DIR}/gpu-usage.region"
            for name, entry in env.items():
                if name == REGION_ENV and entry.get("value") == region \
                        and entry.get("valueFrom") is None:
                    continue
                if reserved(name) and name not in CONFIGMAP_KEYS:
                    raise refuse(f"{ref.path}.env[{name}]", "is set by tessera only",
                                 entry.get("value"))
            conf = mounts.get(CONFIG_DIR)
            if not conf or conf.get("name") != CONFIG_VOLUME or conf.get("readOnly") is not True:
                raise refuse(f"{ref.path}.volumeMounts[{CONFIG_DIR}]",
                             "must mount the container's isolation config from the node, "
                             "read-only (no share without its limits)")
            continue
        entry = env.get(VISIBLE_DEVICES)
        if mig_ref is not None and ref == mig_ref:
            got = _env_ref(entry)
            if not got or got.get("name") != configmap or got.get("key") != VISIBLE_DEVICES \
                    or got.get("optional"):
                raise refuse(where, f"must come from the pod's ConfigMap {configmap} (key "
                                    f"{VISIBLE_DEVICES}: the MIG partition tessera-node makes)")
            continue
        if (device_plugin_gpus(c) or uses_claims(c)) and entry is None:
            continue
        if entry is None or entry.get("valueFrom") is not None \
                or str(entry.get("value", "")) not in NO_DEVICES:
            raise refuse(where, "must be void or none on a container without a GPU",
                         None if entry is None else entry.get("value", "valueFrom"))
        for name in env:
            if reserved(name) and name != VISIBLE_DEVICES:
                raise refuse(f"{ref.path}.env[{name}]", "is set by tessera only")
    if request.kind is not GpuKind.NONE:
        check_cluster(request, view, lambda e: refuse(
            sp.annotation_field({"gpu_devices": names.GPU_DEVICES,
                                 "gpu_memory": names.GPU_MEMORY,
                                 "gpu_model": names.GPU_MODEL}.get(e.field, e.field)),
            e.rule, e.value))
    return request


def check_update(old: Mapping[str, Any], new: Mapping[str, Any], user: str,
                 config: WebhookConfig) -> None:
    """After creation only the scheduler changes tessera's annotations or a pod's request."""
    if user == config.scheduler_user:
        return
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    old_ann, new_ann = old_meta.get("annotations") or {}, new_meta.get("annotations") or {}
    for key in (*PLACEMENT_ANNOTATIONS, *REQUEST_ANNOTATIONS):
        if old_ann.get(key) != new_ann.get(key):
            raise refuse(sp.annotation_field(key),
                         "cannot be changed after the pod is created (only tessera's scheduler "
                         "writes it)", new_ann.get(key))
    old_labels, new_labels = old_meta.get("labels") or {}, new_meta.get("labels") or {}
    for key in PROTECTED_LABELS:
        if old_labels.get(key) != new_labels.get(key):
            raise refuse(sp.label_field(key), "cannot be changed after the pod is created",
                         new_labels.get(key))


CONFIGMAP_SUFFIX = "-tessera-gpu"


def is_tessera_configmap(obj: Mapping[str, Any] | None) -> bool:
    meta = (obj or {}).get("metadata") or {}
    return str(meta.get("name", "")).endswith(CONFIGMAP_SUFFIX) or (
        (meta.get("labels") or {}).get(names.MANAGED_BY) == "tessera")


MIG_UUID_KEYS = (VISIBLE_DEVICES, wire.MIG_UUID_KEY)


def node_writes_mig_uuid(obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> bool:
    """The one change tessera-node makes to a per-pod ConfigMap: once it has made a MIG pod's
    partition, ``NVIDIA_VISIBLE_DEVICES`` and ``TESSERA_MIG_UUID`` set to its ``MIG-…`` UUID;
    nothing else in the object changed."""
    if not obj or not old:
        return False
    new_data, old_data = dict(obj.get("data") or {}), dict(old.get("data") or {})
    uuid = new_data.get(VISIBLE_DEVICES, "")
    if not uuid.startswith("MIG-") or any(new_data.get(k) != uuid for k in MIG_UUID_KEYS):
        return False
    if wire.MIG_PROFILE_KEY not in old_data:  # only a MIG pod's ConfigMap
        return False
    rest = {k: v for k, v in new_data.items() if k not in MIG_UUID_KEYS}
    if rest != {k: v for k, v in old_data.items() if k not in MIG_UUID_KEYS}:
        return False
    meta, old_meta = obj.get("metadata") or {}, old.get("metadata") or {}
    return all(meta.get(k) == old_meta.get(k) for k in ("labels", "annotations", "ownerReferences")) \
        and obj.get("binaryData") == old.get("binaryData")


def check_configmap(request: Mapping[str, Any], config: WebhookConfig) -> None:
    """A per-pod ConfigMap holds the pod's devices and limits: only the scheduler writes one
    (nobody may create it first, or edit it after), except that tessera-node writes a MIG pod's
    partition UUID into it once the partition is made (:func:`node_writes_mig_uuid`)."""
    user = (request.get("userInfo") or {}).get("username", "")
    if user == config.scheduler_user:
        return
    obj, old = request.get("object"), request.get("oldObject")
    if user == config.node_user and request.get("operation") == "UPDATE" \
            and node_writes_mig_uuid(obj, old):
        return
    if is_tessera_configmap(obj) or is_tessera_configmap(old):
        name = ((obj or old or {}).get("metadata") or {}).get("name")
        raise refuse("metadata.name", f"ConfigMap {name} (a GPU pod's devices and limits) is "
                     "written by tessera's scheduler only", name)


def check_ephemeral(pod: Mapping[str, Any]) -> None:
    """Ephemeral (debug) containers of a GPU pod get no GPU and no isolation settings."""
    for c in (pod.get("spec") or {}).get("ephemeralContainers") or []:
        path = f"spec.ephemeralContainers[{c.get('name')}]"
        if ((c.get("securityContext") or {}).get("privileged")) is True:
            raise refuse(f"{path}.securityContext.privileged",
                         "must not be true in a GPU pod (it would see every GPU)", True)
        env = {str(e.get("name")): e for e in c.get("env") or []}
        entry = env.get(VISIBLE_DEVICES)
        if entry is None or entry.get("valueFrom") is not None \
                or str(entry.get("value", "")) not in NO_DEVICES:
            raise refuse(f"{path}.env[{VISIBLE_DEVICES}]", "must be void or none: a debug "
                         "container gets no GPU", None if entry is None else entry.get("value"))
        for name in env:
            if reserved(name) and name != VISIBLE_DEVICES:
                raise refuse(f"{path}.env[{name}]", "is set by tessera only")
        check_env_from(path, c)
