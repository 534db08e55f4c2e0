"""Rewriting a GPU request written the old way into a ResourceClaim (``--rewrite-to-claims``,
chart value ``dra.rewriteRequests``; issue 19 item 4, docs/dra.md).

On a cluster where GPUs are given by DRA (tessera's driver ``gpu.tessera.io``), a pod that asks
the old way — tessera's ``tessera.io/gpu-*`` annotations, Run:ai/KAI's ``gpu-fraction`` /
``gpu-memory``, cGPU's ``aliyun.com/gpu-mem``, or whole ``nvidia.com/gpu`` in a pod scheduled
by tessera — gets the same request as a claim made from a ResourceClaimTemplate in its
namespace, written as docs/dra.md's example claims are:

- N whole GPUs: class ``gpu.tessera.io``, ``count: N``;
- memory per GPU (bytes, whole MiB) on N GPUs: class ``share.gpu.tessera.io``,
  ``capacity.requests.memory``, ``count: N``;
- a portion of each of N GPUs: class ``share.gpu.tessera.io``, ``capacity.requests.shares``
  (hundredths of a GPU, rounded up to a whole hundredth), ``count: N``.

The template's name is ``tessera-gpu-<hash of its spec>``, so every pod asking the same shape in
a namespace shares one template (each pod still gets a claim of its own, made by
kube-controller-manager). A claim has no limit apart from its request (the kubelet plugin
enforces the consumed capacity as the limit), so a limit above the request is refused rather
than silently changed; so is a GPU model (tessera does not allocate claims with selectors yet).

Pure: the pod and the template come out as dicts; the webhook's server creates the template
(:mod:`tessera.kube.admission.server`) before it admits the pod, and refuses the pod if it
cannot.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.units import parse_memory
from tessera.kube import names
from tessera.kube.admission import spellings as sp
from tessera.kube.claims import SHARE_CLASS, SHARES, WHOLE_CLASS

POD_CLAIM = "tessera-gpu"
"""The name of the claim entry added to ``spec.resourceClaims`` and the container's
``resources.claims``."""
TEMPLATE_PREFIX = "tessera-gpu-"
REQUEST_NAME = "gpu"
MiB = 2**20


@dataclass(frozen=True)
class Template:
    """A ResourceClaimTemplate the pod needs in its namespace."""

    name: str
    spec: dict[str, Any]
    """The template's ``spec.spec`` (a ResourceClaim spec)."""

    def manifest(self, namespace: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.name, "namespace": namespace,
                             "labels": {names.MANAGED_BY: "tessera"}},
                "spec": {"spec": self.spec}}


