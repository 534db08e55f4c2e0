"""Writing decisions to the API server: reservation pods, per-pod ConfigMaps, bindings,
evictions, Events, pod conditions and Project status.

Every write goes through ``with_backoff`` (409, 429, 5xx and connection errors are retried) and
a semaphore that bounds how many requests are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.core_v1 import (
    Container,
    ObjectReference,
    PodSpec,
    ResourceRequirements,
    Toleration,
)
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import ConfigMap, Pod, PodBinding
from lightkube.types import PatchType

from tessera import wire
from tessera.core.state import Placement
from tessera.kube import names
from tessera.kube.objects import PodInfo, ProjectResource, placement_to_json
from tessera.kube.rawapi import KubeHTTPError, RawApi
from tessera.kube.retry import status_code, with_backoff

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def dns_name(base: str, limit: int = 253) -> str:
    """``base`` if it is a short enough name, else a prefix plus a hash (stable)."""
    if len(base) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: limit - 11].rstrip('-.')}-{digest}"


def reservation_name(node: str, device: int) -> str:
    return dns_name(f"tessera-gpu-{node}-{device}")


def configmap_name(pod: str) -> str:
    return dns_name(f"{pod}-tessera-gpu")


NOTICE_BACKLOG = 2000
"""Normal Events waiting to be posted beyond which new ones are dropped."""
_CONTENT_TYPES = {PatchType.MERGE: "application/merge-patch+json",
                  PatchType.JSON: "application/json-patch+json"}
"""The lean client's Content-Type for each patch lightkube would send."""


def _event_body(pod: PodInfo, reason: str, message: str, type_: str) -> dict[str, Any]:
    return wire.event_body(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid,
                           reason=reason, message=message, type_=type_,
                           component=names.COMPONENT, instance=names.COMPONENT)


