"""tessera-node's sync steps on Kubernetes, registered in one place: :data:`STEPS`.

**Adding a node feature** = one new file here with a :class:`~tessera.node.sync.base.SyncStep`
subclass (its own state on itself; what it reads of the node, the pods and earlier steps'
results on the :class:`~tessera.node.sync.base.NodeContext` it is given; Events through
``node.events``), plus one line in :data:`STEPS` at the place in the order where what it reads
is ready. Nothing in :mod:`tessera.node.agent` changes. See docs/architecture.md.
"""

from __future__ import annotations

from tessera.node.sync.base import NodeContext, SyncStep
from tessera.node.sync.claim_shares import ClaimShares
from tessera.node.sync.compute_arbiters import ComputeArbitersStep
from tessera.node.sync.driver_limits import DriverLimits
from tessera.node.sync.gpu_uuids import ReportGpuUuids
from tessera.node.sync.mig_partitions import FollowMigModes, MigPartitions
from tessera.node.sync.node_annotations import PublishNode
from tessera.node.sync.share_files import ShareFiles
from tessera.node.sync.slices import ResourceSlices
from tessera.node.sync.usage import ObserveUsage
from tessera.node.sync.whole_gpus import WholeGpuTruth

STEPS: tuple[type[SyncStep], ...] = (
    FollowMigModes,   # MIG mode switched by the operator: the inventory read again
    MigPartitions,    # MIG pods' partitions made, their UUIDs into the pods' ConfigMaps
    PublishNode,      # inventory, readiness, headroom, partitions as Node annotations
    ResourceSlices,   # the DRA pool of this node (after the MIG sync: what is free to offer)
    ReportGpuUuids,   # reservation pods: which GPU the device plugin gave each
    WholeGpuTruth,    # whole-GPU pods: the placement follows the GPUs the kubelet gave them
    ComputeArbitersStep,  # compute shares' arbiter entries (before the files that name them)
    ShareFiles,       # share pods' isolation files (after the MIG sync: partitions' UUIDs)
    ClaimShares,      # DRA claims' containers join the shares (metrics, escapes, driver cap)
    DriverLimits,     # the driver's per-cgroup hard cap for those shares, where it has one
    ObserveUsage,     # usage, metrics, escapes, the loans reclaimer (over this sync's shares)
)
"""Run in this order at every sync."""

__all__ = ["STEPS", "NodeContext", "SyncStep"]
