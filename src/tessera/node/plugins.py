"""How a component plugs into the agent's sync loop (the loan reclaimer of issue #11 item 4).

A plugin is called once per sync with the node's current :class:`~tessera.node.usage.NodeUsage`
and the :class:`NodeActions` it may take. The agent loads ``tessera.node.reclaim`` when that
module exists and defines ``make_reclaimer(options: dict[str, str]) -> NodePlugin``; both modes
(Kubernetes and embedded) call it the same way.
"""

from __future__ import annotations

from typing import Protocol

from tessera.node.containers import Share
from tessera.node.metrics import Counters
from tessera.node.usage import NodeUsage


class NodeActions(Protocol):
    counters: Counters

    def kill(self, pid: int, why: str) -> bool:
        """SIGKILL to a GPU process (host pid); False if it was already gone."""
        ...

    def event(self, share: Share | None, reason: str, message: str, warning: bool = True) -> None:
        """A Kubernetes Event on the share's pod (on the Node when share is None), or a workload
        event in embedded mode."""
        ...


class NodePlugin(Protocol):
    def sync(self, usage: NodeUsage, actions: NodeActions) -> None: ...
