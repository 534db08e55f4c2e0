"""Sync step: the MIG partitions the annotation path's pods on this node asked for
(:mod:`tessera.node.kube_mig`, docs/mig.md), and each made partition's UUID written into its
pod's ConfigMap. Also follows the operator switching MIG mode under a running agent."""

from __future__ import annotations

import logging
import time

from lightkube import ApiError
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from tessera import wire
from tessera.node.kube_mig import KubeMig, Outcome, Want, partitions_doc, want_of
from tessera.node.mig import MigError
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")

MIG_JOURNAL = "mig-journal.json"
"""In the containers directory (on the host, so it outlives the agent's pod)."""


def start_mig(node: NodeContext) -> None:
    """Partitions of MIG pods, once some GPU is in MIG mode (tessera.node.kube_mig)."""
    if node.inventory is not None and node.nvml is not None and node.mig.kube is None \
            and any(g.mig_enabled for g in node.inventory.gpus):
        try:
            node.mig.kube = KubeMig(node.nvml, node.opts.containers_dir / MIG_JOURNAL)
            for line in node.mig.kube.repairs:
                log.info("MIG journal: %s", line)
        except (MigError, OSError) as exc:
            log.warning("MIG partitions unavailable on this node: %s", exc)


class FollowMigModes(SyncStep):
    """MIG mode is the operator's (tessera never switches it); when it changes under a running
    agent, the inventory is read again, so the node's annotations (and the scheduler) stop
    offering a GPU in MIG mode for shares and start offering its profiles, or the other way
    round, without restarting tessera-node."""

    name = "mig-modes"

    async def sync(self, node: NodeContext) -> None:
        if node.inventory is None or node.nvml is None:
            return
        try:
            modes = node.nvml.mig_modes()
        except Exception as exc:
            log.warning("reading MIG modes failed: %r", exc)
            return
        before = tuple(g.mig_enabled for g in node.inventory.gpus)
        if modes == before:
            return
        for g, now in zip(node.inventory.gpus, modes, strict=False):
            if g.mig_enabled != now:
                log.info("GPU %d (%s): MIG mode is now %s (an operator's change); inventory "
                         "read again", g.index, g.uuid, "on" if now else "off")
        node.inventory = node.nvml.inventory()
        start_mig(node)


class MigPartitions(SyncStep):
    name = "mig-partitions"

    def __init__(self) -> None:
        self.failing: dict[str, tuple[int, float]] = {}
        """Pod UID -> (failed attempts in a row, no new attempt before): 1 s doubling to 60 s."""

    async def sync(self, node: NodeContext) -> None:
        mig = node.mig
        if mig.kube is None or not node.listed:
            return
        wants: list[Want] = []
        for p in list(node.pods.values()):
            if p.finished:
                continue
            try:
                w = want_of(p.namespace, p.name, p.uid, p.annotations)
            except MigError as exc:
                await node.events.pod(p.namespace, p.name, p.uid, "MIGPartitionFailed", str(exc))
                continue
            if w is not None:
                wants.append(w)
        try:
            now = time.monotonic()
            outcomes = mig.kube.sync(wants, frozenset(
                u for u, (_, until) in self.failing.items() if until > now))
            mig.states = mig.kube.state()
            mig.wants = wants
            mig.parts = partitions_doc(mig.states)
        except Exception as exc:  # NVML failing now: the rest of the sync goes on
            log.warning("MIG partitions not synced: %r", exc)
            return
        live = {w.uid for w in wants}
        for table in (mig.written, self.failing):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        for o in outcomes:
            await self._outcome(node, o)

    async def _outcome(self, node: NodeContext, o: Outcome) -> None:
        w = o.want
        if o.uuid is None:
            count = self.failing.get(w.uid, (0, 0.0))[0] + 1
            self.failing[w.uid] = (count, time.monotonic() + min(60.0, 2.0 ** (count - 1)))
            log.warning("pod %s/%s: MIG %s: %s", w.namespace, w.name, w.profile, o.error)
            await node.events.pod(w.namespace, w.name, w.uid, "MIGPartitionFailed",
                                  f"MIG {w.profile} on GPU {w.gpu} at memory slot {w.start}: "
                                  f"{o.error}")
            return
        self.failing.pop(w.uid, None)
        if node.mig.written.get(w.uid) == o.uuid:
            return
        pod = node.pods.get((w.namespace, w.name))
        cm = pod.annotations.get(wire.CONFIGMAP) if pod is not None else None
        if not cm:
            return
        try:
            await node.client.patch(ConfigMap, cm, {"data": {
                wire.VISIBLE_DEVICES_KEY: o.uuid, wire.MIG_UUID_KEY: o.uuid}},
                namespace=w.namespace, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning("ConfigMap %s/%s of MIG pod %s: %s", w.namespace, cm, w.name,
                        exc.status.message)
            return
        node.mig.written[w.uid] = o.uuid
        log.info("pod %s/%s: MIG %s %s", w.namespace, w.name, w.profile, o.uuid)
