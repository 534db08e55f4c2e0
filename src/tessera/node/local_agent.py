"""tessera-node on one machine (embedded mode, tests): the same usage, metrics, escape
detection and plugin (loan reclaimer) as on Kubernetes, over the shares found in a directory.

Each share is a directory ``SHARES/KEY/`` as :func:`tessera.node.containers.write_share` lays it
out (``pod.json``, ``conf/CONTAINER/gpu-isolation.conf``, ``region/gpu-usage.region``), written
with ``host_paths=True`` because the processes run on this host. Events go to the log and, one
JSON object a line, to ``SHARES/events.jsonl``.

    tessera-node local --shares-dir DIR [--metrics-port 9400] [--on-escape warn|kill]
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from tessera.node import containers as files
from tessera.node.containers import Share
from tessera.node.nvml import Nvml
from tessera.node.observe import Observer
from tessera.node.plugins import NodePlugin

log = logging.getLogger("tessera.node")


class LocalAgent:
    def __init__(self, node: str, nvml: Nvml | None, shares_dir: Path, *, on_escape: str = "warn",
                 sync_interval: float = 1.0, plugin: NodePlugin | None = None) -> None:
        self.shares_dir = shares_dir
        self.sync_interval = sync_interval
        self.events_file = shares_dir / "events.jsonl"
        inventory = nvml.inventory() if nvml is not None else None
        self.observer = Observer(node, nvml, inventory, shares_dir, on_escape, self._sink,
                                 plugin=plugin)
        self.observer.collector.ready = nvml is not None
        self.syncs = 0

    def _sink(self, share: Share | None, reason: str, message: str, warning: bool) -> None:
        record = {"time": time.time(), "reason": reason, "message": message,
                  "type": "Warning" if warning else "Normal",
                  "namespace": share.namespace if share else "", "pod": share.pod if share else ""}
        log.warning("%s: %s", reason, message) if warning else log.info("%s: %s", reason, message)
        try:
            with self.events_file.open("a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            log.warning("cannot record event in %s: %s", self.events_file, exc)

    def shares(self) -> dict[str, Share]:
        out: dict[str, Share] = {}
        for key in files.existing_keys(self.shares_dir):
            share = files.read_share(self.shares_dir, key)
            if share is not None:
                out[key] = share
        return out

    def sync_once(self) -> None:
        self.observer.observe(self.shares())
        self.syncs += 1

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync_once()
            except Exception:
                log.exception("sync failed")
            stop.wait(self.sync_interval)