def claim_spec(request: GpuRequest) -> dict[str, Any]:
    """The ResourceClaim spec asking what ``request`` asks (see the module's docstring)."""
    exactly: dict[str, Any]
    if request.kind is GpuKind.WHOLE:
        exactly = {"deviceClassName": WHOLE_CLASS}
    elif request.kind is GpuKind.MEMORY:
        assert request.memory is not None
        nbytes = -(-request.memory // MiB) * MiB
        exactly = {"deviceClassName": SHARE_CLASS,
                   "capacity": {"requests": {"memory": str(nbytes)}}}
    elif request.kind is GpuKind.PORTION:
        assert request.portion is not None
        shares = (request.portion * SHARES).to_integral_value(rounding=ROUND_CEILING)
        exactly = {"deviceClassName": SHARE_CLASS,
                   "capacity": {"requests": {"shares": str(int(shares))}}}
    else:
        raise ValueError(f"no claim for a request of kind {request.kind}")
    exactly["allocationMode"] = "ExactCount"
    exactly["count"] = request.devices
    return {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}


def template_for(request: GpuRequest) -> Template:
    spec = claim_spec(request)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Template(TEMPLATE_PREFIX + digest, spec)


def same_spec(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a stored template's claim spec asks what ``wanted`` asks: quantities compared by
    value (the API server re-spells them: ``5242880000`` is stored as ``5242880k``)."""
    return bool(_normal(stored) == _normal(wanted))


def _normal(value: Any, key: str = "") -> Any:
    if isinstance(value, Mapping):
        if key == "requests" and all(isinstance(v, str | int) for v in value.values()):
            try:
                return {k: parse_memory(str(v), k) for k, v in value.items()}
            except InvalidRequest:
                pass
        return {k: _normal(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _refuse_limits_and_model(t: sp.Translation, pod: Mapping[str, Any]) -> None:
    r = t.request
    for canonical, limit, request in (
            (names.GPU_PORTION_LIMIT, r.portion_limit, r.portion),
            (names.GPU_MEMORY_LIMIT, r.memory_limit, r.memory)):
        if limit is not None and limit != request:
            raise InvalidRequest(t.sources.get(canonical, sp.annotation_field(canonical)),
                                 "a GPU limit above the request cannot be written in a "
                                 "ResourceClaim (its consumed capacity is both request and "
                                 "limit; the webhook rewrites requests into claims): give the "
                                 "limit equal to the request, or leave it out")
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if names.GPU_MODEL in ann:
        raise InvalidRequest(sp.annotation_field(names.GPU_MODEL),
                             "cannot be written in a ResourceClaim yet (the webhook rewrites "
                             "requests into claims; tessera allocates no claims with selectors)",
                             ann[names.GPU_MODEL])


def _whole_gpu_container(pod: Mapping[str, Any]) -> sp.ContainerRef:
    holders = [ref for ref, c in sp.all_containers(pod.get("spec") or {})
               if any(names.GPU_RESOURCE in ((c.get("resources") or {}).get(part) or {})
                      for part in ("limits", "requests"))]
    if len(holders) > 1:
        raise InvalidRequest(f"{holders[1].path}.resources.limits[{names.GPU_RESOURCE}]",
                             "whole GPUs in more than one container cannot be rewritten into "
                             f"one ResourceClaim (already in {holders[0].name}); give them to "
                             "one container, or write the pod's claims yourself")
    return holders[0]


def rewritable(t: sp.Translation) -> bool:
    """Whether the pod asks for GPUs in a way the rewrite turns into a claim."""
    return t.request.kind in (GpuKind.WHOLE, GpuKind.MEMORY, GpuKind.PORTION)


def rewrite(pod: dict[str, Any], t: sp.Translation) -> Template:
    """Rewrite ``pod`` (a copy the webhook is mutating) in place: the old request removed, the
    claim entry and the container's claim added. Returns the template the claim is made from.
    Raises InvalidRequest naming the field when the request cannot be a claim."""
    _refuse_limits_and_model(t, pod)
    spec = pod.setdefault("spec", {})
    if spec.get("resourceClaims"):
        raise InvalidRequest("spec.resourceClaims",
                             f"a pod asking for GPUs the old way ({_old_field(t, pod)}) must "
                             "not name ResourceClaims of its own as well: the webhook rewrites "
                             "the old request into a claim; ask in one way only")
    ref = t.container if t.shared else _whole_gpu_container(pod)
    assert ref is not None
    template = template_for(t.request)
    meta = pod.setdefault("metadata", {})
    ann = meta.get("annotations") or {}
    for key in (*sp.CANONICAL_ANNOTATIONS, *sp.RUNAI_ANNOTATIONS):
        ann.pop(key, None)
    meta["annotations"] = ann
    container = spec[ref.kind][ref.index]
    if container.get("env"):
        container["env"] = [e for e in container["env"] if e.get("name") != sp.RUNAI_LIMIT_ENV]
    res = container.get("resources") or {}
    for part in ("limits", "requests"):
        for key in (sp.ALIYUN_GPU_MEM, names.GPU_RESOURCE):
            (res.get(part) or {}).pop(key, None)
        if part in res and not res[part]:
            del res[part]
    res["claims"] = [*(res.get("claims") or []), {"name": POD_CLAIM}]
    container["resources"] = res
    spec["resourceClaims"] = [{"name": POD_CLAIM, "resourceClaimTemplateName": template.name}]
    return template


def _old_field(t: sp.Translation, pod: Mapping[str, Any]) -> str:
    if t.sources:
        return next(iter(t.sources.values()))
    ref = _whole_gpu_container(pod)
    return f"{ref.path}.resources.limits[{names.GPU_RESOURCE}]"


def uses_claims(container: Mapping[str, Any]) -> bool:
    """Whether a container gets devices from DRA claims (its GPUs, if any, come from the claims'
    CDI devices: it is not given NVIDIA_VISIBLE_DEVICES=void)."""
    return bool((container.get("resources") or {}).get("claims"))
