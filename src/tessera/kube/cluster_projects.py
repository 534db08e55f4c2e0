"""Projects on Kubernetes: a cluster-scoped Project object and the namespace its workloads run
in (created with it, and deleted with it when tessera created it)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from tessera.api.backend import Conflict, NotFound, ProjectFields, Upstream
from tessera.api.validation import NAME, check_project
from tessera.core.errors import InvalidRequest
from tessera.kube import names
from tessera.kube import workload_docs as wd
from tessera.kube.department_sync import is_department
from tessera.kube.objects import PodGroupResource, ProjectResource

CREATED_BY = "tessera.io/created-by"


def api_status(exc: ApiError) -> int:
    return int(getattr(exc.status, "code", 0) or 0)


def api_message(exc: ApiError) -> str:
    return str(getattr(exc.status, "message", None) or exc)


SHARE_FIELDS = ("fairShare", "fromUsageHistory", "usageGpuHours")
"""Written by the scheduler (tessera.api.fair_share_doc), shown as the embedded API shows them."""


class ClusterProjects:
    """The API's projects as Project objects and namespaces."""

    def __init__(self, client: Any, lock: threading.Lock) -> None:
        self.client: Any = client
        self._lock = lock
        """Held while creating, so two creates of one name cannot both make a namespace."""

    def doc(self, obj: Any) -> dict[str, Any]:
        spec = obj.get("spec") or {}
        gpu = (spec.get("resources") or {}).get("gpu") or {}
        status = obj.get("status") or {}
        created = wd.created_at(obj)
        return {
            "id": obj.metadata.uid or obj.metadata.name,
            "name": obj.metadata.name,
            "namespace": spec.get("namespace"),
            "resources": {"gpu": {"deserved": float(gpu.get("deserved", 0)),
                                  "limit": None if gpu.get("limit") is None else float(gpu["limit"]),
                                  "overQuotaWeight": float(gpu.get("overQuotaWeight", 1))}},
            "priority": int(spec.get("priority", 100)),
            "status": {"allocated": {"gpu": float((status.get("allocated") or {}).get("gpu", 0))},
                       **{k: status[k] for k in SHARE_FIELDS if k in status}},
            "createdAt": wd.iso(created),
        }

    @staticmethod
    def spec(f: ProjectFields, namespace: str) -> dict[str, Any]:
        gpu: dict[str, Any] = {"deserved": f.deserved, "overQuotaWeight": f.over_quota_weight}
        if f.limit is not None:
            gpu["limit"] = f.limit
        return {"namespace": namespace, "priority": f.priority, "resources": {"gpu": gpu}}

    def create(self, fields: ProjectFields) -> dict[str, Any]:
        check_project(fields)
        with self._lock:
            for obj in self.client.list(ProjectResource):
                if obj.metadata.name == fields.name:
                    raise Conflict(f"project {fields.name} already exists")
                if (obj.get("spec") or {}).get("namespace") == fields.name:
                    raise Conflict(f"namespace {fields.name} already belongs to project "
                                   f"{obj.metadata.name}")
            created_ns = False
            try:
                self.client.create(Namespace(metadata=ObjectMeta(
                    name=fields.name, labels={names.PROJECT: fields.name},
                    annotations={CREATED_BY: wd.MANAGER})))
                created_ns = True
            except ApiError as exc:
                if api_status(exc) != 409:
                    raise Upstream(f"namespace {fields.name}: {api_message(exc)}") from None
            try:
                obj = self.client.create(ProjectResource(
                    metadata=ObjectMeta(name=fields.name),
                    spec=self.spec(fields, fields.name)))
            except ApiError as exc:
                if created_ns:
                    with contextlib.suppress(ApiError):
                        self.client.delete(Namespace, fields.name)
                if api_status(exc) == 409:
                    raise Conflict(f"project {fields.name} already exists") from None
                if api_status(exc) == 422:
                    raise InvalidRequest("resources.gpu", api_message(exc)) from None
                raise Upstream(f"project {fields.name}: {api_message(exc)}") from None
        return self.doc(obj)

    def docs(self) -> list[dict[str, Any]]:
        objs = sorted(self.client.list(ProjectResource), key=wd.created_at)
        return [self.doc(o) for o in objs if not is_department(o)]

    def get(self, id_or_name: str) -> Any:
        if NAME.fullmatch(id_or_name):
            try:
                obj = self.client.get(ProjectResource, id_or_name)
                if not is_department(obj):  # the departments' mirror: not a project
                    return obj
            except ApiError as exc:
                if api_status(exc) != 404:
                    raise Upstream(api_message(exc)) from None
        for obj in self.client.list(ProjectResource):
            if obj.metadata.uid == id_or_name and not is_department(obj):
                return obj
        raise NotFound(f"project {id_or_name} not found")

    def update(self, id_or_name: str, fields: ProjectFields) -> dict[str, Any]:
        obj = self.get(id_or_name)
        fields.name = obj.metadata.name
        check_project(fields)
        spec = self.spec(fields, (obj.get("spec") or {}).get("namespace") or fields.name)
        patch = {"spec": {**spec, "resources": {**((obj.get("spec") or {}).get("resources") or {}),
                                                 "gpu": spec["resources"]["gpu"]}}}
        if fields.limit is None:
            patch["spec"]["resources"]["gpu"]["limit"] = None
        try:
            new = self.client.patch(ProjectResource, fields.name, patch, patch_type=PatchType.MERGE)
        except ApiError as exc:
            raise InvalidRequest("resources.gpu", api_message(exc)) from None
        return self.doc(new)

    def delete(self, id_or_name: str) -> None:
        obj = self.get(id_or_name)
        namespace = (obj.get("spec") or {}).get("namespace")
        if namespace:
            count = len(list(self.client.list(PodGroupResource, namespace=namespace,
                                              labels={names.MANAGED_BY: wd.MANAGER})))
            count += len([p for p in self.client.list(
                Pod, namespace=namespace, fields={"spec.schedulerName": names.SCHEDULER_NAME})
                if not (p.metadata.labels or {}).get(wd.WORKLOAD)
                and (p.metadata.labels or {}).get(names.RESERVATION_LABEL) != "true"])
            if count:
                raise Conflict(f"project {obj.metadata.name} has {count} workload(s); "
                               "delete them first")
        self.client.delete(ProjectResource, obj.metadata.name)
        if namespace:
            with contextlib.suppress(ApiError):
                ns = self.client.get(Namespace, namespace)
                if (ns.metadata.annotations or {}).get(CREATED_BY) == wd.MANAGER:
                    self.client.delete(Namespace, namespace)
