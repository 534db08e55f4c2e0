"""The pods informer's list and watch through the lean client (tessera.kube.rawapi).

Profiling ``bench.kube`` showed the pods watch at 16 % of tessera-scheduler's CPU, most of it
httpx's transport and lightkube's models (every event built into a full ``Pod`` of nested
dataclasses, then read by ``objects.pod_info``). Here each event is decoded once, in C, by
msgspec into ``LeanPod``: only the fields ``objects.pod_info`` reads, by the API's names, so
``pod_info`` reads it as it reads lightkube's ``Pod``; the parts the predicates take whole stay
in the API's JSON form (what lightkube's ``to_dict()`` gives back too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import msgspec

from tessera.kube.rawapi import KubeHTTPError, RawApi


class JsonDict(dict[str, Any]):
    """A part of a pod the predicates take whole (affinity, a toleration, a port, a volume),
    as decoded: ``to_dict()`` is itself, its keys read as attributes (None when absent), as
    lightkube's models give them to ``objects.sched_dict``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def to_dict(self) -> dict[str, Any]:
        return self


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is JsonDict and isinstance(obj, dict):
        return JsonDict(obj)
    raise NotImplementedError(kind)


class _Owner(msgspec.Struct):
    kind: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    ownerReferences: list[_Owner] | None = None


class _Resources(msgspec.Struct):
    requests: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None


class _Container(msgspec.Struct):
    name: str = ""
    resources: _Resources | None = None
    ports: list[JsonDict] | None = None


class _PodClaim(msgspec.Struct):
    name: str = ""
    resourceClaimName: str | None = None
    resourceClaimTemplateName: str | None = None


class _Spec(msgspec.Struct):
    nodeName: str | None = None
    priorityClassName: str | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    resourceClaims: list[_PodClaim] | None = None
    nodeSelector: dict[str, str] | None = None
    affinity: JsonDict | None = None
    tolerations: list[JsonDict] | None = None
    topologySpreadConstraints: list[JsonDict] | None = None
    overhead: dict[str, Any] | None = None
    volumes: list[JsonDict] | None = None


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    message: str | None = None


class _ClaimStatus(msgspec.Struct):
    name: str = ""
    resourceClaimName: str | None = None


class _Status(msgspec.Struct):
    phase: str | None = None
    startTime: str | None = None
    conditions: list[_Condition] | None = None
    resourceClaimStatuses: list[_ClaimStatus] | None = None


class LeanPod(msgspec.Struct):
    """The fields of a pod that ``objects.pod_info`` reads (and only those: msgspec skips the
    rest while decoding), by the API's names, so ``pod_info`` reads it as a lightkube
    ``Pod``. Parts the predicates take whole (affinity, tolerations, spread, ports, volumes)
    stay JSON (``JsonDict``). A field ``pod_info`` starts to read must be added here:
    ``test_pods_read_through_the_lean_watch_parse_as_lightkubes_models_do`` compares both."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec | None = None
    status: _Status | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"{}")


class _List(msgspec.Struct):
    items: list[LeanPod] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


decode_pod = msgspec.json.Decoder(LeanPod, dec_hook=_dec_hook).decode
_event = msgspec.json.Decoder(_Event).decode
_list = msgspec.json.Decoder(_List, dec_hook=_dec_hook).decode
_any = msgspec.json.Decoder().decode


class LeanSource:
    """List and watch of one resource collection (e.g. ``/api/v1/pods``) under a field
    selector, yielding ``LeanPod`` objects: what ``Informer`` takes as its ``source``."""

    def __init__(self, raw: RawApi, path: str, fields: dict[str, str],
                 watch_seconds: int | None = None) -> None:
        """``fields``: field -> value required; a key ending in ``!`` asks for any other value
        (``{"spec.nodeName!": ""}``: bound pods)."""
        self.raw = raw
        self.path = path
        self.selector = quote(",".join(f"{k}={v}" for k, v in fields.items()), safe="")
        self.timeout = "" if watch_seconds is None else f"&timeoutSeconds={watch_seconds}"
        """Each watch's length (None: the API server's choice, 30-60 min by default)."""
        self.watches = 0
        """Watch requests made (each resumes from the last version seen)."""

    async def list(self, chunk: int = 2000) -> tuple[list[Any], str]:
        items: list[Any] = []
        cont = ""
        while True:
            q = f"{self.path}?limit={chunk}&fieldSelector={self.selector}"
            if cont:
                q += f"&continue={quote(cont, safe='')}"
            page = _list(await self.raw.request_bytes("GET", q))
            items += page.items or ()
            meta = page.metadata
            cont = meta.get("continue") or ""
            if not cont:
                return items, meta.get("resourceVersion", "")

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, Any]]:
        """(type, object) per event from ``rv``, watching again from the last version seen
        when the API server ends a watch (as lightkube's watch does; a relist of every pod
        each time cost more than the watch saved); an ERROR event (410 Gone: too old) raises
        ``KubeHTTPError`` with its code, so the informer lists again."""
        while True:
            q = (f"{self.path}?watch=1&allowWatchBookmarks=true"
                 f"&resourceVersion={quote(rv, safe='')}&fieldSelector={self.selector}"
                 f"{self.timeout}")
            self.watches += 1
            async for line in self.raw.stream_lines(q):
                event = _event(line)
                kind = event.type
                if kind == "ERROR":
                    obj = _any(event.object) or {}
                    raise KubeHTTPError(int(obj.get("code") or 500), obj.get("message", ""),
                                        obj.get("reason", ""))
                pod = decode_pod(event.object)
                rv = pod.metadata.resourceVersion or rv
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, pod
