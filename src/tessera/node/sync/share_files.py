"""Sync step: share pods on this node get their isolation files (:mod:`tessera.node.containers`);
a pod naming a GPU this node does not have, or files that cannot be written, get an Event and no
files (the container cannot start: the hostPath mounts are ``type: Directory``). The files of
pods that are gone are removed."""

from __future__ import annotations

import logging
from pathlib import Path

from tessera import wire
from tessera.core.errors import InvalidRequest
from tessera.core.podgroups import share_group
from tessera.node import containers as files
from tessera.node.agent_options import PodView
from tessera.node.compute_arbiters import CONF_NAME
from tessera.node.containers import Share, ShareDevice, ShareFilesError
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")


def share_of(pod: PodView, containers_dir: Path, mig_uuid: str | None = None) -> Share | None:
    """The share a pod holds on this node, from what the scheduler and the webhook wrote on it;
    None for pods without a GPU share. A share a MIG partition serves (``tessera.io/mig-share``)
    holds ``mig_uuid``, the partition made for it (None: not made yet). Raises ShareFilesError
    naming what is wrong."""
    key = pod.annotations.get(wire.GPU_CONFIG_KEY)
    text = pod.annotations.get(wire.PLACEMENT)
    if not key or not text:
        return None
    served = pod.annotations.get(wire.MIG_SHARE)
    try:
        placement = wire.placement_from_json(text)
        if served is not None and not placement.devices:
            if mig_uuid is None:
                return None
            share = wire.mig_share_from_json(served)
            request, limit, uuids = [share.request], [share.limit], [mig_uuid]
        elif placement.exclusive or not placement.devices:
            return None
        else:
            request = list(placement.request_bytes)
            limit = list(placement.limit_bytes)
            uuids = [u for u in pod.annotations.get(wire.POD_GPU_UUIDS, "").split(",") if u]
    except (ValueError, KeyError, TypeError) as exc:
        raise ShareFilesError(f"annotation {wire.PLACEMENT} or {wire.MIG_SHARE} is not readable: "
                              f"{exc}") from exc
    if len(uuids) != len(request):
        raise ShareFilesError(f"annotation {wire.POD_GPU_UUIDS} names {len(uuids)} GPU(s) for "
                              f"{len(request)} device(s) of the placement")
    files.check_key(key)
    prefix = str(containers_dir / key / "conf") + "/"
    names = sorted({v["hostPath"]["path"][len(prefix):] for v in pod.volumes
                    if isinstance(v.get("hostPath"), dict)
                    and str(v["hostPath"].get("path", "")).startswith(prefix)})
    containers = tuple(n for n in names if n and "/" not in n)
    groups = {share_group(pod.spec, c) for c in containers}
    return Share(key=key, namespace=pod.namespace, pod=pod.name, uid=pod.uid,
                 containers=containers,
                 group=groups.pop() if len(groups) == 1 else None,
                 devices=tuple(ShareDevice(u, r, lim) for u, r, lim in
                               zip(uuids, request, limit, strict=True)),
                 workload=pod.annotations.get(wire.POD_GROUP) or pod.labels.get(wire.POD_GROUP) or pod.name,
                 project=pod.annotations.get(wire.PROJECT) or pod.labels.get(wire.PROJECT, ""),
                 priority_class=pod.annotations.get(wire.PRIORITY_CLASS, ""))


def context_overhead(node: NodeContext, share: Share) -> int:
    """What the library charges per CUDA context in this share: its GPUs' headroom."""
    by_uuid = {h.uuid: h.bytes for h in node.headroom.values()}
    return max((by_uuid.get(d.uuid, 0) for d in share.devices), default=0)


class ShareFiles(SyncStep):
    name = "share-files"

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        """Pod UID -> the problem last logged for it (pods that are gone are dropped)."""

    async def sync(self, node: NodeContext) -> None:
        opts = node.opts
        shares: dict[str, Share] = {}
        known = {g.uuid for g in node.inventory.gpus} if node.inventory else set()
        known |= {str(part["uuid"]) for parts in node.mig.parts.values() for part in parts
                  if part.get("uuid")}  # partitions serving shares (docs/mig.md)
        for p in list(node.pods.values()):
            if p.deleting:
                continue
            try:
                share = share_of(p, opts.containers_host_dir, node.mig.written.get(p.uid))
                if share is None:
                    continue
                missing = [d.uuid for d in share.devices if d.uuid not in known]
                if missing:
                    raise ShareFilesError(
                        f"its GPU(s) {', '.join(missing)} are not on node {opts.node_name} "
                        f"(NVML lists {', '.join(sorted(known)) or 'none'}); not started uncapped")
                if not node.ready:
                    raise ShareFilesError(f"node {opts.node_name} is not ready for GPU "
                                          f"shares: {node.reason}")
                if share.key in node.compute_errors:  # fail closed: never started ungated
                    raise ShareFilesError(node.compute_errors[share.key])
                conf = node.compute_conf.get(share.key)
                files.write_share(opts.containers_dir, share, context_overhead(node, share),
                                  loans_dir=opts.loans_dir,
                                  extra={CONF_NAME: conf} if conf is not None else None)
                shares[share.key] = share
                if self.errors.pop(p.uid, None) is not None:  # fixed: if it recurs, say so
                    node.events.forget(p.uid)
            except (ShareFilesError, InvalidRequest) as exc:
                msg = str(exc)
                if self.errors.get(p.uid) != msg:
                    self.errors[p.uid] = msg
                    log.warning("pod %s/%s: %s", p.namespace, p.name, msg)
                await node.events.pod(p.namespace, p.name, p.uid, "GPUIsolationFailed", msg)
        if node.listed:
            live = {p.uid for p in node.pods.values()}
            for uid in [u for u in self.errors if u not in live]:
                del self.errors[uid]
            keep = {p.annotations.get(wire.GPU_CONFIG_KEY, "") for p in node.pods.values()}
            for key in files.remove_stale(opts.containers_dir, keep):
                log.info("removed the isolation files of a pod that is gone (%s)", key)
        node.shares = shares
