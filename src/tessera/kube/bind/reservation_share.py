"""Bind step: a share of a GPU is held by a reservation pod on that device (tessera.kube.
reservations), whose GPU UUID the kubelet's device plugin reports; the UUIDs and memory go
into the pod's ConfigMap and ``tessera.io/gpu-uuids``.

A claim's share needs no reservation pod: its allocation holds the GPU, and on a DRA node there
is no nvidia.com/gpu for a reservation to take. A reservation pod no pod uses is deleted by the
janitor, so nothing is rolled back here.
"""

from __future__ import annotations

from tessera.kube import names
from tessera.kube.bind.base import Abandon, BindContext, BindStep
from tessera.kube.parts import Parts


class ReservationShare(BindStep):
    name = "reservation-share"

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def applies(self, ctx: BindContext) -> bool:
        pl = ctx.placement
        return (ctx.partition is None and bool(pl.devices) and not pl.exclusive
                and not ctx.pod.claim_names)

    async def pre_bind(self, ctx: BindContext) -> None:
        parts, node = self.parts, ctx.placement.node
        uuids = [await parts.reservations.reserve(node, d) for d in ctx.placement.devices]
        ni = parts.caches.nodes.items.get(node)
        if ni is None or ni.node is None:
            raise RuntimeError(f"node {node} went away")
        memory = [ni.node.gpus[d].memory for d in ctx.placement.devices]
        pod = parts.pods.get(ctx.key)  # the UUID may take a while: read the pod again
        if pod is None or pod.node:
            raise Abandon
        ctx.pod = pod
        ctx.configmap = parts.writer.configmap_data(ctx.placement, uuids, memory)
        ctx.annotations[names.NODE_GPU_UUIDS] = ",".join(uuids)
