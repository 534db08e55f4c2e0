"""The API server's view of the cluster's Nodes, kept by a watch instead of read per request.

Listing and parsing every Node on each request made the console's GPUs page take most of a second
at 500 nodes. A daemon thread lists the Nodes once and then follows their watch (relisting after
an error or an expired resourceVersion), so a request reads a dict. Until the first list is done,
:meth:`NodeCache.items` waits for it (bounded), so a request never sees an empty cluster that is
only still loading.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node

from tessera.kube.names import AGENT_URL
from tessera.kube.objects import NodeInfo, node_info

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedNode:
    info: NodeInfo
    labels: dict[str, str]
    agent_url: str = ""
    """Where its tessera-node serves ``/usage`` (annotation ``tessera.io/node-agent-url``)."""


class NodeCache:
    def __init__(self, client: Any, sync_timeout: float = 30.0) -> None:
        # A client of its own: a watch holds its connection for as long as it runs, which must
        # not take one from the pool the API's requests share.
        config = getattr(client, "config", None)
        self.client = Client(config) if config is not None else client
        self.sync_timeout = sync_timeout
        self._nodes: dict[str, CachedNode] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def items(self) -> dict[str, CachedNode]:
        """The Nodes now (a copy); starts the watch on first use."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="tessera-node-cache",
                                                    daemon=True)
                    self._thread.start()
        if not self._synced.wait(self.sync_timeout):
            raise TimeoutError(f"the Node list did not load within {self.sync_timeout:.0f} s")
        with self._lock:
            return dict(self._nodes)

    def stop(self) -> None:
        self._stop.set()

    @staticmethod
    def _entry(obj: Any) -> CachedNode:
        meta = obj.metadata
        return CachedNode(node_info(obj), dict((meta.labels if meta else None) or {}),
                          ((meta.annotations if meta else None) or {}).get(AGENT_URL, ""))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.client.list(Node)
                fresh = {str(o.metadata.name): self._entry(o) for o in listed}  # type: ignore[union-attr]
                try:
                    version: str | None = listed.resourceVersion
                except Exception:  # lightkube: only known once the list was read
                    version = None
                with self._lock:
                    self._nodes = fresh
                self._synced.set()
                for kind, obj in self.client.watch(Node, resource_version=version):
                    if self._stop.is_set():
                        return
                    name = str(obj.metadata.name)  # type: ignore[union-attr]
                    with self._lock:
                        if kind == "DELETED":
                            self._nodes.pop(name, None)
                        else:
                            self._nodes[name] = self._entry(obj)
            except Exception as exc:  # an expired version, a dropped connection: list again
                log.debug("node watch ended (%s); listing again", exc)
                self._stop.wait(1.0)
