"""What the agent writes on its Node: the inventory, GFD-compatible labels, readiness.

Pure functions (inventory in, annotations and labels out); :mod:`tessera.node.kube` sends them.

Annotations (always written, the agent owns them):

- ``tessera.io/gpu-uuids``: UUIDs in device-index order (what the scheduler reads today);
- ``tessera.io/gpu-inventory``: JSON, driver and CUDA version, per GPU index, UUID, name, model,
  memory, MIG mode, compute capability, and on a GPU in MIG mode its partitions (profile,
  memory slot, ``MIG-…`` UUID, made by tessera or not); the topology between devices;
- ``tessera.io/gpu-headroom``: bytes kept back per GPU for the driver and CUDA contexts, in
  device-index order (measured here, else the model's default); the scheduler's capacity per
  device is its memory less this;
- ``tessera.io/node-ready``: ``"true"`` when the agent can enforce shares here (NVML read, the
  isolation library installed, the config directory writable), else ``"false"``;
- ``tessera.io/node-ready-reason``: one line saying why not (empty when ready);
- ``tessera.io/node-agent-url``: where the agent serves ``/metrics`` and ``/usage``
  (:mod:`tessera.node.report`), for the API server's console; written with the rest, so only
  when it changes (never per sync: a Node write wakes every Node informer in the cluster).

Labels in the names NVIDIA's GPU feature discovery uses, written only where absent (GFD, when it
runs, stays the authority): ``nvidia.com/gpu.present``, ``gpu.product``, ``gpu.memory`` (MiB),
``gpu.count``, ``gpu.compute.major|minor``, ``cuda.driver.major|minor|rev``,
``cuda.runtime.major|minor``, ``mig.capable`` is not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tessera import wire
from tessera.node.headroom import DeviceHeadroom
from tessera.node.nvml import Inventory

GPU_UUIDS = wire.NODE_GPU_UUIDS
GPU_HEADROOM = wire.NODE_GPU_HEADROOM
INVENTORY = wire.NODE_GPU_INVENTORY
READY = wire.NODE_READY
READY_REASON = wire.NODE_READY_REASON
AGENT_URL = wire.AGENT_URL


def inventory_json(inv: Inventory, headroom: Mapping[int, DeviceHeadroom] | None = None,
                   mig: Mapping[str, list[dict[str, Any]]] | None = None) -> str:
    """``mig``: GPU UUID -> the partitions on it (GPUs in MIG mode; tessera.node.kube_mig)."""
    room = headroom or {}
    parts = mig or {}
    return json.dumps({
        "driver": inv.driver_version,
        "cuda": inv.cuda_version,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "model": g.model,
                  "memory": g.memory_total, "mig": g.mig_enabled,
                  "compute": ".".join(map(str, g.compute_capability))
                  if g.compute_capability else None,
                  **({"headroom": room[g.index].bytes, "headroomSource": room[g.index].source}
                     if g.index in room else {}),
                  **({"partitions": parts[g.uuid]} if g.uuid in parts else {})}
                 for g in inv.gpus],
        "links": [{"a": link.a, "b": link.b, "ancestor": link.ancestor, "nvlink": link.nvlink}
                  for link in inv.links],
    }, separators=(",", ":"))


def node_annotations(inv: Inventory | None, ready: bool, reason: str,
                     headroom: Mapping[int, DeviceHeadroom] | None = None,
                     agent_url: str = "",
                     mig: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, str]:
    out = {READY: "true" if ready else "false", READY_REASON: "" if ready else reason}
    if agent_url:
        out[AGENT_URL] = agent_url
    if inv is not None:
        out[GPU_UUIDS] = ",".join(g.uuid for g in inv.gpus)
        out[INVENTORY] = inventory_json(inv, headroom, mig)
        if headroom and all(g.index in headroom for g in inv.gpus):
            out[GPU_HEADROOM] = ",".join(str(headroom[g.index].bytes) for g in inv.gpus)
    return out


def gfd_labels(inv: Inventory) -> dict[str, str]:
    """Labels GPU feature discovery would write, from the first GPU (GFD labels a node by its
    first GPU's model too)."""
    if not inv.gpus:
        return {}
    g = inv.gpus[0]
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": g.name.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(g.memory_total // 2**20),
        "nvidia.com/gpu.count": str(len(inv.gpus)),
    }
    if g.compute_capability:
        labels["nvidia.com/gpu.compute.major"] = str(g.compute_capability[0])
        labels["nvidia.com/gpu.compute.minor"] = str(g.compute_capability[1])
    parts = inv.driver_version.split(".")
    for key, value in zip(("major", "minor", "rev"), parts, strict=False):
        if value.isdigit():
            labels[f"nvidia.com/cuda.driver.{key}"] = value
    if inv.cuda_version:
        major, _, minor = inv.cuda_version.partition(".")
        labels["nvidia.com/cuda.runtime.major"] = major
        labels["nvidia.com/cuda.runtime.minor"] = minor
    return labels


def missing_labels(inv: Inventory, present: Mapping[str, str]) -> dict[str, str]:
    """The GFD labels this node lacks (never overwrites one that is there)."""
    return {k: v for k, v in gfd_labels(inv).items() if k not in present}
