"""What a pod asks for, read from its spec and annotations. The scheduler and the admission
webhook both call this module, so a rule is written once and every refusal names the
annotation or field the user wrote.

GPU spellings (after the webhook has translated Run:ai / cGPU ones):

- ``nvidia.com/gpu: N`` in container limits: N whole GPUs;
- ``tessera.io/gpu-portion: "0.5"`` (optionally ``tessera.io/gpu-portion-limit``): a share of
  each device's memory;
- ``tessera.io/gpu-memory: "5G"`` (Kubernetes quantity; optionally ``tessera.io/gpu-memory-limit``);
- ``tessera.io/gpu-devices: "2"``: the same share on that many devices of one node;
- ``tessera.io/gpu-model: "H100-80GB|A100-80GB"``: allowed models;
- ``nvidia.com/mig-3g.20gb: 1`` in container limits (the GPU operator's MIG resources): an
  extended resource the scheduler places where a node advertises it; not with a share;
- ``tessera.io/gpu-mig-profile: "3g.20gb"``: a MIG partition of that profile, made on demand by
  tessera-node on a GPU in MIG mode (docs/mig.md); counts as the profile's fraction of a GPU;
  the whole GPU request of the pod.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from tessera.core import compute
from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_profile, profile_fraction
from tessera.core.model import GpuKind, GpuRequest, ResourceRequest
from tessera.core.requests import parse_gpu_request
from tessera.core.units import parse_memory
from tessera.kube import names

_FIELD_TO_ANNOTATION = {
    "gpu_portion": names.GPU_PORTION,
    "gpu_memory": names.GPU_MEMORY,
    "gpu_devices": names.GPU_DEVICES,
    "gpu_portion_limit": names.GPU_PORTION_LIMIT,
    "gpu_memory_limit": names.GPU_MEMORY_LIMIT,
    "gpu_model": names.GPU_MODEL,
    "gpu": names.GPU_PORTION,
}


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    requests: Mapping[str, str]
    limits: Mapping[str, str]


def parse_cpu_milli(value: object, field: str) -> int:
    """Millicores of a Kubernetes CPU quantity (``500m``, ``2``, ``0.5``); rounds up."""
    text = str(value).strip()
    try:
        amount = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation:
        raise InvalidRequest(field, "must be a CPU quantity such as 500m or 2", value) from None
    if not amount.is_finite() or amount < 0:
        raise InvalidRequest(field, "must be a CPU quantity such as 500m or 2", value)
    return int((amount * 1000).to_integral_value(rounding=ROUND_CEILING))


def _memory(value: object, field: str) -> int:
    if str(value).strip() in ("0", "0.0"):
        return 0
    return parse_memory(value, field)


def _container_amounts(c: ContainerResources, kind: str) -> tuple[int, int]:
    src = c.requests if c.requests else c.limits
    cpu = mem = 0
    if "cpu" in src:
        cpu = parse_cpu_milli(src["cpu"], f"containers[{c.name}].resources.{kind}.cpu")
    elif "cpu" in c.limits:
        cpu = parse_cpu_milli(c.limits["cpu"], f"containers[{c.name}].resources.limits.cpu")
    if "memory" in src:
        mem = _memory(src["memory"], f"containers[{c.name}].resources.{kind}.memory")
    elif "memory" in c.limits:
        mem = _memory(c.limits["memory"], f"containers[{c.name}].resources.limits.memory")
    return cpu, mem


def whole_gpus(containers: Sequence[ContainerResources]) -> int:
    total = 0
    for c in containers:
        raw = c.limits.get(names.GPU_RESOURCE, c.requests.get(names.GPU_RESOURCE))
        if raw is None:
            continue
        field = f"containers[{c.name}].resources.limits.{names.GPU_RESOURCE}"
        text = str(raw).strip()
        if not (text.isascii() and text.isdigit()):
            raise InvalidRequest(field, "must be a whole number of GPUs", raw)
        req = c.requests.get(names.GPU_RESOURCE)
        if req is not None and str(req).strip() != text:
            raise InvalidRequest(field, "requests and limits of nvidia.com/gpu must be equal", req)
        total += int(text)
    return total


def mig_resources(c: ContainerResources) -> list[str]:
    """The GPU operator's MIG resources a container asks for (``nvidia.com/mig-3g.20gb``)."""
    return sorted({k for k in (*c.limits, *c.requests) if k.startswith(names.MIG_RESOURCE_PREFIX)})


