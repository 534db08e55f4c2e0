"""The pods informer's list and watch through the lean client (tessera.kube.rawapi).

Profiling ``bench.kube`` showed the pods watch at 16 % of tessera-scheduler's CPU, most of it
httpx's transport and lightkube's models (every event built into a full ``Pod`` of nested
dataclasses, then read by ``objects.pod_info``). Here each event is decoded once with msgspec
into plain JSON values and handed on behind ``JsonView``: the attribute access ``pod_info``
uses, over the decoded object as the API server sent it. Nothing is dropped, so every field any
part of the scheduler reads is there, in the API's own JSON form (what lightkube's
``to_dict()`` gives back too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import msgspec

from tessera.kube.rawapi import KubeHTTPError, RawApi

MAPS = frozenset(("labels", "annotations", "nodeSelector", "overhead", "requests", "limits"))
"""Fields of a pod that are string maps (read with ``dict(...)``/``.get``), not objects."""

_decode = msgspec.json.Decoder().decode


class JsonView:
    """Attribute access over one decoded JSON object, as lightkube's models give it: a field
    the object lacks reads as None, objects and lists of objects come back as views, the
    string maps in ``MAPS`` as the dicts they are; ``to_dict()`` is the object itself."""

    __slots__ = ("_d",)

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        v = self._d.get(name)
        return v if name in MAPS else _view(v)

    def to_dict(self) -> dict[str, Any]:
        return self._d


def _view(v: Any) -> Any:
    if isinstance(v, dict):
        return JsonView(v)
    if isinstance(v, list):
        return [_view(x) for x in v]
    return v


class LeanSource:
    """List and watch of one resource collection (e.g. ``/api/v1/pods``) under a field
    selector, yielding ``JsonView`` objects: what ``Informer`` takes as its ``source``."""

    def __init__(self, raw: RawApi, path: str, fields: dict[str, str]) -> None:
        self.raw = raw
        self.path = path
        self.selector = quote(",".join(f"{k}={v}" for k, v in fields.items()), safe="")

    async def list(self, chunk: int = 2000) -> tuple[list[Any], str]:
        items: list[Any] = []
        cont = ""
        while True:
            q = f"{self.path}?limit={chunk}&fieldSelector={self.selector}"
            if cont:
                q += f"&continue={quote(cont, safe='')}"
            page = _decode(await self.raw.request_bytes("GET", q))
            items += [JsonView(i) for i in page.get("items") or ()]
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, meta.get("resourceVersion", "")

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, Any]]:
        """(type, object) per event from ``rv``; an ERROR event (410 Gone: too old) raises
        ``KubeHTTPError`` with its code, so the informer lists again."""
        q = (f"{self.path}?watch=1&resourceVersion={quote(rv, safe='')}"
             f"&fieldSelector={self.selector}")
        async for line in self.raw.stream_lines(q):
            event = _decode(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise KubeHTTPError(int(obj.get("code") or 500), obj.get("message", ""),
                                    obj.get("reason", ""))
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                yield kind, JsonView(obj)
