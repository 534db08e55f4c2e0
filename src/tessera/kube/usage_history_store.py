"""Where the Kubernetes scheduler keeps its usage history across restarts (time-based fair
share, docs/scheduling.md): one ConfigMap, ``tessera-usage-history`` in tessera's own namespace,
which only tessera-scheduler's ServiceAccount writes (the chart's Role; tenants have no rights in
that namespace). Read once when the scheduler starts leading; written by the leader every
``save-every`` seconds (after a cycle) and when it stops. The record (``tessera.core.usage_saved``)
is gzipped JSON in ``binaryData``; a missing, unreadable or other-format record is logged and
the history starts empty, the scheduler runs on."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import time
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from tessera.core.usage_history import UsageHistory

log = logging.getLogger("tessera.kube")

NAME = "tessera-usage-history"
KEY = "history.json.gz"
LIMIT = 900 * 1024
"""Bytes a record may take (a ConfigMap holds at most 1 MiB): a bigger one is written with
coarser buckets (exact in GPU-seconds, less exact in when)."""


def encode(record: dict[str, Any]) -> str:
    raw = json.dumps(record, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def decode(cm: ConfigMap) -> object:
    data = (cm.binaryData or {}).get(KEY)
    if data is None:
        raise ValueError(f"no {KEY} in binaryData")
    return json.loads(gzip.decompress(base64.b64decode(data)))


class HistoryConfigMap:
    def __init__(self, client: AsyncClient, namespace: str, history: UsageHistory) -> None:
        self.client = client
        self.namespace = namespace
        self.history = history
        self._writing = False

    async def load(self) -> None:
        if self.history.policy is None:
            return
        where = f"ConfigMap {self.namespace}/{NAME}"
        try:
            cm = await self.client.get(ConfigMap, NAME, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                log.info("usage history: no %s yet; starting empty", where)
            else:
                log.warning("usage history: %s could not be read (%s); starting empty", where, exc)
            return
        ok, line = self.history.restore_from(lambda: decode(cm), "a gzipped JSON record", where,
                                             time.time())
        log.log(logging.INFO if ok else logging.WARNING, "%s", line)

    async def after_cycle(self, now: float, force: bool = False) -> None:
        """Write the record if it is due (or ``force``); never raises (logged). Compaction and
        encoding run on a thread: the loop goes on scheduling meanwhile."""
        if self._writing:
            return
        self._writing = True
        try:
            taken = self.history.take(now, force)
            if taken is None:
                return
            coarser = 0
            while True:
                packed, record = await asyncio.to_thread(self.history.compacted, *taken, now,
                                                         coarser)
                text = await asyncio.to_thread(encode, record)
                if len(text) <= LIMIT or coarser >= 16:
                    break
                coarser += 1
                log.warning("usage history record is %d bytes (over %d): writing it with buckets "
                            "%d times longer", len(text), LIMIT, 2 ** coarser)
            self.history.keep(taken[0], packed)
            await self._write(text)
        except Exception as exc:  # the next save tries again; scheduling goes on
            log.warning("usage history: writing ConfigMap %s/%s failed: %s", self.namespace, NAME,
                        exc)
        finally:
            self._writing = False

    async def _write(self, text: str) -> None:
        cm = ConfigMap(metadata=ObjectMeta(name=NAME, namespace=self.namespace,
                                           labels={"app.kubernetes.io/part-of": "tessera"}),
                       binaryData={KEY: text})
        try:
            await self.client.replace(cm)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            await self.client.create(cm)
