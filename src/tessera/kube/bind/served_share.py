"""Bind step: a share a MIG partition serves (docs/mig.md) gets its limits beside the MIG keys.

Its container's isolation library reads the share's limit on the whole GPU, at most the
partition's memory, which holds its request (MIG caps the rest in hardware); tessera-node reads
the same numbers from the ``tessera.io/mig-share`` annotation.
"""

from __future__ import annotations

from tessera import wire
from tessera.core.gpu_models import GPU_MODELS
from tessera.core.mig import MEMORY_MIB
from tessera.core.model import GpuRequest
from tessera.kube import names
from tessera.kube.bind.base import BindContext, BindStep
from tessera.kube.hooks.mig import MigHook
from tessera.kube.mig import MigHold
from tessera.kube.parts import Parts
from tessera.wire import MigShare


def served_request(parts: Parts, mig: MigHook, ctx: BindContext) -> GpuRequest | None:
    """The share a partition serves for this pod, if it is one: a partition was chosen for it,
    it waited as a share (``MigHook.serving``), and asks for no profile or claim itself."""
    pod = ctx.pod
    if (parts.inflight.mig.get(ctx.key) is None or pod.claim_names
            or names.MIG_PROFILE in pod.annotations):
        return None
    return mig.serving.get(ctx.key)


def served_data(parts: Parts, node: str, hold: MigHold, share: GpuRequest) -> dict[str, str]:
    """ConfigMap keys of a share a partition serves, beside the MIG ones."""
    ni = parts.caches.nodes.items.get(node)
    model = next((g.model for g in (ni.mig if ni is not None else ()) if g.uuid == hold.gpu),
                 "")
    sizes = MEMORY_MIB.get(model, {})
    part = sizes.get(hold.profile, 0) * 2**20
    whole = (GPU_MODELS[model].memory_mib if model in GPU_MODELS
             else max(sizes.values(), default=0)) * 2**20
    limit = min(part, share.limit_bytes_on(whole))
    return {wire.MEMORY_LIMIT_KEY: str(limit),
            wire.MEMORY_REQUEST_KEY: str(min(part, share.bytes_on(whole))),
            wire.MIG_SERVES_SHARE_KEY: "true", wire.ISOLATION_KEY: "on"}


class ServedShare(BindStep):
    """Runs after MigPartition; nothing to roll back (the ConfigMap is the janitor's)."""

    name = "served-share"

    def __init__(self, parts: Parts, mig: MigHook) -> None:
        self.parts, self.mig = parts, mig

    def applies(self, ctx: BindContext) -> bool:
        return ctx.partition is not None and served_request(self.parts, self.mig, ctx) is not None

    async def pre_bind(self, ctx: BindContext) -> None:
        share = served_request(self.parts, self.mig, ctx)
        assert share is not None and ctx.partition is not None and ctx.configmap is not None
        hold = ctx.partition.hold
        data = served_data(self.parts, ctx.placement.node, hold, share)
        ctx.configmap.update(data)
        ctx.annotations[names.MIG_SHARE] = MigShare(
            int(data[wire.MEMORY_REQUEST_KEY]), int(data[wire.MEMORY_LIMIT_KEY])).to_json()
        ctx.how = f" (served by MIG {hold.profile} on GPU {hold.gpu})"
