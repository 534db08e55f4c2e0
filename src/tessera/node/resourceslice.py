"""The node's ResourceSlice for DRA driver ``gpu.tessera.io`` (issue 19, docs/dra.md).

Pure: inventory in, the ``resource.k8s.io/v1`` ResourceSlice object out; the agent
(:mod:`tessera.node.agent`) writes it. One slice per node, named after the node, in a pool named
after the node (``resourceSliceCount: 1``); the pool's generation goes up whenever the devices
change, as the API requires of a driver that republishes.

Each GPU is one device ``gpu-<index>`` with

- attributes (the driver's own domain, so CEL sees ``device.attributes["gpu.tessera.io"].uuid``):
  ``uuid``, ``model`` (``A100-40GB``), ``productName``, ``index``, ``memory`` (bytes, NVML's
  total), ``nvlinkIsland`` (devices with the same number are joined by NVLink,
  :mod:`tessera.core.nvlink`), ``migEnabled``;
- consumable capacity ``memory``: the bytes a share may use (the GPU's memory less the headroom
  the scheduler keeps back for driver and contexts, rounded down to whole MiB) with request policy
  minimum and step 1 MiB; a request that does not name ``memory`` consumes all of it (a whole
  GPU);
- consumable capacity ``shares``: 100 (percent of the GPU, a Run:ai-style portion); a request that
  does not name it consumes none, so memory alone decides how many fit;
- consumable capacity ``compute``: 1 (the GPU's time; a compute share's request, ``300m`` =
  0.3, docs/compute-share.md); a request that does not name it consumes none;
- ``allowMultipleAllocations: true``: several claims may hold one GPU, each with its own share.

GPUs in MIG mode are offered as *partitionable devices* too (KEP-4815, ``DRAPartitionableDevices``,
beta in 1.36; docs/mig.md): per such GPU a counter set ``gpu-<index>-mig`` with one counter per
memory slot (``memory-slice-0`` .. ``memory-slice-7``, 1 each) and ``compute-slices`` (7), and one
device per (profile, placement) NVML lists, ``gpu-<index>-mig-<C>g<M>gb-<start>``, consuming the
slots it covers and its compute slices, so an allocator gives overlapping placements to one claim
at most. The counter sets are in a slice of their own (the API allows ``sharedCounters`` or
``devices`` in one slice, not both) and the MIG devices in slices of at most 64 devices (the
limit for devices that consume counters), all in the node's pool. Placements overlapping a
partition tessera did not make, or one the annotation path (``tessera.io/gpu-mig-profile`` pods)
holds or is about to make, are not offered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube.generic_resource import create_global_resource

from tessera.core import nvlink
from tessera.core.errors import InvalidRequest
from tessera.core.mig import COMPUTE, PROFILES, SLOTS, parse_placement_name, placement_name
from tessera.core.units import parse_memory
from tessera.node.headroom import DeviceHeadroom
from tessera.node.nvml import Inventory

DRIVER = "gpu.tessera.io"
API_VERSION = "resource.k8s.io/v1"
MiB = 2**20
SHARES = 100
"""The ``shares`` capacity of every GPU: a portion is a number of hundredths."""
MAX_COUNTER_DEVICES = 64
"""Devices per slice when they consume counters (kube-apiserver 1.36: ``spec.devices: Too
many: 72: must have at most 64 items``)."""
MAX_COUNTER_SETS = 8
"""Counter sets per slice (kube-apiserver 1.36: ``spec.sharedCounters: Too many: 9: must have
at most 8 items``)."""
COMPUTE_COUNTER = "compute-slices"

ResourceSlice = create_global_resource(group="resource.k8s.io", version="v1",
                                       kind="ResourceSlice", plural="resourceslices")
DeviceClass = create_global_resource(group="resource.k8s.io", version="v1",
                                     kind="DeviceClass", plural="deviceclasses")


def slice_name(node: str) -> str:
    """The slice's name: the node's (a DNS subdomain already) and the driver's."""
    return f"{node}-gpu.tessera.io"


