"""List-then-watch caches: the scheduler reads the cluster from memory, never by polling."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from lightkube import ApiError, AsyncClient

from tessera.kube.rawapi import KubeHTTPError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Informer(Generic[T]):
    """Keeps ``items`` (key -> parsed object) in step with the API server.

    ``parse`` turns a lightkube object into what is stored; ``on_change(key, old, new)`` is
    called for every change (``new`` None on delete). A failed or expired watch relists, and a
    relist reports deletions that happened while the watch was down."""

    def __init__(
        self,
        client: AsyncClient,
        resource: Any,
        key: Callable[[Any], Any],
        parse: Callable[[Any], T],
        on_change: Callable[[Any, T | None, T | None], None],
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        name: str = "",
        same: Callable[[T, T], bool] | None = None,
        optional: bool = False,
        index: Callable[[T], Any] | None = None,
        source: Any = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.key = key
        self.parse = parse
        self.on_change = on_change
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.name = name or getattr(resource, "__name__", "?")
        self.same = same
        """``same(old, new)``: the change does not matter; keep ``old`` and report nothing."""
        self.optional = optional
        """An API the cluster may not serve (resource.k8s.io on a cluster before 1.34): a 404
        counts as synced with nothing in it, listed again every minute."""
        self.items: dict[Any, T] = {}
        self.synced = asyncio.Event()
        self.index = index
        """``index(item)``: a value to find items by (None: not indexed), e.g. a pod's node."""
        self.by: dict[Any, set[Any]] = {}
        """``index`` value -> keys of the items that have it, kept with ``items``."""
        self.source = source
        """Lists and watches instead of lightkube (``list()``, ``watch(rv)``: the pods through
        the lean client, tessera.kube.lean_watch)."""

    def _set(self, k: Any, old: T | None, new: T | None) -> None:
        """Stores ``new`` under ``k`` (None: deletes it), keeping ``by`` in step."""
        if new is None:
            self.items.pop(k, None)
        else:
            self.items[k] = new
        if self.index is None:
            return
        was = None if old is None else self.index(old)
        now = None if new is None else self.index(new)
        if was == now:
            return
        if was is not None:
            keys = self.by.get(was)
            if keys is not None:
                keys.discard(k)
                if not keys:
                    del self.by[was]
        if now is not None:
            self.by.setdefault(now, set()).add(k)

    def _apply(self, kind: str, obj: Any) -> None:
        k = self.key(obj)
        old = self.items.get(k)
        if kind == "DELETED":
            if k in self.items:
                self._set(k, old, None)
                self.on_change(k, old, None)
            return
        new = self.parse(obj)
        if old is not None and self.same is not None and self.same(old, new):
            return
        self._set(k, old, new)
        self.on_change(k, old, new)

    async def _list(self) -> str:
        seen: dict[Any, T] = {}
        if self.source is not None:
            objs, rv = await self.source.list()
            rv = str(rv)
            for obj in objs:
                seen[self.key(obj)] = self.parse(obj)
        else:
            kw: dict[str, Any] = {"labels": self.labels, "fields": self.fields}
            if self.namespace is not None:
                kw["namespace"] = self.namespace
            elif _namespaced(self.resource):
                kw["namespace"] = "*"
            it = self.client.list(self.resource, chunk_size=2000, **kw)
            async for obj in it:
                seen[self.key(obj)] = self.parse(obj)
            rv = it.resourceVersion
        for k in [k for k in self.items if k not in seen]:
            gone = self.items[k]
            self._set(k, gone, None)
            self.on_change(k, gone, None)
        for k, v in seen.items():
            old = self.items.get(k)
            self._set(k, old, v)
            self.on_change(k, old, v)
        return rv

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                rv = await self._list()
                self.synced.set()
                if self.source is not None:
                    async for kind, obj in self.source.watch(rv):
                        self._apply(kind, obj)
                        delay = 0.2
                    continue
                kw: dict[str, Any] = {"labels": self.labels, "fields": self.fields,
                                      "resource_version": rv}
                if self.namespace is not None:
                    kw["namespace"] = self.namespace
                elif _namespaced(self.resource):
                    kw["namespace"] = "*"
                async for kind, obj in self.client.watch(self.resource, **kw):
                    self._apply(kind, obj)
                    delay = 0.2
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if self.optional and exc.status.code == 404:
                    if not self.synced.is_set():
                        log.info("%s: not served by this API server; treated as empty",
                                 self.name)
                    self.synced.set()
                    await asyncio.sleep(60.0)
                elif exc.status.code != 410:
                    log.warning("watch %s failed: %s; relisting in %.1fs", self.name, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            except KubeHTTPError as exc:
                if exc.code != 410:  # 410: too old, list again now
                    log.warning("watch %s failed: %s; relisting in %.1fs", self.name, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            except Exception as exc:
                log.warning("watch %s failed: %r; relisting in %.1fs", self.name, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def _namespaced(resource: Any) -> bool:
    from lightkube.core.resource import NamespacedResource

    return isinstance(resource, type) and issubclass(resource, NamespacedResource)
