"""Bind step: each tessera ResourceClaim's status (allocation and reservedFor this pod) is
written before the pod is bound, as kube-scheduler does; a retried write is the same write.

A claim already allocated and reserved for other live pods gets this pod appended to its
``reservedFor`` (a JSON patch append: pods joining at once do not conflict). A MIG claim's
allocation is the partition chosen when the binding started (``MigHook.reserve``), as the
device tessera-node's slice offers for it. An allocation whose pods are gone is released by
the janitor (``ClaimHook.collect``), so nothing is rolled back here.
"""

from __future__ import annotations

from typing import Any

from tessera.kube import claims as dra
from tessera.kube.bind.base import BindContext, BindStep
from tessera.kube.objects import PodInfo
from tessera.kube.parts import Parts


class ClaimAllocation(BindStep):
    name = "claim-allocation"

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def applies(self, ctx: BindContext) -> bool:
        return bool(ctx.pod.claim_names)

    async def pre_bind(self, ctx: BindContext) -> None:
        pod, placement, writer = ctx.pod, ctx.placement, self.parts.writer
        for name in pod.claim_names:
            claim = self.parts.caches.resource_claims.items.get((pod.namespace, name))
            if claim is None:
                raise RuntimeError(f"resourceclaim {name} went away")
            request = dra.tessera_request(claim)
            if request is None or pod.request is None:
                continue
            live = ({p.uid for p in self.parts.caches.pods.items.values() if not p.finished}
                    if (claim.get("status") or {}).get("allocation") else set())
            use, node = dra.claim_use(claim, pod.uid, live, None)
            if use == "join":
                if node != placement.node:
                    raise RuntimeError(f"resourceclaim {name} is allocated on {node}, not "
                                       f"{placement.node}")
                if any(r.get("uid") == pod.uid for r in dra.reserved_for(claim)):
                    continue
                await writer.claim_status_ops(pod.namespace, name, [
                    {"op": "add", "path": "/status/reservedFor/-",
                     "value": {"resource": "pods", "name": pod.name, "uid": pod.uid}}])
                continue
            if use == "wait":
                raise RuntimeError(f"resourceclaim {name}: {node}")
            if dra.claims_mig_profile([claim]) is not None:
                status = self._mig_status(pod, claim, request, placement.node)
            else:
                status = dra.allocation_status(claim, request, placement, pod.request.gpu,
                                               [(pod.name, pod.uid)])
            await writer.claim_status(pod.namespace, name, status)

    def _mig_status(self, pod: PodInfo, claim: dict[str, Any], request: str, node: str
                    ) -> dict[str, Any]:
        mig = self.parts.inflight.mig.get(pod.key)
        if mig is None or mig.node != node:
            raise RuntimeError("no MIG partition was chosen for it")
        ni = self.parts.caches.nodes.items.get(node)
        index = next((g.index for g in (ni.mig if ni else ()) if g.uuid == mig.hold.gpu), None)
        if index is None:
            raise RuntimeError(f"GPU {mig.hold.gpu} is no longer in MIG mode on {node}")
        return dra.mig_allocation_status(claim, request, node, index, mig.hold.profile,
                                         mig.hold.start, [(pod.name, pod.uid)])
