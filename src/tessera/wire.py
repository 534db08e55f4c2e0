"""The wire between tessera's processes on Kubernetes: what one writes and another reads.

The webhook and the scheduler write these on pods and ConfigMaps; tessera-node writes those on
Nodes and reservation pods and reads what the scheduler wrote; each side used to keep its own
copy of the names and of the JSON readers. Both ``tessera.kube`` and ``tessera.node`` import
this module (it imports only the core), so a name or a format changes in one place, and
``tests/architecture/test_wire.py`` checks that every codec reads back what it writes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from tessera.core.state import Placement

# ---- on pods: written by the webhook ------------------------------------------------------------
GPU_CONFIG_KEY = "tessera.io/gpu-config-key"
"""On a share pod, drawn by the admission webhook (16 hex digits): the host directory
tessera-node writes the pod's isolation files into (``/var/lib/tessera/containers/KEY``)."""
PROJECT = "tessera.io/project"
POD_GROUP = "tessera.io/pod-group"
PRIORITY_CLASS = "tessera.io/priority-class"

# ---- on pods: written by the scheduler when it binds (the source of truth on restart) ----------
PLACEMENT = "tessera.io/placement"
"""JSON of the core's Placement (``placement_to_json``)."""
POD_GPU_UUIDS = "tessera.io/gpu-uuids"
"""On a share pod: the UUIDs of its GPUs, comma-separated, in the placement's device order."""
CONFIGMAP = "tessera.io/gpu-configmap"
"""The pod's ConfigMap (its container's environment, ``CONFIGMAP_KEYS``)."""
MIG_PARTITION = "tessera.io/mig-partition"
"""On a MIG pod: JSON ``{"gpu": UUID, "profile", "start", "remove": [starts]}`` (``MigHold``),
the partition tessera-node makes (or reuses), after removing the idle ones at ``remove``."""
MIG_SHARE = "tessera.io/mig-share"
"""On a share a MIG partition serves (docs/mig.md): JSON ``{"request": bytes, "limit":
bytes}`` (``MigShare``), what tessera-node writes in its isolation files with the partition's
UUID."""

# ---- reservation pods: the scheduler labels them, tessera-node reports the GPU -----------------
RESERVATION_LABEL = "tessera.io/gpu-reservation"
GPU_UUID = "tessera.io/gpu-uuid"
"""On a reservation pod: the UUID of the GPU it holds (tessera-node, from the kubelet's
pod-resources API)."""

# ---- on Nodes: written by tessera-node, read by the scheduler and the API server ---------------
NODE_GPU_UUIDS = "tessera.io/gpu-uuids"
NODE_GPU_HEADROOM = "tessera.io/gpu-headroom"
"""Bytes tessera-node keeps back per GPU (device-index order); absent: the model's default."""
NODE_GPU_INVENTORY = "tessera.io/gpu-inventory"
"""tessera-node's inventory (JSON: GPUs, NVLink links, MIG partitions)."""
NODE_READY = "tessera.io/node-ready"
"""``"true"`` when tessera-node can enforce GPU shares there; a GPU node without it gets
nothing new from the scheduler."""
NODE_READY_REASON = "tessera.io/node-ready-reason"
AGENT_URL = "tessera.io/node-agent-url"
"""Where the node's tessera-node serves /usage."""

# ---- the pod's ConfigMap: its container's environment -------------------------------------------
# The scheduler writes it at bind; tessera-node adds a MIG partition's UUID once it is made. The
# keys are the isolation library's environment (docs/isolation.md); those both sides write:
VISIBLE_DEVICES_KEY = "NVIDIA_VISIBLE_DEVICES"
MIG_UUID_KEY = "TESSERA_MIG_UUID"
MEMORY_LIMIT_KEY = "TESSERA_GPU_MEMORY_LIMIT"
MEMORY_REQUEST_KEY = "TESSERA_GPU_MEMORY_REQUEST"
MIG_PROFILE_KEY = "TESSERA_MIG_PROFILE"
MIG_GPU_KEY = "TESSERA_MIG_GPU"
MIG_SERVES_SHARE_KEY = "TESSERA_MIG_SERVES_SHARE"
NODE_KEY = "TESSERA_NODE"
ISOLATION_KEY = "TESSERA_ISOLATION"


# ---- codecs -------------------------------------------------------------------------------------
def placement_to_json(p: Placement) -> str:
    return json.dumps({
        "node": p.node, "devices": list(p.devices), "request": list(p.request_bytes),
        "limit": list(p.limit_bytes), "exclusive": p.exclusive, "cpu": p.cpu_milli,
        "memory": p.memory, **({"gpus": p.gpus} if p.gpus is not None else {}),
        **({"compute": p.compute} if p.compute else {}),
    }, separators=(",", ":"))


def placement_from_json(text: str) -> Placement:
    """Raises ValueError/KeyError/TypeError on an unreadable annotation."""
    d = json.loads(text)
    return Placement(
        node=str(d["node"]), devices=tuple(int(x) for x in d["devices"]),
        request_bytes=tuple(int(x) for x in d["request"]),
        limit_bytes=tuple(int(x) for x in d["limit"]), exclusive=bool(d["exclusive"]),
        cpu_milli=int(d.get("cpu", 0)), memory=int(d.get("memory", 0)),
        gpus=None if d.get("gpus") is None else float(d["gpus"]),
        compute=int(d.get("compute", 0)),
    )


@dataclass(frozen=True, slots=True)
class MigHold:
    """The partition a MIG pod holds (``tessera.io/mig-partition``)."""

    gpu: str
    """The GPU's UUID."""
    profile: str
    start: int
    remove: tuple[int, ...] = ()
    """Memory slots of idle partitions tessera-node removes first."""

    def to_json(self) -> str:
        return json.dumps({"gpu": self.gpu, "profile": self.profile, "start": self.start,
                           "remove": list(self.remove)}, separators=(",", ":"))


def hold_from_json(text: str) -> MigHold:
    """Raises ValueError/KeyError/TypeError on an unreadable annotation."""
    d = json.loads(text)
    return MigHold(str(d["gpu"]), str(d["profile"]), int(d["start"]),
                   tuple(int(x) for x in d.get("remove") or ()))


@dataclass(frozen=True, slots=True)
class MigShare:
    """A share a MIG partition serves (``tessera.io/mig-share``): bytes it may hold."""

    request: int
    limit: int

    def to_json(self) -> str:
        return json.dumps({"request": self.request, "limit": self.limit},
                          separators=(",", ":"))


def mig_share_from_json(text: str) -> MigShare:
    """Raises ValueError/KeyError/TypeError on an unreadable annotation."""
    d = json.loads(text)
    return MigShare(int(d["request"]), int(d["limit"]))


# ---- Events ---------------------------------------------------------------------------------------
def event_body(*, kind: str, name: str, namespace: str, uid: str, reason: str, message: str,
               type_: str, component: str, instance: str, host: str | None = None,
               api_version: str = "v1") -> dict[str, Any]:
    """A core/v1 Event about one object, as every writer of tessera posts it (the scheduler, the
    API server, tessera-node): named after the object, the message cut at 1,000 characters."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name[:200]}.", "namespace": namespace or "default"},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name,
                           "namespace": namespace, "uid": uid},
        "reason": reason, "message": message[:1000], "type": type_,
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component, "reportingInstance": instance,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
