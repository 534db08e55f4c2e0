"""Sync step: tessera's record of a whole-GPU pod follows the GPUs the kubelet really gave it
(issue 27, item 8; docs/scheduling.md, "Device truth").

With the device plugin (``nvidia.com/gpu``) the kubelet's device manager, not tessera, picks which
of the node's free GPUs a pod gets: a 4-GPU pod planned on two NVLink pairs can get GPUs 3–6. The
pod's ``tessera.io/placement`` then names GPUs it does not hold, and the scheduler would give
the GPUs it does hold to someone else. This step reads what pod-resources ``List`` says each
whole-GPU pod on this node holds, and where it differs from the placement it rewrites the
placement's devices (request and limit follow their device) and ``tessera.io/gpu-uuids`` to the
GPUs the pod holds, and posts a ``GPUsReassigned`` Event saying both. The scheduler reads the
placement annotation, so its record follows at its next event. (Where tessera chooses the
devices, DRA, the allocation is what the kubelet prepares; nothing to follow.)"""

from __future__ import annotations

import asyncio
import logging

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from tessera import wire
from tessera.core.state import Placement
from tessera.node.podresources.client import PodResourcesError, gpus_by_pod, list_devices
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")


def followed(placement: Placement, held: list[int]) -> Placement:
    """``placement`` on the devices the pod holds, in the order the kubelet gave them (the
    container's visible order); whole GPUs hold the same bytes on each."""
    return Placement(placement.node, devices=tuple(held),
                     request_bytes=placement.request_bytes, limit_bytes=placement.limit_bytes,
                     exclusive=placement.exclusive, cpu_milli=placement.cpu_milli,
                     memory=placement.memory, models=placement.models, gpus=placement.gpus)


class WholeGpuTruth(SyncStep):
    name = "whole-gpu-truth"

    def __init__(self) -> None:
        self.corrected = 0

    async def sync(self, node: NodeContext) -> None:
        if node.inventory is None:
            return
        pods = []
        for p in node.pods.values():
            raw = p.annotations.get(wire.PLACEMENT)
            if p.deleting or p.finished or not raw or p.labels.get(wire.RESERVATION_LABEL):
                continue
            try:
                placement = wire.placement_from_json(raw)
            except (ValueError, KeyError, TypeError):
                continue
            if placement.exclusive and placement.devices:
                pods.append((p, placement))
        if not pods:
            return
        try:
            assigned = gpus_by_pod(await asyncio.to_thread(list_devices,
                                                           node.opts.pod_resources_socket))
        except PodResourcesError as exc:
            log.warning("%s", exc)
            return
        index = {g.uuid: g.index for g in node.inventory.gpus}
        index.update({str(g.index): g.index for g in node.inventory.gpus})
        uuid = {g.index: g.uuid for g in node.inventory.gpus}
        for p, placement in pods:
            ids = assigned.get((p.namespace, p.name))
            if not ids:
                continue  # not admitted yet
            held = [index[i] for i in ids if i in index]
            if len(held) != len(placement.devices) or set(held) == set(placement.devices):
                continue
            now = followed(placement, held)
            annotations = {wire.PLACEMENT: wire.placement_to_json(now),
                           wire.POD_GPU_UUIDS: ",".join(uuid[d] for d in now.devices)}
            try:
                await node.client.patch(Pod, p.name, {"metadata": {"annotations": annotations}},
                                        namespace=p.namespace, patch_type=PatchType.MERGE)
            except ApiError as exc:
                if exc.status.code != 404:
                    log.warning("annotating %s/%s: %s", p.namespace, p.name, exc.status.message)
                continue
            p.annotations.update(annotations)
            self.corrected += 1
            msg = (f"the kubelet's device plugin gave GPU(s) "
                   f"{', '.join(map(str, now.devices))} where tessera planned "
                   f"{', '.join(map(str, placement.devices))}; tessera's record now follows")
            log.info("pod %s/%s: %s", p.namespace, p.name, msg)
            await node.events.pod(p.namespace, p.name, p.uid, "GPUsReassigned", msg,
                                  warning=False)
