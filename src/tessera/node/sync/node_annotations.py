"""Sync step: the node's inventory, readiness, headroom, usage URL and MIG partitions as Node
annotations, and the GPU labels it lacks (:mod:`tessera.node.publish`); patched only when they
change."""

from __future__ import annotations

import logging
from typing import Any

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tessera.node import publish
from tessera.node.sync.base import NodeContext, SyncStep

log = logging.getLogger("tessera.node")


class PublishNode(SyncStep):
    name = "node"

    def __init__(self) -> None:
        self.published: dict[str, str] | None = None
        """What was last patched on the Node (None: patch at the next sync)."""

    def failed(self) -> None:
        self.published = None

    async def sync(self, node: NodeContext) -> None:
        ann = publish.node_annotations(node.inventory, node.ready, node.reason, node.headroom,
                                       node.opts.advertise_url, node.mig.parts)
        labels: dict[str, str] = {}
        if node.inventory is not None:
            obj = await node.client.get(Node, node.opts.node_name)
            present = dict((obj.metadata.labels if obj.metadata else None) or {})
            labels = publish.missing_labels(node.inventory, present)
        want = {**ann, **{f"label:{k}": v for k, v in labels.items()}}
        if want == self.published:
            return
        patch: dict[str, Any] = {"metadata": {"annotations": ann}}
        if labels:
            patch["metadata"]["labels"] = labels
        await node.client.patch(Node, node.opts.node_name, patch, patch_type=PatchType.MERGE)
        self.published = want
        if node.observer is not None:
            node.observer.collector.ready = node.ready
        log.info("node %s: ready=%s%s", node.opts.node_name, node.ready,
                 f" ({node.reason})" if not node.ready else "")
