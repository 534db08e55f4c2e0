"""Sync step: the driver's own hard cap for each share, where the driver has one (issue 27,
item 5; docs/isolation.md, "Driver-native limits").

On a driver of branch r615 or later (NVML's per-cgroup memory limits, :mod:`tessera.node.memlimits`)
every pod holding a share of a whole GPU gets a hard limit on that GPU for its pod cgroup: the
share's limit, which is what the isolation library enforces too (both count the context and every
allocation, so the pod gets the same room either way). The driver's cap holds whatever the
process does to its loader or environment; the library stays for charging, ``cuMemGetInfo``,
loans and drivers before r615. Shares are this sync's: the annotation path's (ShareFiles) and the
DRA claims' the kubelet reports per container (ClaimShares). A limit is removed once
its pod no longer holds the share; a pod whose cgroup the node does not show yet is tried again
at the next sync. MIG partitions are not covered by the API (the partition is the cap)."""

from __future__ import annotations

import logging
from pathlib import Path

from tessera.node import memlimits
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")

Wanted = dict[tuple[Path, str], int]
"""(pod cgroup, GPU UUID) -> hard limit in bytes."""


class DriverLimits(SyncStep):
    name = "driver-limits"

    def __init__(self, cgroup_root: Path = memlimits.CGROUP_ROOT) -> None:
        self.cgroup_root = cgroup_root
        self.supported: bool | None = None
        """Whether the node's driver has per-cgroup limits (None: not asked yet)."""
        self.applied: Wanted = {}

    @property
    def path(self) -> str:
        """Which path holds a share's hard cap on this node, in words (logged, in docs)."""
        return ("driver (NVML per-cgroup limits) + preload library" if self.supported
                else "preload library")

    async def sync(self, node: NodeContext) -> None:
        if node.nvml is None or node.inventory is None:
            return
        if self.supported is None:
            self.supported = any(memlimits.supported(node.nvml.handle(g.index))
                                 for g in node.inventory.gpus)
            log.info("GPU memory hard cap on this node: %s", self.path)
        if not self.supported:
            return
        handles = {g.uuid: node.nvml.handle(g.index) for g in node.inventory.gpus}
        wanted = self.wanted(node, set(handles))
        for (cgroup, uuid), hard in wanted.items():
            if self.applied.get((cgroup, uuid)) == hard:
                continue
            try:
                memlimits.set_hard(handles[uuid], cgroup, hard)
                self.applied[(cgroup, uuid)] = hard
                log.info("driver limit set: cgroup %s on %s, hard %d bytes", cgroup, uuid, hard)
            except memlimits.MemLimitError as exc:
                log.warning("driver limit for %s on %s not set: %s", cgroup, uuid, exc)
        for key in [k for k in self.applied if k not in wanted]:
            cgroup, uuid = key
            del self.applied[key]
            if cgroup.is_dir():  # a removed cgroup's limits go with it
                try:
                    memlimits.clear(handles[uuid], cgroup)
                except memlimits.MemLimitError as exc:
                    log.warning("driver limit for %s on %s not cleared: %s", cgroup, uuid, exc)

    def wanted(self, node: NodeContext, gpus: set[str]) -> Wanted:
        """This sync's shares (both paths: ClaimShares adds the DRA claims) on whole GPUs."""
        per_pod: dict[str, dict[str, int]] = {}
        for share in node.shares.values():
            for d in share.devices:
                if d.uuid in gpus:
                    per_pod.setdefault(share.uid, {})[d.uuid] = d.limit_bytes
        out: Wanted = {}
        for pod_uid, limits in per_pod.items():
            for cgroup in memlimits.pod_cgroups(pod_uid, self.cgroup_root):
                for uuid, limit in limits.items():
                    out[(cgroup, uuid)] = limit
        return out

    def failed(self) -> None:
        self.applied.clear()
