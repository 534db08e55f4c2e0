"""Sync step: this node's ResourceSlices (:mod:`tessera.node.resourceslice`, docs/dra.md), and
the node as the DRA kubelet plugin prepares claims on it (:func:`plugin_config`)."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Node

from tessera.core.mig import PROFILES
from tessera.node import resourceslice as dra
from tessera.node.draplugin.cdi import PluginConfig
from tessera.node.kube_mig import claim_of
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")

SLICE_RETRY_SECONDS = 30
CLAIMS_SUBDIR = "claims"
"""Under the containers directory: the isolation files of prepared claims (by claim UID; the
share directories beside them are 16 hex digits, so neither side removes the other's)."""


def mig_offers(node: NodeContext) -> list[dra.MigOffer]:
    """This node's GPUs in MIG mode as the slice offers their partitions: every placement NVML
    lists except those overlapping a partition tessera did not make, one a pod of the annotation
    path holds, or one such a pod was bound to and is still to be made."""
    if node.mig.states is None or node.inventory is None:
        return []
    names = {g.uuid: g.name for g in node.inventory.gpus}
    out = []
    for st in node.mig.states:
        if not st.mig_enabled or st.model not in PROFILES:
            continue
        table = PROFILES[st.model]
        blocked = [(p.start, p.size) for p in st.partitions
                   if not p.managed or (p.owner is not None and not claim_of(p.owner))]
        blocked += [(w.start, table[w.profile].slots) for w in node.mig.wants
                    if w.gpu == st.uuid and w.profile in table]
        out.append(dra.MigOffer(
            st.index, st.uuid, st.model, names.get(st.uuid, st.model),
            {p.name: p.placements for p in st.profiles},
            {p.name: p.memory_mib for p in st.profiles}, tuple(sorted(set(blocked)))))
    return out


def plugin_config(node: NodeContext, cdi_dir: Path) -> PluginConfig:
    """The node as the kubelet plugin prepares claims on it (tessera.node.draplugin): the GPUs
    NVML lists, the headroom, the directories; ``not_ready`` while shares cannot be enforced
    here."""
    opts = node.opts
    gpus = node.inventory.gpus if node.inventory is not None else []
    return PluginConfig(
        node=opts.node_name, uuids={g.index: g.uuid for g in gpus}, cdi_dir=cdi_dir,
        library_dir=opts.library_dir, library_mount=opts.library_mount,
        claims_dir=opts.containers_dir / CLAIMS_SUBDIR,
        claims_host_dir=opts.containers_host_dir / CLAIMS_SUBDIR,
        loans_host_dir=opts.loans_dir,  # the chart mounts it at its host path
        headroom={h.uuid: h.bytes for h in node.headroom.values()},
        not_ready="" if node.ready else (node.reason or "starting"), mig=node.mig.kube,
        memory={g.uuid: g.memory_total for g in gpus})


class ResourceSlices(SyncStep):
    name = "resource-slices"

    def __init__(self) -> None:
        self.digest: str | None = None
        """Digest of the devices last written to this node's ResourceSlice ("" when it was
        deleted; None before the first sync)."""
        self.writes = 0
        self.error = ""
        self.retry_at = 0.0

    async def sync(self, node: NodeContext) -> None:
        if time.monotonic() < self.retry_at:
            return
        try:
            await self.publish(node)
            self.error = ""
        except (ApiError, OSError, ValueError) as exc:
            # No DRA API (an older cluster), RBAC without resourceslices, a slice the API
            # server refuses: shares by annotation still work, so this never stops the sync.
            msg = str(getattr(getattr(exc, "status", None), "message", "") or exc)
            if msg != self.error:
                log.warning("ResourceSlice for node %s not written (retried every %d s): "
                            "%s", node.opts.node_name, SLICE_RETRY_SECONDS, msg)
            self.error = msg
            self.retry_at = time.monotonic() + SLICE_RETRY_SECONDS

    async def publish(self, node: NodeContext) -> None:
        """Keeps this node's pool of driver gpu.tessera.io: the GPUs' slice, and for GPUs in
        MIG mode the counters' slice and the MIG devices' slices. Written when their content
        changes (every slice of the pool again, with the pool's generation one up), deleted
        while the node is not ready (nothing would enforce a share allocated here); slices of
        this driver for this node under other names are removed (an older agent's). No write
        when nothing changed."""
        opts, client = node.opts, node.client
        if node.mig.kube is not None and node.mig.states is None:
            return  # the first MIG sync says which placements are free to offer
        inventory = node.inventory if node.ready and opts.dra_slices else None
        if inventory is not None and not opts.dra_registered():
            return  # until the kubelet registers the plugin: nothing new, nothing withdrawn
        specs = dra.pool_specs(inventory, node.headroom, mig_offers(node)) if inventory else {}
        digest = dra.pool_digest(specs) if specs else ""
        if digest == self.digest:
            return
        base = dra.slice_name(opts.node_name)
        wanted = {base + suffix: suffix for suffix in specs}
        current: dict[str, Any] = {}
        async for obj in client.list(dra.ResourceSlice,
                                     fields={"spec.nodeName": opts.node_name,
                                             "spec.driver": dra.DRIVER}):
            other = (obj.metadata.name if obj.metadata else None) or ""
            if other in wanted:
                current[other] = obj
            elif other:
                with contextlib.suppress(ApiError):
                    await client.delete(dra.ResourceSlice, other)
                log.info("removed ResourceSlice %s (%s)", other,
                         "not this agent's name" if not other.startswith(base)
                         else "no longer in the pool")
        if not specs:
            for name in current:
                with contextlib.suppress(ApiError):
                    await client.delete(dra.ResourceSlice, name)
                log.info("removed ResourceSlice %s: node not ready for GPU shares", name)
            self.digest = ""
            return
        have = {}
        generations = set()
        for name, obj in current.items():
            spec = obj.spec or {}
            key = "sharedCounters" if "sharedCounters" in specs[wanted[name]] else "devices"
            have[wanted[name]] = {key: spec.get(key) or []}
            pool = spec.get("pool") or {}
            generations.add((int(pool.get("generation", 0)), int(pool.get("resourceSliceCount", 0))))
        if len(current) == len(specs) and len(generations) == 1 \
                and next(iter(generations))[1] == len(specs) and dra.pool_digest(have) == digest:
            self.digest = digest  # a restarted agent: the pool is already right
            return
        obj = await client.get(Node, opts.node_name)
        uid = (obj.metadata.uid if obj.metadata else None) or ""
        generation = max((g for g, _ in generations), default=0) + 1
        for want in dra.pool_slices(opts.node_name, uid, specs, generation):
            old = current.get(want["metadata"]["name"])
            if old is None:
                await client.create(codecs.from_dict(want))
            else:
                want["metadata"]["resourceVersion"] = old.metadata.resourceVersion
                await client.replace(codecs.from_dict(want))
        self.digest = digest
        self.writes += 1
        mig = sum(len(s.get("devices") or []) for k, s in specs.items() if k.startswith("-mig-"))
        log.info("ResourceSlice %s: %d GPU(s)%s, pool generation %d", base,
                 len(specs[""]["devices"]),
                 f", {mig} MIG placement(s) in {len(specs) - 1} more slice(s)" if mig else "",
                 generation)
