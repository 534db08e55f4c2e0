"""The GPU-share spellings a pod may use, translated to tessera's canonical annotations.

Three spellings are accepted, one per pod:

- tessera's own ``tessera.io/gpu-*`` annotations (canonical, :mod:`tessera.kube.podspec`);
- Run:ai / KAI annotations ``gpu-fraction``, ``gpu-memory`` (MiB), ``gpu-fraction-num-devices``,
  ``gpu-fraction-container-name``, ``gpu-fraction-limit``, ``gpu-memory-limit`` (MiB) and the
  env ``RUNAI_GPU_MEMORY_LIMIT`` on the GPU container;
- Alibaba cGPU: ``aliyun.com/gpu-mem`` (GiB, in one container's resources) over the pod label
  ``aliyun.com/gpu-count`` GPUs of one node.

Every value goes through :mod:`tessera.core.units` / :mod:`tessera.core.requests`, and the
result through the scheduler's own parser (:func:`tessera.kube.podspec.gpu_request`), so the
webhook and the scheduler cannot disagree. Errors name the field the user wrote, as a path in
the pod (``metadata.annotations[gpu-fraction]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.requests import cgpu_request
from tessera.core.units import GiB, MiB, parse_memory, parse_portion, parse_runai_gpu_memory
from tessera.kube import names
from tessera.kube.podspec import ContainerResources, containers_of, gpu_request

# Run:ai / KAI
RUNAI_FRACTION = "gpu-fraction"
RUNAI_MEMORY = "gpu-memory"
RUNAI_NUM_DEVICES = "gpu-fraction-num-devices"
RUNAI_CONTAINER = "gpu-fraction-container-name"
RUNAI_FRACTION_LIMIT = "gpu-fraction-limit"
RUNAI_MEMORY_LIMIT = "gpu-memory-limit"
RUNAI_LIMIT_ENV = "RUNAI_GPU_MEMORY_LIMIT"
RUNAI_ANNOTATIONS = (
    RUNAI_FRACTION, RUNAI_MEMORY, RUNAI_NUM_DEVICES, RUNAI_CONTAINER,
    RUNAI_FRACTION_LIMIT, RUNAI_MEMORY_LIMIT,
)

# Alibaba cGPU
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"
ALIYUN_ENV_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"
ALIYUN_ENV_DEV = "ALIYUN_COM_GPU_MEM_DEV"

# tessera (canonical). GPU_CONTAINER is the webhook's own: which container gets the share.
GPU_CONTAINER = "tessera.io/gpu-container"
CANONICAL_SHARE = (
    names.GPU_PORTION, names.GPU_MEMORY, names.GPU_DEVICES,
    names.GPU_PORTION_LIMIT, names.GPU_MEMORY_LIMIT,
)
CANONICAL_ANNOTATIONS = (*CANONICAL_SHARE, GPU_CONTAINER)

TESSERA, RUNAI, CGPU, NONE = "tessera", "runai", "cgpu", "none"


def annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def label_field(key: str) -> str:
    return f"metadata.labels[{key}]"


@dataclass(frozen=True)
class ContainerRef:
    """A container of the pod: ``kind`` is ``containers`` or ``initContainers``."""

    kind: str
    index: int
    name: str

    @property
    def path(self) -> str:
        return f"spec.{self.kind}[{self.name}]"


@dataclass
class Translation:
    """What a pod asks for, in canonical form, and where it came from."""

    spelling: str
    request: GpuRequest
    annotations: dict[str, str] = field(default_factory=dict)
    """The canonical ``tessera.io/gpu-*`` annotations the pod must carry."""
    container: ContainerRef | None = None
    """The container that gets the share (None for no share)."""
    static_env: dict[str, str] = field(default_factory=dict)
    """Env with values known at admission (cGPU's ``ALIYUN_COM_GPU_MEM_CONTAINER``)."""
    configmap_env: tuple[str, ...] = ()
    """Spelling-specific keys read from the per-pod ConfigMap (cGPU's ``ALIYUN_COM_GPU_MEM_DEV``)."""
    drop_resources: tuple[str, ...] = ()
    """Extended resources to remove from the GPU container (``aliyun.com/gpu-mem``: no node
    advertises it, so a kubelet would refuse the pod)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Canonical annotation -> the field the user wrote (for messages)."""

    @property
    def shared(self) -> bool:
        return self.request.kind in (GpuKind.PORTION, GpuKind.MEMORY)

    def renamed(self, exc: InvalidRequest) -> InvalidRequest:
        """``exc`` with its field named as the user wrote it."""
        canonical = {
            "gpu_portion": names.GPU_PORTION, "gpu": names.GPU_PORTION,
            "gpu_memory": names.GPU_MEMORY, "gpu_devices": names.GPU_DEVICES,
            "gpu_portion_limit": names.GPU_PORTION_LIMIT,
            "gpu_memory_limit": names.GPU_MEMORY_LIMIT, "gpu_model": names.GPU_MODEL,
        }.get(exc.field, exc.field)
        source = self.sources.get(canonical)
        if source is None:
            source = annotation_field(canonical) if canonical.startswith("tessera.io/") else exc.field
        return InvalidRequest(source, exc.rule, exc.value)


def all_containers(spec: Mapping[str, Any]) -> list[tuple[ContainerRef, Mapping[str, Any]]]:
    out = []
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            out.append((ContainerRef(kind, i, str(c.get("name", i))), c))
    return out


def env_value(container: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """(present, entry) of an env variable in a container spec."""
    for e in container.get("env") or []:
        if e.get("name") == name:
            return True, e
    return False, None


def _fmt_decimal(value: Decimal) -> str:
    return format(value.normalize(), "f")


def detect(pod: Mapping[str, Any]) -> dict[str, str]:
    """Spelling -> the first field of the pod written in it (empty: asks for no share)."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    spec = pod.get("spec") or {}
    found: dict[str, str] = {}
    for key in CANONICAL_ANNOTATIONS:
        if key in ann:
            found.setdefault(TESSERA, annotation_field(key))
    for key in RUNAI_ANNOTATIONS:
        if key in ann:
            found.setdefault(RUNAI, annotation_field(key))
    if ALIYUN_GPU_COUNT in labels:
        found.setdefault(CGPU, label_field(ALIYUN_GPU_COUNT))
    for ref, c in all_containers(spec):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if ALIYUN_GPU_MEM in (res.get(part) or {}):
                found.setdefault(CGPU, f"{ref.path}.resources.{part}[{ALIYUN_GPU_MEM}]")
        if env_value(c, RUNAI_LIMIT_ENV)[0]:
            found.setdefault(RUNAI, f"{ref.path}.env[{RUNAI_LIMIT_ENV}]")
    return found


def translate(pod: Mapping[str, Any]) -> Translation:
    """The canonical form of the pod's GPU request; raises InvalidRequest naming the field.

    Works on the pod as the user wrote it (the mutating webhook's input)."""
    found = detect(pod)
    if len(found) > 1:
        order = [s for s in (TESSERA, RUNAI, CGPU) if s in found]
        first, second = order[0], order[1]
        raise InvalidRequest(
            found[second],
            f"mixes GPU spellings: {_SPELLING_NAMES[second]} together with "
            f"{_SPELLING_NAMES[first]} ({found[first]}); use one spelling per pod",
        )
    spelling = next(iter(found), NONE)
    if spelling == RUNAI:
        t = translate_runai(pod)
    elif spelling == CGPU:
        t = _cgpu(pod)
    else:
        t = _tessera(pod, spelling)
    return t


_SPELLING_NAMES = {
    TESSERA: "tessera.io annotations",
    RUNAI: "Run:ai annotations",
    CGPU: "Alibaba cGPU (aliyun.com/gpu-mem)",
}


def _spec_containers(pod: Mapping[str, Any]) -> list[ContainerResources]:
    return containers_of(pod.get("spec") or {})


def pick_container(pod: Mapping[str, Any], name: str | None, field: str) -> ContainerRef:
    spec = pod.get("spec") or {}
    refs = all_containers(spec)
    if name is None:
        main = [r for r, _ in refs if r.kind == "containers"]
        if not main:
            raise InvalidRequest("spec.containers", "a pod needs at least one container")
        return main[0]
    for ref, _ in refs:
        if ref.name == name:
            return ref
    have = ", ".join(r.name for r, _ in refs)
    raise InvalidRequest(field, f"names no container of this pod (containers: {have})", name)


def _canonical_request(t: Translation, pod: Mapping[str, Any],
                       containers: Sequence[ContainerResources]) -> GpuRequest:
    ann = {k: v for k, v in t.annotations.items() if k in CANONICAL_SHARE}
    model = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.GPU_MODEL)
    if model is not None:
        ann[names.GPU_MODEL] = model
    try:
        return gpu_request(ann, containers)
    except InvalidRequest as exc:
        raise t.renamed(exc) from None


def _tessera(pod: Mapping[str, Any], spelling: str) -> Translation:
    ann = ((pod.get("metadata") or {}).get("annotations") or {})
    t = Translation(spelling, GpuRequest.none())
    t.annotations = {k: str(ann[k]) for k in CANONICAL_ANNOTATIONS if k in ann}
    t.sources = {k: annotation_field(k) for k in t.annotations}
    t.request = _canonical_request(t, pod, _spec_containers(pod))
    if GPU_CONTAINER in t.annotations and not t.shared:
        raise InvalidRequest(annotation_field(GPU_CONTAINER),
                             f"needs {names.GPU_PORTION} or {names.GPU_MEMORY}")
    if t.shared:
        t.container = pick_container(pod, t.annotations.get(GPU_CONTAINER),
                                      annotation_field(GPU_CONTAINER))
    return t


def translate_runai(pod: Mapping[str, Any]) -> Translation:
    ann = ((pod.get("metadata") or {}).get("annotations") or {})
    t = Translation(RUNAI, GpuRequest.none())
    src = t.sources
    fraction, memory = ann.get(RUNAI_FRACTION), ann.get(RUNAI_MEMORY)
    if fraction is not None and memory is not None:
        raise InvalidRequest(annotation_field(RUNAI_MEMORY),
                             f"give {RUNAI_FRACTION} or {RUNAI_MEMORY}, not both", memory)
    if fraction is None and memory is None:
        key = next(k for k in RUNAI_ANNOTATIONS if k in ann) if any(
            k in ann for k in RUNAI_ANNOTATIONS) else None
        where = annotation_field(key) if key else f"env {RUNAI_LIMIT_ENV}"
        raise InvalidRequest(where, f"needs a {RUNAI_FRACTION} or {RUNAI_MEMORY} annotation")
    out: dict[str, str] = {}
    if fraction is not None:
        field_ = annotation_field(RUNAI_FRACTION)
        out[names.GPU_PORTION] = _fmt_decimal(parse_portion(fraction, field_))
        src[names.GPU_PORTION] = field_
    if memory is not None:
        field_ = annotation_field(RUNAI_MEMORY)
        out[names.GPU_MEMORY] = f"{parse_runai_gpu_memory(memory, field_) // MiB}Mi"
        src[names.GPU_MEMORY] = field_
    if RUNAI_NUM_DEVICES in ann:
        out[names.GPU_DEVICES] = str(ann[RUNAI_NUM_DEVICES]).strip()
        src[names.GPU_DEVICES] = annotation_field(RUNAI_NUM_DEVICES)
    if RUNAI_FRACTION_LIMIT in ann:
        field_ = annotation_field(RUNAI_FRACTION_LIMIT)
        if fraction is None:
            raise InvalidRequest(field_, f"needs a {RUNAI_FRACTION} request (a memory request "
                                 f"takes {RUNAI_MEMORY_LIMIT})", ann[RUNAI_FRACTION_LIMIT])
        out[names.GPU_PORTION_LIMIT] = _fmt_decimal(
            parse_portion(ann[RUNAI_FRACTION_LIMIT], field_, allow_whole=True))
        src[names.GPU_PORTION_LIMIT] = field_
    if RUNAI_MEMORY_LIMIT in ann:
        field_ = annotation_field(RUNAI_MEMORY_LIMIT)
        if memory is None:
            raise InvalidRequest(field_, f"needs a {RUNAI_MEMORY} request (a fraction request "
                                 f"takes {RUNAI_FRACTION_LIMIT})", ann[RUNAI_MEMORY_LIMIT])
        out[names.GPU_MEMORY_LIMIT] = (
            f"{parse_runai_gpu_memory(ann[RUNAI_MEMORY_LIMIT], field_) // MiB}Mi")
        src[names.GPU_MEMORY_LIMIT] = field_
    container_name = ann.get(RUNAI_CONTAINER)
    t.container = pick_container(pod, container_name, annotation_field(RUNAI_CONTAINER))
    if container_name is not None:
        out[GPU_CONTAINER] = str(container_name)
        src[GPU_CONTAINER] = annotation_field(RUNAI_CONTAINER)
    _runai_env_limit(pod, t, out, fraction is not None)
    t.annotations = out
    t.request = _canonical_request(t, pod, _spec_containers(pod))
    return t


def _runai_env_limit(pod: Mapping[str, Any], t: Translation, out: dict[str, str],
                     is_fraction: bool) -> None:
    """``RUNAI_GPU_MEMORY_LIMIT`` on the GPU container: a fraction for a ``gpu-fraction``
    request, a Kubernetes quantity (bytes) for a ``gpu-memory`` request."""
    assert t.container is not None
    spec = pod.get("spec") or {}
    for ref, c in all_containers(spec):
        present, entry = env_value(c, RUNAI_LIMIT_ENV)
        if not present:
            continue
        field_ = f"{ref.path}.env[{RUNAI_LIMIT_ENV}]"
        if ref != t.container:
            raise InvalidRequest(field_, f"must be set on the GPU container {t.container.name}")
        if "value" not in entry or entry.get("valueFrom") is not None:
            raise InvalidRequest(field_, "must be a literal value, not valueFrom")
        value = entry.get("value")
        if is_fraction:
            if names.GPU_PORTION_LIMIT in out:
                raise InvalidRequest(field_, f"give {RUNAI_FRACTION_LIMIT} or {RUNAI_LIMIT_ENV}, "
                                     "not both", value)
            out[names.GPU_PORTION_LIMIT] = _fmt_decimal(
                parse_portion(value, field_, allow_whole=True))
            t.sources[names.GPU_PORTION_LIMIT] = field_
        else:
            if names.GPU_MEMORY_LIMIT in out:
                raise InvalidRequest(field_, f"give {RUNAI_MEMORY_LIMIT} or {RUNAI_LIMIT_ENV}, "
                                     "not both", value)
            out[names.GPU_MEMORY_LIMIT] = str(parse_memory(value, field_))
            t.sources[names.GPU_MEMORY_LIMIT] = field_


def _cgpu(pod: Mapping[str, Any]) -> Translation:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = pod.get("spec") or {}
    t = Translation(CGPU, GpuRequest.none())
    holders: list[tuple[ContainerRef, Mapping[str, Any], str]] = []
    for ref, c in all_containers(spec):
        res = c.get("resources") or {}
        limit = (res.get("limits") or {}).get(ALIYUN_GPU_MEM)
        request = (res.get("requests") or {}).get(ALIYUN_GPU_MEM)
        if limit is None and request is None:
            continue
        if limit is None:
            raise InvalidRequest(f"{ref.path}.resources.requests[{ALIYUN_GPU_MEM}]",
                                 "extended resources are asked in resources.limits", request)
        if request is not None and str(request).strip() != str(limit).strip():
            raise InvalidRequest(f"{ref.path}.resources.requests[{ALIYUN_GPU_MEM}]",
                                 "must equal resources.limits", request)
        holders.append((ref, c, str(limit)))
    count_field = label_field(ALIYUN_GPU_COUNT)
    if not holders:
        raise InvalidRequest(count_field, f"needs {ALIYUN_GPU_MEM} in a container's "
                             "resources.limits (GiB in total over the GPUs)", labels.get(ALIYUN_GPU_COUNT))
    if len(holders) > 1:
        raise InvalidRequest(f"{holders[1][0].path}.resources.limits[{ALIYUN_GPU_MEM}]",
                             f"only one container of a pod may ask for {ALIYUN_GPU_MEM} "
                             f"(already asked by {holders[0][0].name})")
    ref, container, total = holders[0]
    mem_field = f"{ref.path}.resources.limits[{ALIYUN_GPU_MEM}]"
    for var in (ALIYUN_ENV_CONTAINER, ALIYUN_ENV_DEV):
        if env_value(container, var)[0]:
            raise InvalidRequest(f"{ref.path}.env[{var}]", "is set by tessera (as cGPU sets it)")
    try:
        request = cgpu_request(total, labels.get(ALIYUN_GPU_COUNT))
    except InvalidRequest as exc:
        where = count_field if exc.field == ALIYUN_GPU_COUNT else mem_field
        raise InvalidRequest(where, exc.rule, exc.value) from None
    assert request.memory is not None
    t.container = ref
    t.annotations = {names.GPU_MEMORY: f"{request.memory // GiB}Gi"}
    t.sources = {names.GPU_MEMORY: mem_field, names.GPU_DEVICES: count_field}
    if request.devices > 1:
        t.annotations[names.GPU_DEVICES] = str(request.devices)
    if ref.kind != "containers" or ref.index != 0:
        t.annotations[GPU_CONTAINER] = ref.name
    t.static_env = {ALIYUN_ENV_CONTAINER: str(request.memory // GiB)}
    t.configmap_env = (ALIYUN_ENV_DEV,)
    t.drop_resources = (ALIYUN_GPU_MEM,)
    stripped = [
        ContainerResources(c.name, {k: v for k, v in c.requests.items() if k != ALIYUN_GPU_MEM},
                           {k: v for k, v in c.limits.items() if k != ALIYUN_GPU_MEM})
        for c in containers_of(spec)
    ]
    t.request = _canonical_request(t, pod, stripped)
    return t
