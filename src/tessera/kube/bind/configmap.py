"""Bind step: the pod's ConfigMap (its container's environment: the GPU, its limits), gathered
by the steps before, is written before the binding (the container reads it at start). One with
no pod bound to it is deleted by the janitor, so nothing is rolled back here."""

from __future__ import annotations

from tessera.kube import names
from tessera.kube.bind.base import BindContext, BindStep
from tessera.kube.parts import Parts


class ConfigMapWrite(BindStep):
    name = "configmap"

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def applies(self, ctx: BindContext) -> bool:
        return ctx.configmap is not None

    async def pre_bind(self, ctx: BindContext) -> None:
        assert ctx.configmap is not None
        ctx.annotations[names.CONFIGMAP] = await self.parts.writer.write_configmap(
            ctx.pod, ctx.configmap)
