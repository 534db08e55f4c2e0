"""The webhook's side of gangs from owners: read a new pod's owner chain from the API server and
turn :func:`tessera.kube.podgrouper.infer`'s answer into the pod's annotations.

A pod a controller creates is admitted with ``tessera.io/pod-group`` (its gang),
``tessera.io/gang-min-member`` (the gang's minimum; the scheduler waits for that many pods and
places them together or none), ``tessera.io/gang`` (why, shown by ``tessera describe``) and,
on a member its gang cannot run without (a Ray head, a PyTorchJob's Master),
``tessera.io/gang-anchor``.
Since the webhook runs before the pod exists, the scheduler never sees it without its gang.

A pod that already names a group (``tessera.io/pod-group``) keeps it: nothing is read. An owner
that cannot be read (no RBAC, the API server failing) refuses the pod, naming
``metadata.ownerReferences``: the controller retries, rather than a member starting alone. An
owner already deleted admits the pod on its own (the garbage collector removes it). An owner kind
tessera cannot infer, or one whose elastic bounds contradict each other: the pod is scheduled
on its own and an Event on that owner says so, naming the field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.kube import names, podgrouper
from tessera.kube.admission import policy
from tessera.kube.admission.policy import WebhookConfig
from tessera.kube.podgrouper import Gang, PerPod
from tessera.wire import event_body

log = logging.getLogger("tessera.webhook")

MAX_DEPTH = 6
"""Owners followed at most (a LeaderWorkerSet worker has four: StatefulSet, leader Pod,
StatefulSet, LeaderWorkerSet)."""
CACHE_SECONDS = 1.0
"""How long an owner read is reused: the pods of one gang arrive together, and a Job's
``status.succeeded`` (a retried member's minimum) must not be older than that."""


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def gang_annotations_of(result: Gang | PerPod) -> dict[str, str]:
    """What the pod gets for the inferrer's answer."""
    if isinstance(result, Gang):
        anchor = {names.GANG_ANCHOR: "true"} if result.anchor else {}
        if result.anchors:
            anchor[names.GANG_ANCHORS] = str(result.anchors)
        return {names.POD_GROUP: result.name, names.GANG_MIN_MEMBER:
                str(result.min_member), GANG: result.why, **anchor}
    return {GANG: f"no gang: {result.why}"}


GANG = names.GANG


class OwnerReader:
    """Reads owner chains with a lightkube AsyncClient (only the kinds tessera knows:
    :data:`tessera.kube.podgrouper.KNOWN_KINDS`) and posts the unknown-owner Events."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._cache: dict[tuple[str, str, str, str], tuple[float, dict[str, Any] | None]] = {}
        self._told: set[str] = set()

    @staticmethod
    def _resource(ref: Mapping[str, Any]) -> Any:
        """lightkube's class for the owner's kind (built in, or a generic one for a CRD; every
        kind tessera knows has the plural ``<kind>s``)."""
        from lightkube.core.exceptions import LoadResourceError
        from lightkube.core.resource_registry import resource_registry
        from lightkube.generic_resource import create_namespaced_resource

        api_version = str(ref.get("apiVersion") or "v1")
        kind = str(ref.get("kind"))
        try:
            return resource_registry.load(api_version, kind)
        except LoadResourceError:
            group, _, version = api_version.rpartition("/")
            return create_namespaced_resource(group, version, kind, f"{kind.lower()}s")

    async def _get(self, namespace: str, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        from lightkube import ApiError

        key = (namespace, str(ref.get("apiVersion")), str(ref.get("kind")), str(ref.get("name")))
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        try:
            got = await self.client.get(self._resource(ref), str(ref.get("name")),
                                        namespace=namespace)
            obj: dict[str, Any] | None = dict(got.to_dict())
        except ApiError as exc:
            if exc.status.code != 404:
                raise InvalidRequest(
                    "metadata.ownerReferences", f"tessera-webhook could not read the owner "
                    f"{ref.get('kind')} {namespace}/{ref.get('name')} to find the pod's gang "
                    f"({exc.status.code} {exc.status.reason}: {exc.status.message}); the pod "
                    "is refused rather than started without its gang") from None
            obj = None
        if obj is not None and str(obj.get("metadata", {}).get("uid")) != str(ref.get("uid")):
            obj = None  # a newer object of the same name: this pod's owner is gone
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = (now, obj)
        return obj

    async def chain(self, namespace: str, pod: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
        """The pod's controllers, its own first; the first unknown kind is its reference alone.
        None when an owner is gone."""
        out: list[Mapping[str, Any]] = []
        obj: Mapping[str, Any] = pod
        for _ in range(MAX_DEPTH):
            ref = _controller(obj)
            if ref is None:
                break
            if podgrouper.kind_key(ref) not in podgrouper.KNOWN_KINDS:
                out.append({"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"),
                            "metadata": {"name": ref.get("name"), "uid": ref.get("uid")}})
                break
            got = await self._get(namespace, ref)
            if got is None:
                return None
            out.append(got)
            obj = got
        return out

    async def gang_annotations(self, namespace: str, pod: Mapping[str, Any],
                               config: WebhookConfig) -> dict[str, str]:
        """The annotations the pod gets (empty: not a controller's pod, or it names a group).
        Raises InvalidRequest naming the field that stops it."""
        meta = pod.get("metadata") or {}
        if names.POD_GROUP in (meta.get("annotations") or {}) or \
                names.POD_GROUP in (meta.get("labels") or {}) or _controller(pod) is None:
            return {}
        chain = await self.chain(namespace, pod)
        if chain is None:
            return {GANG: "no gang: its owner is gone"}

        def ours(template: Mapping[str, Any]) -> bool:
            return policy.asks_for_gpu(template, config)

        result = podgrouper.infer(pod, chain, ours)
        if isinstance(result, PerPod) and result.unknown:
            await self._tell(namespace, chain[-1], result.why)
        return gang_annotations_of(result)

    async def _tell(self, namespace: str, owner: Mapping[str, Any], message: str) -> None:
        """One Warning Event per unknown owner (per webhook process): best effort."""
        meta = owner.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid in self._told:
            return
        self._told.add(uid)
        from lightkube import codecs

        name = str(meta.get("name") or "")
        event = codecs.from_dict(event_body(
            kind=str(owner.get("kind")), name=name, namespace=namespace, uid=uid,
            reason="GangNotInferred", message=message, type_="Warning",
            component="tessera-webhook", instance="tessera-webhook",
            api_version=str(owner.get("apiVersion") or "v1")))
        try:
            await self.client.create(event)
        except Exception as exc:  # an Event is best effort
            log.warning("could not post GangNotInferred on %s %s/%s: %r", owner.get("kind"),
                        namespace, name, exc)
