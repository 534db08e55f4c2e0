"""Sync step: DRA claims' containers join this sync's shares (issue 27, item 4), so they get the
same per-container metrics, escape detection and driver cap as the annotation path's.

The kubelet says which container holds which prepared device (pod-resources ``List``,
``dynamic_resources``); the claim's CDI device name carries its UID
(``gpu.tessera.io/claim=<uid>-<device>``), and the config tessera-node's plugin wrote when it
prepared the claim gives each GPU's limit (a claim is guaranteed what it consumed: request =
limit). One share per claim (key ``claim-<uid>``; its region is the claim's), named after the
first pod using it, with every container of that pod that holds it. MIG claims have no config
of limits here (the partition is the cap) and are left out."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from tessera import wire
from tessera.node.containers import CLAIM_KEY_PREFIX, Share, ShareDevice
from tessera.node.podresources.client import PodResourcesError, list_claim_devices
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")
DRIVER = "gpu.tessera.io"
_DEVICE_LINE = re.compile(r"^device index=\d+ uuid=(GPU-\S+) request=\d+ limit=(\d+)", re.M)
_UID = re.compile(r"claim=([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-")


def claim_limits(containers_dir: Path, claim_uid: str) -> dict[str, int]:
    """GPU UUID -> limit of a prepared claim, from the config its plugin wrote."""
    conf = containers_dir / "claims" / claim_uid / "conf" / "gpu-isolation.conf"
    try:
        text = conf.read_text()
    except OSError:
        return {}
    return {m.group(1): int(m.group(2)) for m in _DEVICE_LINE.finditer(text)}


def uses_claims(spec: dict[str, Any]) -> bool:
    return any(((c or {}).get("resources") or {}).get("claims")
               for c in spec.get("containers") or [])


class ClaimShares(SyncStep):
    name = "claim-shares"

    async def sync(self, node: NodeContext) -> None:
        if node.inventory is None or not any(uses_claims(p.spec) for p in node.pods.values()):
            return  # no pod-resources call while no pod on the node uses a claim
        try:
            devices = await asyncio.to_thread(list_claim_devices, node.opts.pod_resources_socket)
        except PodResourcesError as exc:
            log.debug("%s", exc)
            return
        pods = {(p.namespace, p.name): p for p in node.pods.values()
                if not p.deleting and not p.finished}
        found: dict[str, Share] = {}
        for d in devices:
            p = pods.get((d.namespace, d.pod))
            if d.driver != DRIVER or p is None:
                continue
            for cdi in d.cdi_devices:
                m = _UID.search(cdi)
                if m is None:
                    continue
                key = CLAIM_KEY_PREFIX + m.group(1)
                share = found.get(key)
                if share is not None:
                    if share.uid == p.uid and d.container not in share.containers:
                        found[key] = dataclasses.replace(
                            share, containers=(*share.containers, d.container))
                    continue
                limits = claim_limits(node.opts.containers_dir, m.group(1))
                if not limits:
                    continue
                found[key] = Share(
                    key=key, namespace=p.namespace, pod=p.name, uid=p.uid,
                    containers=(d.container,),
                    devices=tuple(ShareDevice(u, lim, lim) for u, lim in limits.items()),
                    workload=(p.annotations.get(wire.POD_GROUP) or p.labels.get(wire.POD_GROUP)
                              or p.name),
                    project=p.annotations.get(wire.PROJECT) or p.labels.get(wire.PROJECT, ""))
        node.shares.update(found)
