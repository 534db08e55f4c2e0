"""Bind step: a MIG pod's partition (chosen when its binding started, ``MigHook.reserve``) is
named in its ConfigMap and in ``tessera.io/mig-partition``, which tessera-node makes real.

A pod whose profile comes from its ResourceClaim gets its partition as the claim's allocation
instead (tessera.kube.bind.claim_allocation). If the binding fails, the choice is dropped with
the assumption (``InFlight.bind_failed``); the ConfigMap is the janitor's.
"""

from __future__ import annotations

from tessera import wire
from tessera.kube import names
from tessera.kube.bind.base import BindContext, BindStep
from tessera.kube.bind.served_share import served_request
from tessera.kube.hooks.mig import MigHook
from tessera.kube.parts import Parts


class MigPartition(BindStep):
    name = "mig-partition"

    def __init__(self, parts: Parts, mig: MigHook) -> None:
        self.parts, self.mig = parts, mig

    def applies(self, ctx: BindContext) -> bool:
        pod = ctx.pod
        return (pod.mig_profile is not None and not pod.mig_claim) or \
            served_request(self.parts, self.mig, ctx) is not None

    async def pre_bind(self, ctx: BindContext) -> None:
        mig = self.parts.inflight.mig.get(ctx.key)
        if mig is None or mig.node != ctx.placement.node:
            raise RuntimeError("no MIG partition was chosen for it")
        ctx.partition = mig
        ctx.configmap = {wire.MIG_PROFILE_KEY: mig.hold.profile, wire.MIG_GPU_KEY: mig.hold.gpu,
                         wire.NODE_KEY: ctx.placement.node}
        ctx.annotations[names.MIG_PARTITION] = mig.hold.to_json()
