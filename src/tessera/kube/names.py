"""Names tessera uses on Kubernetes objects: API group, annotations, labels."""

from __future__ import annotations

GROUP = "tessera.io"
VERSION = "v1alpha1"
SCHEDULER_NAME = "tessera"
SYSTEM_NAMESPACE = "tessera-system"
COMPONENT = "tessera-scheduler"
LEASE_NAME = "tessera-scheduler"

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""The GPU operator's MIG resources (``nvidia.com/mig-3g.20gb``, mixed strategy): placed like any
extended resource a node advertises (docs/mig.md)."""

# What users (or the admission webhook) write on a pod.
MIG_PROFILE = "tessera.io/gpu-mig-profile"
"""A MIG partition of this profile, made on demand on a GPU in MIG mode (docs/mig.md)."""
GPU_PORTION = "tessera.io/gpu-portion"
GPU_MEMORY = "tessera.io/gpu-memory"
GPU_DEVICES = "tessera.io/gpu-devices"
GPU_PORTION_LIMIT = "tessera.io/gpu-portion-limit"
GPU_MEMORY_LIMIT = "tessera.io/gpu-memory-limit"
GPU_MODEL = "tessera.io/gpu-model"
POD_GROUP = "tessera.io/pod-group"
PRIORITY_CLASS = "tessera.io/priority-class"
PROJECT = "tessera.io/project"
AGENT_URL = "tessera.io/node-agent-url"
"""On a Node: where its tessera-node serves /usage (tessera.node.publish writes it)."""

# What the scheduler writes on a pod when it binds it (the source of truth on restart).
PLACEMENT = "tessera.io/placement"
CONFIGMAP = "tessera.io/gpu-configmap"
MIG_SHARE = "tessera.io/mig-share"
"""On a share a MIG partition serves (docs/mig.md), written at bind: JSON ``{"request": bytes,
"limit": bytes}``, what tessera-node writes in its isolation files with the partition's UUID."""
MIG_PARTITION = "tessera.io/mig-partition"
"""On a MIG pod, written at bind: JSON ``{"gpu": UUID, "profile", "start", "remove": [starts]}``,
the partition tessera-node makes (or reuses) for it, after removing the idle ones at ``remove``."""

# Reservation pods (one per shared physical GPU) and per-pod ConfigMaps.
RESERVATION_LABEL = "tessera.io/gpu-reservation"
RESERVATION_NODE = "tessera.io/node"
RESERVATION_DEVICE = "tessera.io/device"
GPU_UUID = "tessera.io/gpu-uuid"
"""Annotation on a reservation pod: the UUID of the GPU it holds (written by the node agent,
from the kubelet pod-resources API; the kubelet double serves that API on kwok nodes)."""
NODE_GPU_UUIDS = "tessera.io/gpu-uuids"
NODE_GPU_HEADROOM = "tessera.io/gpu-headroom"
NODE_GPU_INVENTORY = "tessera.io/gpu-inventory"
"""tessera-node's inventory (JSON); the scheduler reads its NVLink links."""
"""Bytes tessera-node keeps back per GPU (device-index order); absent: the model's default."""
GPU_CONFIG_KEY = "tessera.io/gpu-config-key"
"""Annotation on a share pod, drawn by the admission webhook (16 hex digits): the host directory
tessera-node writes the pod's isolation files into (``/var/lib/tessera/containers/KEY``)."""
NODE_READY = "tessera.io/node-ready"
"""Annotation on a Node, written by tessera-node: ``"true"`` when it can enforce GPU shares there.
A GPU node without it gets nothing new from the scheduler (tessera.kube.snapshot)."""
NODE_READY_REASON = "tessera.io/node-ready-reason"
MANAGED_BY = "app.kubernetes.io/managed-by"
CONFIGMAP_POD = "tessera.io/pod"
