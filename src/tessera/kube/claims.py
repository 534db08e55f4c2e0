"""ResourceClaims for tessera's DRA driver ``gpu.tessera.io``: what they ask, as the core's
GpuRequest, and the ``status`` that records an allocation (issue 19, docs/dra.md).

Pure (claims as plain dicts in, requests and status dicts out); the scheduler's wiring is not
built yet. A claim's request becomes the same request an annotation would make, so placement,
quota and fair share treat both alike:

- class ``gpu.tessera.io``: ``count`` whole GPUs (no capacity; a capacity there is refused);
- class ``share.gpu.tessera.io``: ``count`` devices each with ``capacity.requests.memory``
  (bytes, rounded up to whole MiB as the slice's request policy does) or
  ``capacity.requests.shares`` (hundredths of a GPU: a portion), and optionally
  ``capacity.requests.compute``, a compute share's request (``300m``: 0.3 of the GPU's time,
  at most the portion; placement keeps the requests on a GPU within 1, docs/compute-share.md);
- class ``mig.tessera.io``: one MIG partition of the profile its one selector names
  (``device.attributes["gpu.tessera.io"].profile == "3g.20gb"``), placed like a pod annotated
  ``tessera.io/gpu-mig-profile`` (:func:`claims_mig_profile`; docs/mig.md), allocated as the
  device of the placement :func:`tessera.core.mig.choose` picks (:func:`mig_allocation_status`).

What tessera-scheduler does not allocate is refused with a reason naming the field (the pod
waits; nothing is half-allocated): another driver's class beside tessera's, ``firstAvailable``,
``allocationMode: All``, selectors, constraints, a config other than a compute limit, admin
access, more than one tessera request per pod. The one config taken is a compute limit (:mod:`tessera.core.compute_claim`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from lightkube.generic_resource import create_namespaced_resource

from tessera.core import compute
from tessera.core.compute_claim import compute_limit
from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_placement_name, parse_profile, placement_name
from tessera.core.model import GpuKind, GpuRequest, compute_units
from tessera.core.state import Placement
from tessera.core.units import parse_memory

DRIVER = "gpu.tessera.io"
WHOLE_CLASS = "gpu.tessera.io"
SHARE_CLASS = "share.gpu.tessera.io"
MIG_CLASS = "mig.tessera.io"
CLASSES = frozenset({WHOLE_CLASS, SHARE_CLASS, MIG_CLASS})
PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
"""kube-scheduler puts it on every claim before it allocates it (kube-controller-manager
removes it after deallocating); tessera-scheduler does not."""
_PROFILE_SELECTOR = re.compile(
    r"""device\.attributes\[\s*["']gpu\.tessera\.io["']\s*\]\.profile\s*==\s*["']([^"']*)["']""")
_PROFILE_EXAMPLE = 'device.attributes["gpu.tessera.io"].profile == "3g.20gb"'
MiB = 2**20
SHARES = 100
_UNSUPPORTED = ("selectors", "adminAccess", "tolerations")

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")


def tessera_request(claim: Mapping[str, Any]) -> str | None:
    """The name of the claim's request for a tessera class, if it has one."""
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if (req.get("exactly") or {}).get("deviceClassName") in CLASSES:
            return str(req.get("name", ""))
    return None


def pod_claims_request(claims: Sequence[Mapping[str, Any] | None], names: Sequence[str],
                       pod_uid: str) -> GpuRequest:
    """The GPU request of a pod naming ``names`` (claims as read, None where missing);
    InvalidRequest when it cannot be placed by tessera: a claim missing, one of another
    driver only. Whether the pod allocates its claim or joins an allocation is
    :func:`claim_use`."""
    for name, claim in zip(names, claims, strict=True):
        if claim is None:
            raise InvalidRequest(f"resourceclaim {name}", "not found (create it before the pod "
                                 "can be placed)")
    present = [c for c in claims if c is not None]
    gpu = claim_gpu_request(present)
    if gpu is None:
        raise InvalidRequest(f"resourceclaim {names[0]}",
                             f"names no {DRIVER} device class; tessera-scheduler allocates only "
                             f"{', '.join(sorted(CLASSES))}")
    return gpu


def claim_use(claim: Mapping[str, Any], pod_uid: str, live: set[str],
              claimant: str | None) -> tuple[str, str]:
    """How a pending pod uses its tessera claim: ``("allocate", "")``, ``("join", NODE)`` (the
    claim is allocated and reserved for other live pods: this pod goes to its node, is added to
    ``reservedFor`` and charged nothing more), or ``("wait", REASON)``. ``live``: UIDs of the
    pods not finished; ``claimant``: the pod that is allocating the claim now (bound, being
    bound, or first in line), None when none is."""
    name = (claim.get("metadata") or {}).get("name", "?")
    st = claim.get("status") or {}
    if st.get("allocation") and ours_mig(claim):
        if any(r.get("uid") in live for r in reserved_for(claim) if r.get("uid") != pod_uid):
            return "wait", (f"resourceclaim {name}: its MIG partition is held by another pod; "
                            "tessera-scheduler gives a mig.tessera.io claim to one pod at a "
                            "time")
        if any(r.get("uid") != pod_uid for r in reserved_for(claim)):
            return "wait", (f"resourceclaim {name}: being deallocated (the pods it was "
                            "reserved for are gone)")
        return "allocate", ""  # reserved for this pod alone: a binding that did not finish
    if st.get("allocation"):
        if not ours(claim):
            return "wait", (f"resourceclaim {name}: allocated by another scheduler (not by "
                            "tessera-scheduler); tessera places only pods of claims it "
                            "allocates")
        others = [r for r in reserved_for(claim) if r.get("uid") != pod_uid]
        if any(r.get("uid") in live for r in others):
            placement = allocated_placement(claim)
            assert placement is not None
            return "join", placement.node
        if others:
            return "wait", (f"resourceclaim {name}: being deallocated (the pods it was "
                            "reserved for are gone)")
        return "allocate", ""  # reserved for this pod alone: a binding that did not finish
    if claimant is not None:
        return "wait", (f"resourceclaim {name}: being allocated for pod {claimant}; this pod "
                        "shares it once it is")
    return "allocate", ""


def _field(claim: Mapping[str, Any], rest: str) -> str:
    name = (claim.get("metadata") or {}).get("name", "?")
    return f"resourceclaim {name}: {rest}"


def _round_mib(nbytes: int) -> int:
    return -(-nbytes // MiB) * MiB


def claim_gpu_request(claims: Sequence[Mapping[str, Any]]) -> GpuRequest | None:
    """The GPU request of a pod's ResourceClaims; None when none names a tessera class.
    Raises InvalidRequest naming the claim and field."""
    found: list[tuple[Mapping[str, Any], int, Mapping[str, Any]]] = []
    foreign: list[str] = []
    for claim in claims:
        devices = (claim.get("spec") or {}).get("devices") or {}
        for i, req in enumerate(devices.get("requests") or []):
            if "firstAvailable" in req:
                classes = {s.get("deviceClassName") for s in req["firstAvailable"] or []}
                if classes & CLASSES:
                    raise InvalidRequest(_field(claim, f"spec.devices.requests[{i}].firstAvailable"),
                                         "is not allocated by tessera-scheduler yet; give "
                                         "exactly")
                foreign += sorted(c for c in classes if c)
                continue
            exactly = req.get("exactly") or {}
            cls = exactly.get("deviceClassName", "")
            if cls in CLASSES:
                found.append((claim, i, req))
            else:
                foreign.append(cls)
        if found and devices.get("constraints"):
            raise InvalidRequest(_field(claim, "spec.devices.constraints"),
                                 "is not supported for gpu.tessera.io claims yet")
    if not found:
        return None
    if foreign:
        raise InvalidRequest(_field(found[0][0], "spec.devices.requests"),
                             f"mixes {DRIVER} device classes with {', '.join(foreign)} of "
                             "another driver: tessera-scheduler allocates only "
                             f"{DRIVER}; put the other devices in a pod of their own")
    if len(found) > 1:
        raise InvalidRequest(_field(found[1][0], "spec.devices.requests"),
                             "one gpu.tessera.io request per pod (several share sizes on one "
                             "pod are not placed yet)")
    claim, i, req = found[0]
    if req["exactly"]["deviceClassName"] == MIG_CLASS:
        _mig_profile(claim, i, req)
        compute_limit(claim, None)  # a config (a compute limit) is refused: MIG is not gated
        return GpuRequest.none()  # the profile's fraction: claims_mig_profile
    gpu = _request(claim, i, req)
    compute_limit(claim, gpu.compute)  # the only config taken: a compute limit, checked
    return gpu


def claims_mig_profile(claims: Sequence[Mapping[str, Any]]) -> str | None:
    """The MIG profile a pod's claims ask for (class mig.tessera.io), canonical; None when they
    ask for none. Raises InvalidRequest as :func:`claim_gpu_request` does."""
    for claim in claims:
        for i, req in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("requests")
                                or []):
            if (req.get("exactly") or {}).get("deviceClassName") == MIG_CLASS:
                return _mig_profile(claim, i, req)
    return None


def _mig_profile(claim: Mapping[str, Any], i: int, req: Mapping[str, Any]) -> str:
    exactly = req["exactly"]
    where = f"spec.devices.requests[{i}].exactly"
    for key in ("adminAccess", "tolerations", "capacity"):
        if exactly.get(key):
            raise InvalidRequest(_field(claim, f"{where}.{key}"),
                                 f"is not supported for {MIG_CLASS} claims yet")
    mode = exactly.get("allocationMode", "ExactCount")
    if mode != "ExactCount" or exactly.get("count", 1) != 1:
        raise InvalidRequest(_field(claim, f"{where}.count"),
                             f"tessera-scheduler allocates one {MIG_CLASS} partition per "
                             "request (ExactCount, count 1)", exactly.get("count", mode))
    exprs = [str(((s or {}).get("cel") or {}).get("expression") or "").strip()
             for s in exactly.get("selectors") or []]
    m = _PROFILE_SELECTOR.fullmatch(exprs[0]) if len(exprs) == 1 else None
    if m is None:
        raise InvalidRequest(_field(claim, f"{where}.selectors"),
                             f"tessera-scheduler needs exactly one CEL selector naming the "
                             f"profile, {_PROFILE_EXAMPLE}",
                             exprs[0] if len(exprs) == 1 else exprs)
    return parse_profile(m.group(1), _field(claim, f"{where}.selectors[0].cel.expression"))


def _request(claim: Mapping[str, Any], i: int, req: Mapping[str, Any]) -> GpuRequest:
    exactly = req["exactly"]
    where = f"spec.devices.requests[{i}].exactly"
    for key in _UNSUPPORTED:
        if exactly.get(key):
            raise InvalidRequest(_field(claim, f"{where}.{key}"),
                                 "is not supported for gpu.tessera.io claims yet")
    mode = exactly.get("allocationMode", "ExactCount")
    if mode != "ExactCount":
        raise InvalidRequest(_field(claim, f"{where}.allocationMode"),
                             "must be ExactCount for gpu.tessera.io (All is not allocated)", mode)
    count = exactly.get("count", 1)
    if type(count) is not int or count < 1:
        raise InvalidRequest(_field(claim, f"{where}.count"), "must be a whole number >= 1",
                             count)
    capacity = dict(((exactly.get("capacity") or {}).get("requests")) or {})
    if exactly["deviceClassName"] == WHOLE_CLASS:
        if capacity:
            raise InvalidRequest(_field(claim, f"{where}.capacity"),
                                 f"class {WHOLE_CLASS} gives whole GPUs; ask for part of one "
                                 f"with class {SHARE_CLASS}")
        return GpuRequest.whole(count)
    unknown = sorted(set(capacity) - {"memory", "shares", "compute"})
    if unknown:
        raise InvalidRequest(_field(claim, f"{where}.capacity.requests.{unknown[0]}"),
                             "is not a capacity of gpu.tessera.io devices (memory, shares, compute)")
    time = None
    if "compute" in capacity:
        time = compute.parse_quantity(capacity.pop("compute"),
                                      _field(claim, f"{where}.capacity.requests.compute"))
    if ("memory" in capacity) == ("shares" in capacity):
        raise InvalidRequest(_field(claim, f"{where}.capacity.requests"),
                             f"class {SHARE_CLASS} needs memory (a quantity, 5Gi) or shares "
                             "(hundredths of a GPU), one of them")
    if "memory" in capacity:
        nbytes = parse_memory(capacity["memory"], _field(claim, f"{where}.capacity.requests.memory"))
        return GpuRequest(GpuKind.MEMORY, devices=count, memory=_round_mib(nbytes), compute=time)
    field = _field(claim, f"{where}.capacity.requests.shares")
    text = str(capacity["shares"]).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= SHARES:
        raise InvalidRequest(field, f"must be a whole number of hundredths, 1 to {SHARES}",
                             capacity["shares"])
    portion = Decimal(int(text)) / SHARES
    if time is not None and time > portion:
        raise InvalidRequest(_field(claim, f"{where}.capacity.requests.compute"),
                             f"may not exceed the shares asked ({text} hundredths): placement reserves "
                             "a GPU's time by portion", str(time))
    return GpuRequest(GpuKind.PORTION, devices=count, portion=portion, compute=time)


def share_id(claim_uid: str, device: int) -> str:
    """Stable per claim and device, so a retried status write is the same write."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tessera:{claim_uid}:{device}"))


def allocation_status(claim: Mapping[str, Any], request_name: str, placement: Placement,
                      gpu: GpuRequest, pods: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``status`` of a claim allocated at ``placement``: one result per device with the memory
    and shares it consumes and its shareID, the node selector, and ``reservedFor`` the pods
    (name, uid) that use it."""
    uid = (claim.get("metadata") or {}).get("uid", "")
    results = []
    for dev, nbytes in zip(placement.devices, placement.request_bytes, strict=True):
        shares = SHARES if placement.exclusive else (
            int(gpu.portion * SHARES) if gpu.portion is not None else 0)
        results.append({"request": request_name, "driver": DRIVER, "pool": placement.node,
                        "device": f"gpu-{dev}", "shareID": share_id(uid, dev),
                        "consumedCapacity": {"memory": str(_round_mib(nbytes)),
                                             "shares": str(shares),
                                             **({"compute": f"{placement.compute // 1000}m"}
                                                if placement.compute else {})}})
    return {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [placement.node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": pod_uid}
                        for name, pod_uid in pods],
    }


def ours(claim: Mapping[str, Any]) -> bool:
    """Whether the claim holds an allocation tessera-scheduler made: every result's shareID is
    the one :func:`share_id` gives (kube-scheduler's allocations on tessera's slices are not)."""
    st = claim.get("status") or {}
    results = ((st.get("allocation") or {}).get("devices") or {}).get("results") or []
    if not results:
        return False
    uid = (claim.get("metadata") or {}).get("uid", "")
    for r in results:
        device = str(r.get("device", ""))
        if r.get("driver") != DRIVER or not device.startswith("gpu-") \
                or not device[4:].isdigit() or r.get("shareID") != share_id(uid, int(device[4:])):
            return False
    return True


def reserved_for(claim: Mapping[str, Any]) -> list[dict[str, str]]:
    """The pods the claim is reserved for, in order: ``{"resource", "name", "uid"}``."""
    return [dict(r) for r in (claim.get("status") or {}).get("reservedFor") or []
            if r.get("resource", "pods") == "pods"]


def allocated_placement(claim: Mapping[str, Any]) -> Placement | None:
    """Where an allocation tessera made holds its GPUs (node, devices, the memory consumed on
    each; whole GPUs exclusive), for charging it to the pod that now holds it; None when the
    claim holds none of tessera's."""
    if not ours(claim):
        return None
    results = claim["status"]["allocation"]["devices"]["results"]
    devices = tuple(int(str(r["device"])[4:]) for r in results)
    nbytes = tuple(_consumed(r) for r in results)
    exclusive = any((req.get("exactly") or {}).get("deviceClassName") == WHOLE_CLASS
                    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests")
                    or [])
    time = {compute_units(_consumed_compute(r)) for r in results}
    return Placement(str(results[0].get("pool", "")), devices=devices, request_bytes=nbytes,
                     limit_bytes=nbytes, exclusive=exclusive, compute=max(time, default=0))


def _consumed_compute(result: Mapping[str, Any]) -> Decimal | None:
    text = (result.get("consumedCapacity") or {}).get("compute")
    try:
        return compute.parse_quantity(text, "consumedCapacity.compute") if text else None
    except InvalidRequest:
        return None


def _consumed(result: Mapping[str, Any]) -> int:
    text = (result.get("consumedCapacity") or {}).get("memory")
    try:
        return parse_memory(text, "consumedCapacity.memory") if text else 0
    except InvalidRequest:
        return 0


def released(claim: Mapping[str, Any], live_pods: set[str]) -> bool:
    """Whether the claim holds an allocation tessera-scheduler made that no live pod uses any
    more: it can be deallocated. Allocations of others (kube-scheduler's, on tessera's slices)
    are never touched."""
    if ours(claim):
        return not ({r.get("uid") for r in reserved_for(claim)} & live_pods)
    # A MIG allocation of tessera's always names its pod: one reserved for no pod is another
    # allocator's in the middle of its binding, never deallocated here.
    refs = {r.get("uid") for r in reserved_for(claim)}
    return ours_mig(claim) and bool(refs) and not (refs & live_pods)


def mig_allocation_status(claim: Mapping[str, Any], request_name: str, node: str, gpu_index: int,
                          profile: str, start: int, pods: Sequence[tuple[str, str]]
                          ) -> dict[str, Any]:
    """``status`` of a mig.tessera.io claim allocated the placement ``start`` of ``profile`` on
    GPU ``gpu_index`` of ``node`` (the device tessera-node's slice offers for it; no shareID:
    a partition is not shared), the node selector and ``reservedFor`` the pods."""
    return {
        "allocation": {
            "devices": {"results": [{"request": request_name, "driver": DRIVER, "pool": node,
                                     "device": placement_name(gpu_index, profile, start)}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": pod_uid}
                        for name, pod_uid in pods],
    }


def mig_allocations(claim: Mapping[str, Any]) -> list[tuple[str, int, str, int]]:
    """The MIG placements a claim's allocation holds, whoever allocated it: (node, GPU index,
    profile, start) per result."""
    st = claim.get("status") or {}
    out = []
    for r in ((st.get("allocation") or {}).get("devices") or {}).get("results") or []:
        parsed = parse_placement_name(str(r.get("device", ""))) \
            if r.get("driver") == DRIVER else None
        if parsed is not None:
            out.append((str(r.get("pool", "")), *parsed))
    return out


def ours_mig(claim: Mapping[str, Any]) -> bool:
    """Whether the claim holds MIG partitions tessera-scheduler allocated: all its results are
    MIG devices of gpu.tessera.io and it lacks kube-scheduler's protection finalizer (which
    kube-scheduler adds before every allocation and kube-controller-manager removes when it
    deallocates; so a claim kube-scheduler allocated is never touched)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
               or {}).get("results") or []
    finalizers = (claim.get("metadata") or {}).get("finalizers") or []
    return bool(results) and len(mig_allocations(claim)) == len(results) \
        and PROTECTION_FINALIZER not in finalizers
