"""Compute share: a guaranteed share of GPU time (request) with a burst ceiling (limit).

Pure rules (no I/O) shared by every front end (CLI, REST, annotations, webhook) and by
placement and quota: what a user may ask, the defaults (Run:ai parity), and how a compute
request counts. Enforcement is the lease arbiter of libtessera-cuda.so (docs/compute-share.md).

* ``request`` r: share of GPU time guaranteed over 1 s while the workload has work queued.
* ``limit`` l >= r: ceiling on that share, even when the GPU is otherwise idle.
* modes (cluster default, overridable per workload): ``off`` (the driver's 1/n, nothing gated),
  ``fair`` (spare time split among backlogged workloads under their limit; ``-g x`` gives
  r = x, l = 1), ``strict`` (l = r; capped even alone).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest

MODES = ("off", "fair", "strict")
FLAG_REQUEST = "--gpu-compute-request"
FLAG_LIMIT = "--gpu-compute-limit"
FLAG_MODE = "--gpu-compute-mode"
FIELD_REQUEST = "spec.compute.gpuComputeRequest"
FIELD_LIMIT = "spec.compute.gpuComputeLimit"
FIELD_MODE = "spec.compute.gpuComputeMode"
ANNOTATION_REQUEST = "tessera.io/gpu-compute-request"
ANNOTATION_LIMIT = "tessera.io/gpu-compute-limit"
ANNOTATION_MODE = "tessera.io/gpu-compute-mode"


@dataclass(frozen=True, slots=True)
class ComputeShare:
    request: Decimal
    limit: Decimal
    mode: str
    explicit: bool = False
    """The user asked for it (rather than the defaults deriving it from the GPU share)."""

    def to_dict(self) -> dict[str, object]:
        return {"gpuComputeRequest": str(self.request), "gpuComputeLimit": str(self.limit),
                "gpuComputeMode": self.mode, "explicit": self.explicit}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> ComputeShare:
        return cls(Decimal(str(d["gpuComputeRequest"])), Decimal(str(d["gpuComputeLimit"])),
                   str(d["gpuComputeMode"]), bool(d.get("explicit", False)))


@dataclass(frozen=True, slots=True)
class Names:
    """How the user spelled each field (a CLI flag, an API field or an annotation)."""

    request: str = FIELD_REQUEST
    limit: str = FIELD_LIMIT
    mode: str = FIELD_MODE


CLI = Names(FLAG_REQUEST, FLAG_LIMIT, FLAG_MODE)
API = Names()
ANNOTATIONS = Names(ANNOTATION_REQUEST, ANNOTATION_LIMIT, ANNOTATION_MODE)


def _fraction(value: object, name: str) -> Decimal:
    if isinstance(value, bool):
        raise InvalidRequest(name, "must be a number in [0, 1], such as 0.3", value)
    text = str(value).strip()
    try:
        d = Decimal(text)
    except InvalidOperation:
        raise InvalidRequest(name, "must be a number in [0, 1], such as 0.3", text[:20]) from None
    if not d.is_finite() or not 0 <= d <= 1:
        raise InvalidRequest(name, "must be a number in [0, 1], such as 0.3", text[:20])
    return d


def parse_fraction(value: object, name: str) -> Decimal:
    """A compute request or limit as written (``0.3``): a number in [0, 1], else refused naming
    ``name``."""
    return _fraction(value, name)


def parse_quantity(value: object, name: str) -> Decimal:
    """A compute amount as a Kubernetes quantity (a DRA claim's ``capacity.requests.compute``):
    ``300m`` or ``0.3`` is 0.3 of the GPU's time; within [0, 1]."""
    text = str(value).strip()
    if text.endswith("m") and not isinstance(value, bool):
        try:
            return _fraction(Decimal(text[:-1]) / 1000, name)
        except (InvalidOperation, InvalidRequest):
            raise InvalidRequest(name, "must be a quantity in [0, 1] of the GPU's time, such as 300m "
                                 "or 0.3", text[:20]) from None
    return _fraction(value, name)


def check_mode(value: object, name: str) -> str:
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise InvalidRequest(name, f"must be one of {', '.join(MODES)}", str(value)[:20])
    return mode


def resolve(gpu: GpuRequest, *, request: object = None, limit: object = None, mode: object = None,
            cluster_mode: str = "off", mig: bool = False, names: Names = API) -> ComputeShare | None:
    """The compute share of a workload, or None when its kernels are not gated.

    Refusals name the field as the user wrote it: r or l outside [0, 1], l < r, a compute
    request on whole GPUs or a MIG partition (their time is not shared), a bad mode, or a compute
    request while the cluster's mode is ``off``.
    """
    asked = request is not None or limit is not None or mode is not None
    r = None if request is None else _fraction(request, names.request)
    lim = None if limit is None else _fraction(limit, names.limit)
    m = None if mode is None else check_mode(mode, names.mode)
    if asked and (mig or gpu.kind in (GpuKind.WHOLE, GpuKind.NONE)):
        what = "a MIG partition" if mig else "whole GPUs" if gpu.kind is GpuKind.WHOLE else "no GPU"
        name = names.request if request is not None else names.limit if limit is not None else names.mode
        raise InvalidRequest(name, f"needs a shared GPU (a portion or a memory amount); this workload asks "
                             f"for {what}, whose time is not shared")
    if asked and cluster_mode == "off" and m != "off":
        name = names.request if request is not None else names.limit if limit is not None else names.mode
        raise InvalidRequest(name, "compute shares are off in this cluster (tessera up --gpu-compute-mode "
                             "fair|strict turns them on)")
    if r is not None and lim is not None and lim < r:
        raise InvalidRequest(names.limit, f"must be at least {names.request} ({r})", str(lim))
    if r is not None and gpu.kind is GpuKind.PORTION and gpu.portion is not None and r > gpu.portion:
        # Placement keeps the portions on a GPU within 1, so requests within their portions
        # keep the compute requests within 1 too (a larger one could be promised twice).
        raise InvalidRequest(names.request, f"may not exceed the GPU portion ({gpu.portion}): placement "
                             "reserves a GPU's time by portion", str(r))
    effective = m or cluster_mode
    if effective == "off" or gpu.kind not in (GpuKind.PORTION, GpuKind.MEMORY) or mig:
        return None
    if r is None:
        r = gpu.portion if gpu.kind is GpuKind.PORTION and gpu.portion is not None else Decimal(0)
        if lim is not None and lim < r:
            raise InvalidRequest(names.limit, f"must be at least the request {r} (from the GPU portion)",
                                 str(lim))
    if lim is None:
        # Run:ai parity: strict caps at the request; a memory-only share (r = 0) bursts to 1.
        lim = r if effective == "strict" and r > 0 else Decimal(1)
    elif effective == "strict" and lim != r:
        raise InvalidRequest(names.limit, f"must equal the compute request ({r}) in strict mode", str(lim))
    return ComputeShare(r, lim, effective, explicit=asked)


def on_request(gpu: GpuRequest, share: ComputeShare | None) -> GpuRequest:
    """The GPU request carrying its compute request, as placement and quota count it (a share
    promised more of the GPU's time than of its memory counts as that time)."""
    if share is None or gpu.kind not in (GpuKind.PORTION, GpuKind.MEMORY):
        return gpu
    return dataclasses.replace(gpu, compute=share.request)


def counted_portion(gpu: GpuRequest, share: ComputeShare | None, memory_portion: float) -> float:
    """What a device share counts in quota and fair share: max(memory portion, compute request);
    the limit (burst) is never counted."""
    if share is None:
        return memory_portion
    return max(memory_portion, float(share.request))


def fits(requests_on_gpu: list[Decimal], new: ComputeShare | None) -> bool:
    """Placement: the compute requests on one GPU add up to at most 1."""
    if new is None:
        return True
    return sum(requests_on_gpu, Decimal(0)) + new.request <= 1


def from_gpucores(value: object, name: str = "nvidia.com/gpucores") -> tuple[Decimal, Decimal]:
    """HAMi's ``nvidia.com/gpucores: N`` (0-100 per device) as r = l = N/100 (HAMi's cap, with the
    guarantee its scheduler already reserves)."""
    text = str(value).strip()
    if not text.isdigit() or not 0 <= int(text) <= 100:
        raise InvalidRequest(name, "must be a whole number from 0 to 100 (percent of the GPU's time)",
                             text[:20])
    v = Decimal(int(text)) / 100
    return v, v


KAI_MODES = {"time-slicing": "fair"}


def from_kai_mode(value: object, name: str) -> str:
    """KAI's ``nvidia.com/container.<c>.gpu-compute.mode`` (and the older
    ``kai.scheduler/gpu-compute-sharing-mode``): time-slicing maps to fair; sm-sharing (MPS) is
    not offered by tessera and is refused."""
    text = str(value).strip()
    if text not in KAI_MODES:
        raise InvalidRequest(name, "must be time-slicing (sm-sharing, MPS, is not supported by tessera)",
                             text[:30])
    return KAI_MODES[text]
