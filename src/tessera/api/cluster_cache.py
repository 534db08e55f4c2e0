"""``GET /api/v1/cluster`` built once a second, not once per request.

The cluster document (every node and GPU, who holds what, the node agents' usage) is the
console's largest: 500 nodes × 8 GPUs make about 1.1 MB of JSON, and building it reads every
workload pod. Every open GPUs page asks for it every 5 s, and the answer may be up to ``max_age``
seconds old (as the Overview's snapshot, tessera.api.telemetry.SnapshotCache), or up to
``stale_for`` seconds while a newer one is built in the background, so a page polling it never
waits for a build: the cache keeps the last document with its JSON, built by one request or the
background while the others take its result. A caller who may read every project gets the JSON as built; any other
caller a redacted copy (the cached document is never changed). A cluster of fewer than
``min_gpus`` GPUs is built on every request."""

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
    def __init__(self, build: Callable[[], dict[str, Any]], max_age: float = 1.0,
                 stale_for: float = 5.0, min_gpus: int = 256) -> None:
        self.build = build
        self.min_gpus = min_gpus
        """Smaller clusters are built on every request: it costs a few milliseconds there, and
        the document then agrees with the workloads' phases at every moment."""
        self.max_age = max_age
        self.stale_for = stale_for
        self._lock = threading.Lock()  # one build at a time; the others take its result
        self._last: Built | None = None
        self._refreshing = False

    def _build(self) -> Built:
        doc = self.build()
        built = Built(time.monotonic(), doc, dumps(doc))
        gpus = sum(len(n.get("gpus", [])) + len(n.get("migGpus") or [])
                   for n in doc.get("nodes", []))
        self._last = built if gpus >= self.min_gpus else None
        return built

    def _refresh(self) -> None:
        try:
            with self._lock:
                self._build()
        except Exception:  # the next request builds it (and answers the error)
            pass
        finally:
            self._refreshing = False

    def get(self) -> Built:
        """The last document if it is at most ``max_age`` old; up to ``stale_for`` old it is
        answered at once while a new one is built in the background (the next caller has it);
        older, or dropped by a write, it is built now."""
        last = self._last
        age = None if last is None else time.monotonic() - last.time
        if last is not None and age is not None and age <= self.max_age:
            return last
        if last is not None and age is not None and age <= self.stale_for:
            if not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, name="cluster-document",
                                 daemon=True).start()
            return last
        with self._lock:
            last = self._last
            if last is not None and time.monotonic() - last.time <= self.max_age:
                return last  # built by another caller while this one waited
            return self._build()

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
