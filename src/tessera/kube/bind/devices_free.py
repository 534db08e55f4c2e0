"""Bind step: a whole-GPU pod is bound only once the GPUs it was placed on are really free on
the node (issue 27, item 8).

After a consolidation or an eviction the plan gives a pod GPUs that pods being deleted still hold
(a reservation pod, a share pod still stopping): the kubelet's device manager counts those
devices as taken until the pods are gone, so a pod bound 4–5 s early is rejected at admission
(``UnexpectedAdmissionError``) and lost. The step waits, reading the pod view again every
``poll`` seconds, until no other pod on the node that has not finished holds one of those
devices (its reservation or its placement), for at most the scheduler's ``uuid_timeout``; past
it the binding fails naming the holders (back-off, one FailedBinding Event), and the pod is
placed again. DRA claims (the allocation itself says which devices are free) and MIG partitions
(the agent makes them) do not need it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from tessera.kube.bind.base import Abandon, BindContext, BindStep
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.parts import Parts

DONE = ("Succeeded", "Failed")


def holders(pods: Iterable[tuple[PodKey, PodInfo]], me: PodKey, node: str,
            devices: set[int]) -> list[PodInfo]:
    """The other pods on ``node`` that have not finished and hold one of ``devices``."""
    out = []
    for key, p in pods:
        if key == me or p.node != node or p.phase in DONE:
            continue
        held: set[int] = set()
        if p.reservation is not None and p.reservation[0] == node:
            held.add(p.reservation[1])
        if p.placement is not None and p.placement.node == node:
            held.update(p.placement.devices)
        if held & devices:
            out.append(p)
    return out


class DevicesFree(BindStep):
    name = "devices-free"

    def __init__(self, parts: Parts, poll: float = 0.1) -> None:
        self.parts, self.poll = parts, poll

    def applies(self, ctx: BindContext) -> bool:
        pl = ctx.placement
        return (pl.exclusive and bool(pl.devices) and ctx.partition is None
                and not ctx.pod.claim_names)

    async def pre_bind(self, ctx: BindContext) -> None:
        node, devices = ctx.placement.node, set(ctx.placement.devices)
        deadline = time.monotonic() + self.parts.opts.uuid_timeout
        while True:
            pod = self.parts.pods.get(ctx.key)
            if pod is None or pod.node:
                raise Abandon
            held = holders(self.parts.pods.on_node(node), ctx.key, node, devices)
            if not held:
                ctx.pod = pod
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{p.namespace}/{p.name}"
                                  + (" (terminating)" if p.deleting else "") for p in held)
                raise RuntimeError(
                    f"GPU(s) {', '.join(map(str, sorted(devices)))} of node {node} are still "
                    f"held by {names} after {self.parts.opts.uuid_timeout:.0f} s; not bound "
                    "before the kubelet could admit it")
            await asyncio.sleep(self.poll)
