"""Sync step: reservation pods on this node without ``tessera.io/gpu-uuid`` get the UUID of the
GPU the device plugin gave them, as the kubelet's pod-resources ``List`` says.

The scheduler holds a shared pod's binding (and a whole gang's) until its reservation pod's UUID
is reported, so this step is *urgent*: the agent runs it the moment its watch sees a reservation
pod without a UUID, not after the rest of the sync (share files, usage, slices), which on a busy
node took seconds per reservation (docs/benchmarks.md, the 64-pod half-GPU gang)."""

from __future__ import annotations

import asyncio
import logging

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from tessera import wire
from tessera.node.agent_options import PodView
from tessera.node.podresources.client import PodResourcesError, gpus_by_pod, list_devices
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")


def _pending(p: PodView) -> bool:
    return (p.labels.get(wire.RESERVATION_LABEL) == "true" and not p.deleting
            and not p.annotations.get(wire.GPU_UUID))


class ReportGpuUuids(SyncStep):
    name = "gpu-uuids"

    def __init__(self) -> None:
        self.written = 0
        self.reported: dict[str, str] = {}
        """Reservation pod uid -> the device written for it (a watch event older than the
        write shows the pod without it: not written twice)."""
        self._lock = asyncio.Lock()
        """Run both from the sync and urgently: one at a time (the second sees the first's
        writes and has nothing left to do)."""

    def urgent(self, pod: PodView) -> bool:
        return _pending(pod)

    async def sync(self, node: NodeContext) -> None:
        async with self._lock:
            await self._report(node)

    async def _report(self, node: NodeContext) -> None:
        live = {p.uid for p in node.pods.values()}
        self.reported = {uid: d for uid, d in self.reported.items() if uid in live}
        pending = [p for p in node.pods.values() if _pending(p)]
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
        writes = []
        for p in pending:
            ids = assigned.get((p.namespace, p.name))
            if not ids or self.reported.get(p.uid) == ids[0]:
                continue  # the kubelet has not admitted it yet / written already
            device_id = ids[0]
            uuid = device_id if device_id in known else by_index.get(device_id)
            if uuid is None:
                await node.events.pod(p.namespace, p.name, p.uid, "UnknownGPU",
                                      f"the device plugin gave device {device_id!r}, which NVML "
                                      f"on node {node.opts.node_name} does not list")
                continue
            writes.append(self._write(node, p, device_id, uuid))
        # All at once: written one after the other they took 100-250 ms each on a loaded
        # machine, and a gang's binding waits for the last (docs/benchmarks.md).
        await asyncio.gather(*writes)

    async def _write(self, node: NodeContext, p: PodView, device_id: str, uuid: str) -> None:
        try:
            await node.client.patch(
                Pod, p.name, {"metadata": {"annotations": {wire.GPU_UUID: uuid}}},
                namespace=p.namespace, patch_type=PatchType.MERGE)
            p.annotations[wire.GPU_UUID] = uuid
            self.reported[p.uid] = device_id
            self.written += 1
            log.info("reservation pod %s/%s holds %s", p.namespace, p.name, uuid)
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("annotating %s/%s: %s", p.namespace, p.name, exc.status.message)

    def failed(self) -> None:
        self.reported.clear()
