"""Names tessera uses on Kubernetes objects: API group, annotations, labels."""

from __future__ import annotations

from tessera.wire import (  # the names tessera-node reads or writes too: one copy, in wire
    AGENT_URL as AGENT_URL,
)
from tessera.wire import (
    CONFIGMAP as CONFIGMAP,
)
from tessera.wire import (
    GPU_CONFIG_KEY as GPU_CONFIG_KEY,
)
from tessera.wire import (
    GPU_UUID as GPU_UUID,
)
from tessera.wire import (
    MIG_PARTITION as MIG_PARTITION,
)
from tessera.wire import (
    MIG_SHARE as MIG_SHARE,
)
from tessera.wire import (
    NODE_GPU_HEADROOM as NODE_GPU_HEADROOM,
)
from tessera.wire import (
    NODE_GPU_INVENTORY as NODE_GPU_INVENTORY,
)
from tessera.wire import (
    NODE_GPU_UUIDS as NODE_GPU_UUIDS,
)
from tessera.wire import (
    NODE_READY as NODE_READY,
)
from tessera.wire import (
    NODE_READY_REASON as NODE_READY_REASON,
)
from tessera.wire import (
    PLACEMENT as PLACEMENT,
)
from tessera.wire import (
    POD_GROUP as POD_GROUP,
)
from tessera.wire import (
    PRIORITY_CLASS as PRIORITY_CLASS,
)
from tessera.wire import (
    PROJECT as PROJECT,
)
from tessera.wire import (
    RESERVATION_LABEL as RESERVATION_LABEL,
)

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
GANG = "tessera.io/gang"
"""Written by the webhook on a controller's pod: how its gang was decided, or why it has none
(``tessera describe`` shows it)."""
GANG_MIN_MEMBER = "tessera.io/gang-min-member"
"""On a pod (the webhook writes it from the pod's owners, docs/workloads.md) or a top owner (a
user's override): the gang's minimum when no PodGroup object names it."""
GANG_ANCHOR = "tessera.io/gang-anchor"
"""``"true"`` on a pod its gang cannot run without (a Ray head, a PyTorchJob's Master; the
webhook writes it, tessera.kube.podgrouper): ordered first among the gang's pods, so it is
placed first and never given back as an elastic pod."""
GANG_ANCHORS = "tessera.io/gang-anchors"
"""On every member of a gang that has anchors: how many (the webhook counts them from the
owner's spec). A gang none of whose pods runs waits while fewer of its pods carry
``tessera.io/gang-anchor`` (the anchor's pod does not exist yet), docs/workloads.md."""

# What the scheduler writes on a pod when it binds it (the source of truth on restart), and
# what tessera-node writes on Nodes and reservation pods: imported above from tessera.wire.

# Reservation pods (one per shared physical GPU) and per-pod ConfigMaps: only the scheduler's.
RESERVATION_NODE = "tessera.io/node"
RESERVATION_DEVICE = "tessera.io/device"
MANAGED_BY = "app.kubernetes.io/managed-by"
CONFIGMAP_POD = "tessera.io/pod"
