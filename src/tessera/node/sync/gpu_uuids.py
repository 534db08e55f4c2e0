"""Sync step: reservation pods on this node without ``tessera.io/gpu-uuid`` get the UUID of the
GPU the device plugin gave them, as the kubelet's pod-resources ``List`` says."""

from __future__ import annotations

import asyncio
import logging

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from tessera import wire
from tessera.node.podresources.client import PodResourcesError, gpus_by_pod, list_devices
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")


class ReportGpuUuids(SyncStep):
    name = "gpu-uuids"

    def __init__(self) -> None:
        self.written = 0

    async def sync(self, node: NodeContext) -> None:
        pending = [p for p in node.pods.values()
                   if p.labels.get(wire.RESERVATION_LABEL) == "true" and not p.deleting
                   and not p.annotations.get(wire.GPU_UUID)]
        if not pending or node.inventory is None:
            return
        try:
            devices = await asyncio.to_thread(list_devices, node.opts.pod_resources_socket)
        except PodResourcesError as exc:
            log.warning("%s", exc)
            return
        assigned = gpus_by_pod(devices)
        by_index = {str(g.index): g.uuid for g in node.inventory.gpus}
        known = {g.uuid for g in node.inventory.gpus}
        for p in pending:
            ids = assigned.get((p.namespace, p.name))
            if not ids:
                continue  # the kubelet has not admitted it yet
            device_id = ids[0]
            uuid = device_id if device_id in known else by_index.get(device_id)
            if uuid is None:
                await node.events.pod(p.namespace, p.name, p.uid, "UnknownGPU",
                                      f"the device plugin gave device {device_id!r}, which NVML "
                                      f"on node {node.opts.node_name} does not list")
                continue
            try:
                await node.client.patch(
                    Pod, p.name, {"metadata": {"annotations": {wire.GPU_UUID: uuid}}},
                    namespace=p.namespace, patch_type=PatchType.MERGE)
                p.annotations[wire.GPU_UUID] = uuid
                self.written += 1
                log.info("reservation pod %s/%s holds %s", p.namespace, p.name, uuid)
            except ApiError as exc:
                if exc.status.code != 404:
                    log.warning("annotating %s/%s: %s", p.namespace, p.name, exc.status.message)