class Writer:
    def __init__(self, client: AsyncClient, *, concurrency: int = 32,
                 system_namespace: str = names.SYSTEM_NAMESPACE,
                 reservation_image: str = "registry.k8s.io/pause:3.10",
                 raw: RawApi | None = None) -> None:
        self.client = client
        self.raw = raw
        """Lean client for the binding path's POSTs (see rawapi.py); lightkube if None."""
        self.sem = asyncio.Semaphore(concurrency)
        self.notice_sem = asyncio.Semaphore(4)
        self.notices_pending = 0
        self.notices_dropped = 0
        self.system_namespace = system_namespace
        self.reservation_image = reservation_image
        self.calls = 0

    async def _call(self, what: str, op: Any, **kw: Any) -> Any:
        async def once() -> Any:
            async with self.sem:
                self.calls += 1
                return await op()

        return await with_backoff(what, once, **kw)

    # ---- reservation pods ----------------------------------------------------------------
    async def create_reservation(self, node: str, device: int) -> None:
        name = reservation_name(node, device)
        pod = Pod(
            metadata=ObjectMeta(
                name=name,
                namespace=self.system_namespace,
                labels={
                    names.RESERVATION_LABEL: "true",
                    names.RESERVATION_DEVICE: str(device),
                    names.MANAGED_BY: "tessera",
                },
                annotations={names.RESERVATION_NODE: node},
            ),
            spec=PodSpec(
                nodeName=node,
                schedulerName=names.SCHEDULER_NAME,
                automountServiceAccountToken=False,
                terminationGracePeriodSeconds=0,
                tolerations=[Toleration(operator="Exists")],
                containers=[Container(
                    name="reserve",
                    image=self.reservation_image,
                    resources=ResourceRequirements(
                        requests={names.GPU_RESOURCE: "1", "cpu": "1m", "memory": "4Mi"},
                        limits={names.GPU_RESOURCE: "1"},
                    ),
                )],
            ),
        )

        async def op() -> None:
            try:
                if self.raw is not None:
                    await self.raw.request("POST", f"/api/v1/namespaces/{self.system_namespace}/pods",
                                           pod.to_dict())
                else:
                    await self.client.create(pod)
            except (ApiError, KubeHTTPError) as exc:
                if status_code(exc) != 409:  # already there: another attempt or a former life
                    raise

        await self._call(f"create reservation {name}", op)

    async def delete_reservation(self, res: PodInfo, reason: str) -> None:
        log.info("deleting reservation pod %s: %s", res.name, reason)
        await self.delete_pod(res.namespace, res.name)

    # ---- per-pod ConfigMap -----------------------------------------------------------------
    def configmap_data(self, placement: Placement, uuids: list[str], device_memory: list[int]
                       ) -> dict[str, str]:
        portions = [f"{r / m:.4f}".rstrip("0").rstrip(".") for r, m in
                    zip(placement.request_bytes, device_memory, strict=True)]
        return {
            wire.VISIBLE_DEVICES_KEY: ",".join(uuids),
            "TESSERA_GPU_UUIDS": ",".join(uuids),
            "TESSERA_GPU_DEVICE_INDICES": ",".join(str(d) for d in placement.devices),
            wire.MEMORY_REQUEST_KEY: ",".join(str(b) for b in placement.request_bytes),
            # One quantity for every visible device, the form the isolation library reads; on
            # devices of different sizes the smallest share caps all (never above any share).
            wire.MEMORY_LIMIT_KEY: str(min(placement.limit_bytes)),
            "TESSERA_GPU_MEMORY_LIMITS": ",".join(str(b) for b in placement.limit_bytes),
            "TESSERA_GPU_PORTION": ",".join(portions),
            wire.ISOLATION_KEY: "on",
            wire.NODE_KEY: placement.node,
            # cGPU's ALIYUN_COM_GPU_MEM_DEV: whole GiB of each device (seed 002: 15 on a V100),
            # the smallest where they differ.
            "ALIYUN_COM_GPU_MEM_DEV": str(min(device_memory) // 2**30) if device_memory else "0",
        }

    async def write_configmap(self, pod: PodInfo, data: dict[str, str]) -> str:
        name = configmap_name(pod.name)
        labels = {names.MANAGED_BY: "tessera"}
        if len(pod.name) <= 63:
            labels[names.CONFIGMAP_POD] = pod.name
        meta = ObjectMeta(
            name=name, namespace=pod.namespace, labels=labels,
            annotations={names.CONFIGMAP_POD: pod.name},
            ownerReferences=[OwnerReference(apiVersion="v1", kind="Pod", name=pod.name,
                                            uid=pod.uid)],
        )

        async def op() -> None:
            try:
                if self.raw is not None:
                    await self.raw.request(
                        "POST", f"/api/v1/namespaces/{pod.namespace}/configmaps",
                        {"apiVersion": "v1", "kind": "ConfigMap", **ConfigMap(
                            metadata=meta, data=data).to_dict()})
                else:
                    await self.client.create(ConfigMap(metadata=meta, data=data))
                return
            except (ApiError, KubeHTTPError) as exc:
                if status_code(exc) != 409:
                    raise
            # A ConfigMap of that name exists (left from a former attempt, or anyone's):
            # take it over with our data, guarded by its resourceVersion (409 -> retry).
            current = await self.client.get(ConfigMap, name, namespace=pod.namespace)
            assert current.metadata is not None
            meta.resourceVersion = current.metadata.resourceVersion
            await self.client.replace(ConfigMap(metadata=meta, data=data))

        await self._call(f"configmap {pod.namespace}/{name}", op)
        return name

    async def delete_configmap(self, namespace: str, name: str) -> None:
        async def op() -> None:
            try:
                await self.client.delete(ConfigMap, name, namespace=namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

        await self._call(f"delete configmap {namespace}/{name}", op)

    # ---- binding -----------------------------------------------------------------------------
    async def bind(self, pod: PodInfo, placement: Placement, annotations: dict[str, str]) -> None:
        """POST pods/<name>/binding; the Binding's annotations are written onto the pod in the
        same request, so node and recorded placement appear together."""
        annotations = {**annotations, names.PLACEMENT: placement_to_json(placement)}
        meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace,
                                "annotations": annotations}
        if pod.uid:
            meta["uid"] = pod.uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": placement.node}}

        async def op() -> None:
            if self.raw is not None:  # the body as a plain dict: no model per binding
                await self.raw.request(
                    "POST", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding", body)
                return
            # lightkube 1.0.1 decodes the reply (a Status) as a Binding and fails: the binding
            # itself succeeded when the API server answered 201.
            with contextlib.suppress(msgspec.ValidationError):
                await self.client.create(PodBinding(
                    metadata=ObjectMeta(**meta),
                    target=ObjectReference(apiVersion="v1", kind="Node", name=placement.node)),
                    pod.name, namespace=pod.namespace)

        def retry(exc: BaseException) -> bool:
            # 409 on a binding means "already bound": retrying cannot help.
            code = status_code(exc)
            return code in (429, 500, 502, 503, 504) or (
                code is None and not isinstance(exc, msgspec.ValidationError))

        await self._call(f"bind {pod.namespace}/{pod.name}", op, retry_on=retry)

    async def claim_status(self, namespace: str, name: str, status: dict[str, Any] | None
                           ) -> None:
        """Merge-patches a ResourceClaim's status (an allocation before binding; None fields
        deallocate), through the lean client where there is one (docs/dra.md)."""
        await self._patch_claim_status(namespace, name, {"status": status}, PatchType.MERGE)

    async def claim_status_ops(self, namespace: str, name: str, ops: list[dict[str, Any]]
                               ) -> None:
        """JSON-patches a ResourceClaim's status: appending to ``reservedFor`` needs no
        resourceVersion (pods joining a shared claim at once do not conflict); a ``test`` op
        makes a replace conditional (422 when it fails, not retried)."""
        await self._patch_claim_status(namespace, name, ops, PatchType.JSON)

    async def _patch_claim_status(self, namespace: str, name: str, body: Any,
                                  patch_type: PatchType) -> None:
        from tessera.kube.claims import ResourceClaim

        async def op() -> None:
            if self.raw is not None:
                await self.raw.request(
                    "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
                    f"{name}/status", body, content_type=_CONTENT_TYPES[patch_type])
                return
            await self.client.patch(ResourceClaim.Status, name, body, namespace=namespace,
                                    patch_type=patch_type)

        await self._call(f"resourceclaim {namespace}/{name} status", op)

    # ---- evictions, events, conditions -------------------------------------------------------
    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        async def op() -> None:
            try:
                await self.client.delete(Pod, name, namespace=namespace, grace_period=0)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

        await self._call(f"delete pod {namespace}/{name}", op)

    async def evict_api(self, pod: PodInfo, reason: str, message: str) -> None:
        """Evict through the Eviction API (pods/eviction), so PodDisruptionBudgets are honoured:
        raises ApiError 429 when a budget forbids it (nothing is written then)."""
        from lightkube.resources.core_v1 import PodEviction

        async def op() -> None:
            try:
                await self.client.create(
                    PodEviction(metadata=ObjectMeta(name=pod.name, namespace=pod.namespace)),
                    name=pod.name, namespace=pod.namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

        await op()
        await self.event(pod, reason, message, "Normal")

    async def notice(self, pod: PodInfo, reason: str, message: str) -> None:
        """A Normal Event that no decision waits for (``Scheduled``): on its own few
        connections, never taking a slot from bindings, one attempt, and dropped when more than
        ``NOTICE_BACKLOG`` wait (as kube-scheduler's event recorder drops under pressure)."""
        if self.notices_pending >= NOTICE_BACKLOG:
            self.notices_dropped += 1
            return
        self.notices_pending += 1
        try:
            async with self.notice_sem:
                body = _event_body(pod, reason, message, "Normal")
                if self.raw is not None:
                    await self.raw.request("POST", f"/api/v1/namespaces/{pod.namespace}/events", body)
                else:
                    await self.client.create(codecs.from_dict(body))
        except Exception as exc:
            log.debug("event %s on %s/%s not posted: %r", reason, pod.namespace, pod.name, exc)
        finally:
            self.notices_pending -= 1

    async def event(self, pod: PodInfo, reason: str, message: str, type_: str = "Normal") -> None:
        obj = codecs.from_dict(_event_body(pod, reason, message, type_))

        async def op() -> None:
            await self.client.create(obj)

        try:
            await self._call(f"event {reason} on {pod.namespace}/{pod.name}", op, attempts=3)
        except Exception as exc:  # an Event is best effort: never block a decision on it
            log.warning("could not post event %s on %s/%s: %r", reason, pod.namespace, pod.name, exc)

    async def evict(self, pod: PodInfo, reason: str, message: str) -> None:
        await self.event(pod, reason, message, "Warning")
        await self.delete_pod(pod.namespace, pod.name)

    async def set_unschedulable(self, pod: PodInfo, message: str) -> None:
        patch = {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": _now(),
        }]}}

        async def op() -> None:
            try:
                await self.client.patch(Pod.Status, pod.name, patch, namespace=pod.namespace,
                                        patch_type=PatchType.STRATEGIC)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

        await self._call(f"condition on {pod.namespace}/{pod.name}", op)
        await self.event(pod, "FailedScheduling", message, "Warning")

    async def project_status(self, name: str, status: dict[str, Any]) -> None:
        async def op() -> None:
            try:
                await self.client.patch(ProjectResource.Status, name, {"status": status},
                                        patch_type=PatchType.MERGE)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

        await self._call(f"status of project {name}", op)
