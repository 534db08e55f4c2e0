"""Sync step: usage (NVML and the shares' regions) for the metrics, escape detection
(``--on-escape warn|kill``) and the node plugin (loan reclaimer), by
:class:`tessera.node.observe.Observer`, the part embedded mode's agent shares."""

from __future__ import annotations

from tessera.node.sync.base import NodeContext, SyncStep


class ObserveUsage(SyncStep):
    name = "usage"

    async def sync(self, node: NodeContext) -> None:
        observer = node.observer
        if observer is None:
            return
        observer.inventory = node.inventory
        observer.nvml = node.nvml
        node.usage = observer.observe(node.shares)