def usable_memory(total: int, headroom: int) -> int:
    """What shares of this GPU may use, in whole MiB (the request policy's step)."""
    return max(0, (total - headroom) // MiB * MiB)


def devices(inv: Inventory, headroom: Mapping[int, DeviceHeadroom] | None = None
            ) -> list[dict[str, Any]]:
    """The slice's ``spec.devices``, one per GPU that is not in MIG mode."""
    room = headroom or {}
    islands = nvlink.islands(len(inv.gpus), [(link.a, link.b) for link in inv.links
                                             if link.nvlink])
    out: list[dict[str, Any]] = []
    for g, island in zip(inv.gpus, islands, strict=True):
        usable = usable_memory(g.memory_total, room[g.index].bytes if g.index in room else 0)
        if usable < 2 * MiB:
            continue  # validation needs min + step <= capacity; such a GPU has nothing to share
        out.append({
            "name": f"gpu-{g.index}",
            "attributes": {
                "uuid": {"string": g.uuid},
                "model": {"string": g.model},
                "productName": {"string": g.name[:64]},
                "index": {"int": g.index},
                "memory": {"int": g.memory_total},
                "nvlinkIsland": {"int": island},
                "migEnabled": {"bool": g.mig_enabled},
            },
            "capacity": {
                "memory": {"value": str(usable), "requestPolicy": {
                    "default": str(usable),
                    "validRange": {"min": str(MiB), "step": str(MiB)}}},
                "shares": {"value": str(SHARES), "requestPolicy": {
                    "default": "0", "validRange": {"min": "0", "step": "1"}}},
                "compute": {"value": "1", "requestPolicy": {
                    "default": "0", "validRange": {"min": "0", "step": "1m"}}},
            },
            "allowMultipleAllocations": True,
        })
    return out


def devices_digest(devs: list[dict[str, Any]]) -> str:
    """A digest of the devices with every quantity as a number of units: the API server
    re-spells quantities (``1048576`` may come back as ``1Mi``), so slices read back compare
    by value."""
    return hashlib.sha256(json.dumps(_canonical(devs), sort_keys=True).encode()).hexdigest()[:32]


def _canonical(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str) and key in ("value", "default", "min", "max", "step"):
        if value.strip() in ("0", "+0", "-0"):
            return 0
        try:
            return parse_memory(value, key)
        except InvalidRequest:
            return value
    return value


def resource_slice(node: str, node_uid: str, inv: Inventory,
                   headroom: Mapping[int, DeviceHeadroom] | None = None,
                   generation: int = 1) -> dict[str, Any]:
    """The whole object; owned by the Node so that deleting the Node deletes it (garbage
    collector)."""
    meta: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                    "uid": node_uid, "controller": True}]
    return {
        "apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices(inv, headroom)},
    }


# ---- MIG partitions as partitionable devices (KEP-4815) ------------------------------------

@dataclass(frozen=True)
class MigOffer:
    """A GPU in MIG mode as the slice offers it: what NVML says it can be cut into, and the
    memory slots that are not offered (partitions tessera did not make, partitions of the
    annotation path)."""

    index: int
    uuid: str
    model: str
    product: str
    placements: Mapping[str, tuple[tuple[int, int], ...]]
    """Profile -> (start, size) in memory slots, as NVML lists them."""
    memory_mib: Mapping[str, int]
    """Profile -> its memory (NVML's), MiB."""
    blocked: tuple[tuple[int, int], ...] = ()
    """(start, size) of the partitions whose slots are not offered."""


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-mig"


def slot_counter(slot: int) -> str:
    return f"memory-slice-{slot}"


mig_device_name = placement_name
parse_mig_device = parse_placement_name


def counter_sets(offers: Sequence[MigOffer]) -> list[dict[str, Any]]:
    """One counter set per GPU in MIG mode: each memory slot once, and its compute slices."""
    return [{"name": counter_set_name(o.index),
             "counters": {**{slot_counter(s): {"value": "1"} for s in range(SLOTS)},
                          COMPUTE_COUNTER: {"value": str(COMPUTE)}}}
            for o in offers]


