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
- ``allowMultipleAllocations: true``: several claims may hold one GPU, each with its own share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lightkube.generic_resource import create_global_resource

from tessera.core import nvlink
from tessera.core.errors import InvalidRequest
from tessera.core.units import parse_memory
from tessera.node.headroom import DeviceHeadroom
from tessera.node.nvml import Inventory

DRIVER = "gpu.tessera.io"
API_VERSION = "resource.k8s.io/v1"
MiB = 2**20
SHARES = 100
"""The ``shares`` capacity of every GPU: a portion is a number of hundredths."""

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
