"""Compute-share spellings on a pod, translated to tessera's canonical annotations
``tessera.io/gpu-compute-request|limit|mode`` (docs/compute-share.md):

- tessera's own annotations (validated, kept);
- HAMi ``nvidia.com/gpucores: N`` in the GPU container's resources: r = l = N/100;
- KAI's compute mode, ``nvidia.com/container.<name>.gpu-compute.mode`` or the older
  ``kai.scheduler/gpu-compute-sharing-mode``: ``time-slicing`` means fair; ``sm-sharing`` (MPS)
  is refused.

Every value goes through :func:`tessera.core.compute.resolve`, the rule every front end uses, so
errors name the field as the pod wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.core import compute
from tessera.core.model import GpuRequest

HAMI_CORES = "nvidia.com/gpucores"
STATUS = "tessera.io/gpu-compute-status"
ENFORCED = ("enforced: tessera-node's arbiter of its GPU (the container starts only once its entry "
            "is written; docs/compute-share.md)")
"""Said on a one-GPU share: tessera-node writes its arbiter entry and gpu-compute.conf into the
config directory the container needs to start (tessera.node.compute_arbiters), so it cannot run
ungated while the isolation library is loaded."""


def not_enforced_multi_gpu(devices: int) -> str:
    return (f"not enforced: multi-GPU ({devices} GPUs; leases are per GPU and not aligned across "
            "them, so its kernels run ungated; docs/compute-share.md)")
KAI_MODE_OLD = "kai.scheduler/gpu-compute-sharing-mode"
KAI_MODE_SUFFIX = ".gpu-compute.mode"
KAI_MODE_PREFIX = "nvidia.com/container."


def _ann_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _hami_cores(pod: Mapping[str, Any]) -> tuple[str, object] | None:
    spec = pod.get("spec") or {}
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            res = c.get("resources") or {}
            for part in ("limits", "requests"):
                v = (res.get(part) or {}).get(HAMI_CORES)
                if v is not None:
                    return f"spec.{kind}[{i}].resources.{part}[{HAMI_CORES}]", v
    return None


def canonical(pod: Mapping[str, Any], gpu: GpuRequest, *, mig: bool, cluster_mode: str) -> dict[str, str]:
    """The canonical compute annotations of a pod (empty: its kernels are not gated)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    request = ann.get(compute.ANNOTATION_REQUEST)
    limit = ann.get(compute.ANNOTATION_LIMIT)
    mode = ann.get(compute.ANNOTATION_MODE)
    names = compute.ANNOTATIONS
    names = compute.Names(_ann_field(names.request), _ann_field(names.limit), _ann_field(names.mode))
    hami = _hami_cores(pod)
    if hami is not None and request is None and limit is None:
        where, value = hami
        r, lim = compute.from_gpucores(value, where)
        if r > 0:  # HAMi's 0 means "no core limit"
            request, limit = str(r), str(lim)
            names = compute.Names(where, where, names.mode)
    for key in list(ann):
        kai = key == KAI_MODE_OLD or (key.startswith(KAI_MODE_PREFIX) and key.endswith(KAI_MODE_SUFFIX))
        if kai and mode is None:
            mode = compute.from_kai_mode(ann[key], _ann_field(key))
            names = compute.Names(names.request, names.limit, _ann_field(key))
    share = compute.resolve(gpu, request=request, limit=limit, mode=mode, cluster_mode=cluster_mode, mig=mig,
                            names=names)
    if share is None:
        return {}
    status = ENFORCED if gpu.devices <= 1 else not_enforced_multi_gpu(gpu.devices)
    return {compute.ANNOTATION_REQUEST: str(share.request), compute.ANNOTATION_LIMIT: str(share.limit),
            compute.ANNOTATION_MODE: share.mode, STATUS: status}


def share_doc(annotations: Mapping[str, str]) -> dict[str, Any] | None:
    """A pod's compute share as the workload document shows it (``computeShare``: the console's
    workload page, ``describe``); None without one. The time it is charged is in the node's
    arbiter, not read here."""
    if compute.ANNOTATION_REQUEST not in annotations:
        return None
    out = {"gpuComputeRequest": annotations[compute.ANNOTATION_REQUEST],
           "gpuComputeLimit": annotations.get(compute.ANNOTATION_LIMIT, "1"),
           "gpuComputeMode": annotations.get(compute.ANNOTATION_MODE, ""),
           "status": annotations.get(STATUS, "")}
    out["text"] = (f"request {out['gpuComputeRequest']}, limit {out['gpuComputeLimit']} "
                   f"({out['gpuComputeMode']}); {out['status']}")
    return out