def mig_devices(offer: MigOffer) -> list[dict[str, Any]]:
    """One device per (profile, placement) of a GPU in MIG mode that overlaps no blocked slot,
    for the profiles tessera knows on its model."""
    table = PROFILES.get(offer.model, {})
    out: list[dict[str, Any]] = []
    for profile in sorted(offer.placements, key=lambda n: (table[n].compute, table[n].slots)
                          if n in table else (99, 99)):
        prof = table.get(profile)
        if prof is None:
            continue  # +me and profiles tessera does not place
        for start, size in sorted(offer.placements[profile]):
            if any(b < start + size and start < b + bs for b, bs in offer.blocked):
                continue
            out.append({
                "name": mig_device_name(offer.index, profile, start),
                "attributes": {
                    "type": {"string": "mig"},
                    "profile": {"string": profile},
                    "placementStart": {"int": start},
                    "placementSize": {"int": size},
                    "parentUUID": {"string": offer.uuid},
                    "parentIndex": {"int": offer.index},
                    "model": {"string": offer.model},
                    "productName": {"string": offer.product[:64]},
                    "migEnabled": {"bool": True},
                },
                "capacity": {"memory": {"value": str(offer.memory_mib.get(profile, 0) * MiB)}},
                "consumesCounters": [{
                    "counterSet": counter_set_name(offer.index),
                    "counters": {**{slot_counter(s): {"value": "1"}
                                    for s in range(start, start + size)},
                                 COMPUTE_COUNTER: {"value": str(prof.compute)}}}],
            })
    return out


def pool_specs(inv: Inventory, headroom: Mapping[int, DeviceHeadroom] | None = None,
               offers: Sequence[MigOffer] = ()) -> dict[str, dict[str, Any]]:
    """The node's pool as slice name suffix -> the slice's content (``devices`` or
    ``sharedCounters``): ``""`` the GPUs as before; with GPUs in MIG mode also ``-counters-K``
    (at most 8 counter sets each) and ``-mig-K`` (a GPU's devices kept in one slice, at most 64
    devices per slice). Empty when there is nothing to publish."""
    whole = devices(inv, headroom)
    if not whole and not offers:
        return {}
    out: dict[str, dict[str, Any]] = {"": {"devices": whole}}
    sets = counter_sets(offers)
    for k in range(0, len(sets), MAX_COUNTER_SETS):
        out[f"-counters-{k // MAX_COUNTER_SETS}"] = {"sharedCounters": sets[k:k + MAX_COUNTER_SETS]}
    chunk: list[dict[str, Any]] = []
    for offer in offers:
        devs = mig_devices(offer)
        if chunk and len(chunk) + len(devs) > MAX_COUNTER_DEVICES:
            out[f"-mig-{sum(1 for k in out if k.startswith('-mig-'))}"] = {"devices": chunk}
            chunk = []
        chunk += devs  # one GPU has fewer placements than the limit
    if chunk:
        out[f"-mig-{sum(1 for k in out if k.startswith('-mig-'))}"] = {"devices": chunk}
    return out


def pool_digest(specs: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of the pool's slices compared by value (see :func:`devices_digest`)."""
    return devices_digest([{"suffix": k, **specs[k]} for k in sorted(specs)])


def pool_slices(node: str, node_uid: str, specs: Mapping[str, Mapping[str, Any]],
                generation: int = 1) -> list[dict[str, Any]]:
    """The pool's slice objects (all with one generation and the pool's slice count), each
    owned by the Node."""
    out = []
    for suffix in sorted(specs):
        meta: dict[str, Any] = {"name": slice_name(node) + suffix}
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                        "uid": node_uid, "controller": True}]
        spec: dict[str, Any] = {"driver": DRIVER, "nodeName": node,
                                "pool": {"name": node, "generation": generation,
                                         "resourceSliceCount": len(specs)},
                                **specs[suffix]}
        out.append({"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                    "spec": spec})
    return out
