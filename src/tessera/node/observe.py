"""The mode-independent part of the agent: each sync, read usage, update the metrics, detect
escapes (and act on them), run the plugin (loan reclaimer). Kubernetes (:mod:`.agent`) and
embedded/local mode (:mod:`.local_agent`) differ only in where shares come from and where
events go."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tessera.node import containers as files
from tessera.node.containers import Share
from tessera.node.escapes import NO_SHARE, EscapeDetector
from tessera.node.metrics import Counters, NodeCollector
from tessera.node.nvml import Inventory, Nvml
from tessera.node.plugins import NodePlugin
from tessera.node.usage import NodeUsage, snapshot

log = logging.getLogger("tessera.node")

EventSink = Callable[[Share | None, str, str, bool], None]


class Observer:
    """Also the :class:`~tessera.node.plugins.NodeActions` a plugin gets."""

    def __init__(self, node: str, nvml: Nvml | None, inventory: Inventory | None,
                 containers_dir: Path, on_escape: str, sink: EventSink,
                 tolerance: float = 0.05, plugin: NodePlugin | None = None) -> None:
        self.nvml = nvml
        self.inventory = inventory
        self.containers_dir = containers_dir
        self.on_escape = on_escape
        self.sink = sink
        self.counters = Counters()
        self.collector = NodeCollector(node, self.counters)
        self.detector = EscapeDetector(tolerance)
        self.plugin = plugin
        self.usage: NodeUsage | None = None

    def kill(self, pid: int, why: str) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
            log.warning("killed process %d: %s", pid, why)
            return True
        except ProcessLookupError:
            return False

    def event(self, share: Share | None, reason: str, message: str, warning: bool = True) -> None:
        self.sink(share, reason, message, warning)

    def observe(self, shares: Mapping[str, Share]) -> NodeUsage | None:
        if self.nvml is None or self.inventory is None:
            self.collector.usage = None
            return None
        t0 = time.perf_counter()
        gpus = self.nvml.usage()
        models = {g.uuid: g.model for g in self.inventory.gpus}
        root = self.containers_dir
        usage = snapshot(gpus, models, list(shares.values()),
                         lambda s: files.region_path(root, s.key))
        self.usage = usage
        self.collector.usage = usage
        self.collector.sync_seconds = time.perf_counter() - t0
        for escape in self.detector.check(usage):
            share = shares.get(escape.share_key) if escape.share_key else None
            who = f"{share.namespace}/{share.pod}" if share else "no pod"
            message = escape.message(who)
            self.counters.add_escape(escape.gpu_uuid, escape.kind)
            killed = False
            if self.on_escape == "kill":
                killed = self.kill(escape.pid, message)
                if killed:
                    with self.counters.lock:
                        self.counters.escapes_killed += 1
            log.warning("escape: %s%s", message, " (killed)" if killed else "")
            self.event(share, "GPUUnsharedProcess" if escape.kind == NO_SHARE
                       else "GPUIsolationEscape",
                       message + ("; killed (--on-escape kill)" if killed else ""), True)
        self.collector.escaped_processes = len(self.detector.current)
        if self.plugin is not None:
            try:
                self.plugin.sync(usage, self)
            except Exception:
                log.exception("plugin sync failed")
        return usage
