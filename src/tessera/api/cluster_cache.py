"""``GET /api/v1/cluster`` built once a second, not once per request.

The cluster document (every node and GPU, who holds what, the node agents' usage) is the
console's largest: 500 nodes × 8 GPUs make about 1.5 MB of JSON, and building it reads every
workload pod. Every open GPUs page asks for it every 5 s, and the answer may be up to ``max_age``
seconds old (as the Overview's snapshot, tessera.api.telemetry.SnapshotCache): the cache keeps
the last document with its JSON, built by one request while the others wait for it (not built
once per waiting request). A caller who may read every project gets the JSON as built; any other
caller a redacted copy (the cached document is never changed)."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Built:
    time: float
    doc: dict[str, Any]
    body: bytes


def dumps(doc: dict[str, Any]) -> bytes:
    # json.dumps, not FastAPI's generic encoder: ~10x faster on this document (it is JSON-ready
    # by the backend contract).
    return json.dumps(doc, separators=(",", ":")).encode()


class ClusterCache:
    def __init__(self, build: Callable[[], dict[str, Any]], max_age: float = 1.0) -> None:
        self.build = build
        self.max_age = max_age
        self._lock = threading.Lock()
        self._last: Built | None = None

    def get(self) -> Built:
        with self._lock:  # one build at a time; the others take its result
            last = self._last
            if last is None or time.monotonic() - last.time > self.max_age:
                doc = self.build()
                last = self._last = Built(time.monotonic(), doc, dumps(doc))
            return last

    def body(self, redact: Callable[[dict[str, Any]], dict[str, Any]] | None) -> bytes:
        """The JSON for a caller: as built (``redact`` None), or of a redacted copy."""
        built = self.get()
        return built.body if redact is None else dumps(redact(copy.deepcopy(built.doc)))

    def invalidate(self) -> None:
        with self._lock:
            self._last = None


class FreshAfterWrites:
    """ASGI middleware: a request that may change state (any method but GET, HEAD, OPTIONS)
    drops the cached document when it has been answered, so a caller who submits, deletes or
    changes something and then asks for the cluster sees it (changes made elsewhere, such as a
    placement by the scheduler, show within ``max_age``)."""

    def __init__(self, app: Any, cache: ClusterCache) -> None:
        self.app = app
        self.cache = cache

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.get("type") == "http" and scope.get("method") not in ("GET", "HEAD", "OPTIONS"):
                self.cache.invalidate()