def gpu_request(
    annotations: Mapping[str, str], containers: Sequence[ContainerResources]
) -> GpuRequest:
    """The GPU request of a pod; raises InvalidRequest naming the annotation or field."""
    whole = whole_gpus(containers)
    given: dict[str, Any] = {k: annotations[v] for k, v in _FIELD_TO_ANNOTATION.items()
             if k != "gpu" and v in annotations}
    fractional = any(k in given for k in ("gpu_portion", "gpu_memory"))
    mig = [(c.name, r) for c in containers for r in mig_resources(c)]
    if mig and fractional:
        key = names.GPU_PORTION if "gpu_portion" in given else names.GPU_MEMORY
        raise InvalidRequest(f"containers[{mig[0][0]}].resources.limits.{mig[0][1]}",
                             f"give a MIG partition ({mig[0][1]}) or a share ({key}), not both")
    if whole and fractional:
        key = names.GPU_PORTION if "gpu_portion" in given else names.GPU_MEMORY
        raise InvalidRequest(
            key, f"give {names.GPU_RESOURCE} limits (whole GPUs) or {key} (a share), not both"
        )
    if not fractional:
        for k in ("gpu_devices", "gpu_portion_limit", "gpu_memory_limit"):
            if k in given:
                raise InvalidRequest(
                    _FIELD_TO_ANNOTATION[k],
                    f"needs {names.GPU_PORTION} or {names.GPU_MEMORY}; whole GPUs are asked "
                    f"with {names.GPU_RESOURCE} limits",
                    given[k],
                )
        if whole:
            models = given.get("gpu_model")
            try:
                return parse_gpu_request(gpu_devices=whole, gpu_model=models)
            except InvalidRequest as exc:
                raise _renamed(exc) from None
        if "gpu_model" in given:
            raise InvalidRequest(names.GPU_MODEL, "needs a GPU request to constrain")
        return GpuRequest.none()
    try:
        return parse_gpu_request(**given)
    except InvalidRequest as exc:
        raise _renamed(exc) from None


def _renamed(exc: InvalidRequest) -> InvalidRequest:
    return InvalidRequest(_FIELD_TO_ANNOTATION.get(exc.field, exc.field), exc.rule, exc.value)


def _with_compute(gpu: GpuRequest, annotations: Mapping[str, str]) -> GpuRequest:
    """The share with its compute request (``tessera.io/gpu-compute-request``, which the webhook
    writes in canonical form): placement keeps the requests on a GPU within 1."""
    value = annotations.get(compute.ANNOTATION_REQUEST)
    if value is None or not gpu.shared or annotations.get(compute.ANNOTATION_MODE, "").strip() == "off":
        return gpu
    return dataclasses.replace(gpu, compute=compute.parse_fraction(value, compute.ANNOTATION_REQUEST))


def pod_request(
    annotations: Mapping[str, str],
    containers: Sequence[ContainerResources],
    init_containers: Sequence[ContainerResources] = (),
) -> ResourceRequest:
    """GPU, CPU and memory of one pod: containers summed, the largest init container if more."""
    fraction = mig_fraction(annotations, containers)
    gpu = GpuRequest.none() if fraction is not None else gpu_request(annotations, containers)
    static = operator_mig_gpus(containers) if gpu.kind is GpuKind.NONE else None
    cpu = mem = 0
    for c in containers:
        a, b = _container_amounts(c, "requests")
        cpu += a
        mem += b
    for c in init_containers:
        a, b = _container_amounts(c, "requests")
        cpu = max(cpu, a)
        mem = max(mem, b)
    return ResourceRequest(gpu=_with_compute(gpu, annotations), cpu_milli=cpu, memory=mem,
                           gpus=fraction if fraction is not None else static,
                           mig=None if fraction is None else mig_profile(annotations))


_OPERATOR_PROFILE = re.compile(r"([1-7])g\.[0-9]+gb(\+me)?")


def operator_mig_gpus(containers: Sequence[ContainerResources]) -> float | None:
    """GPUs the GPU operator's MIG resources of a pod count as in quota and fair share
    (``nvidia.com/mig-3g.20gb: 2`` = 2 x 3/7): each partition its compute slices of the seven
    every MIG GPU has, read from the resource's name, so a profile of a GPU tessera has no table
    for counts too. None when it asks for none (a name that is not a profile counts nothing)."""
    total = 0.0
    for c in containers:
        for key in mig_resources(c):
            m = _OPERATOR_PROFILE.fullmatch(key.removeprefix(names.MIG_RESOURCE_PREFIX))
            text = str(c.limits.get(key, c.requests.get(key, "0"))).strip()
            if m and text.isascii() and text.isdigit():
                total += int(text) * int(m.group(1)) / 7
    return round(total, 3) or None


def mig_profile(annotations: Mapping[str, str]) -> str | None:
    """The canonical profile a pod asks for with ``tessera.io/gpu-mig-profile`` (any spelling
    :func:`tessera.core.mig.parse_profile` takes), or None."""
    raw = annotations.get(names.MIG_PROFILE)
    if raw is None:
        return None
    return parse_profile(raw, f"metadata.annotations[{names.MIG_PROFILE}]")


def mig_fraction(annotations: Mapping[str, str], containers: Sequence[ContainerResources]
                 ) -> float | None:
    """The GPU fraction a MIG-profile pod counts as, or None for other pods. A profile is the
    pod's whole GPU request: a share, whole GPUs or the GPU operator's MIG resources with it
    are refused, naming both."""
    profile = mig_profile(annotations)
    if profile is None:
        return None
    field = f"metadata.annotations[{names.MIG_PROFILE}]"
    for key in sorted(set(_FIELD_TO_ANNOTATION.values())):
        if key in annotations and key != names.GPU_MODEL:
            raise InvalidRequest(field, f"a MIG profile is the pod's whole GPU request; give it "
                                        f"or {key} (a share), not both", annotations[names.MIG_PROFILE])
    for c in containers:
        for r in (names.GPU_RESOURCE, *mig_resources(c)):
            if r in c.limits or r in c.requests:
                raise InvalidRequest(field, f"a MIG profile is the pod's whole GPU request; give "
                                            f"it or containers[{c.name}] {r}, not both",
                                     annotations[names.MIG_PROFILE])
    if names.GPU_MODEL in annotations:
        raise InvalidRequest(f"metadata.annotations[{names.GPU_MODEL}]", "is not used with a MIG profile (the profile "
                                              "names the memory; any MIG GPU that has it serves)")
    return profile_fraction(profile)


def containers_of(spec: Mapping[str, Any], key: str = "containers") -> list[ContainerResources]:
    """ContainerResources from a pod spec given as a plain dict (admission review, YAML)."""
    out = []
    for c in spec.get(key) or []:
        res = c.get("resources") or {}
        out.append(ContainerResources(
            c.get("name", "?"),
            {k: str(v) for k, v in (res.get("requests") or {}).items()},
            {k: str(v) for k, v in (res.get("limits") or {}).items()},
        ))
    return out


def pod_request_from_dict(pod: Mapping[str, Any]) -> ResourceRequest:
    """``pod_request`` for a pod as a plain dict (what an admission webhook receives)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return pod_request(
        meta.get("annotations") or {}, containers_of(spec), containers_of(spec, "initContainers")
    )


def is_shared(request: ResourceRequest) -> bool:
    return request.gpu.kind in (GpuKind.PORTION, GpuKind.MEMORY)
