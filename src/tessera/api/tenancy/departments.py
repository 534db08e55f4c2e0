"""Departments above projects (Run:ai's org units): REST routes, and the check that a
department's GPU quota bounds the sum of its projects' (deserved and limit).

Departments and each project's department are kept by the API server (tenancy store), the same
for both backends; the scheduler puts them above their projects in its tree
(tessera.core.departments: embedded mode reads the store each cycle, on Kubernetes the API
server mirrors them as Project objects, tessera.kube.department_sync), so their quotas apply at
placement time too."""


import threading
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tessera.api.backend import Backend, Conflict, NotFound
from tessera.api.tenancy.guard import principal_of
from tessera.api.tenancy.models import DepartmentCreate, DepartmentUpdate
from tessera.api.tenancy.service import Tenancy
from tessera.api.tenancy.store import Department
from tessera.api.validation import check_name
from tessera.core.errors import InvalidRequest

LOCK = threading.Lock()
"""Held across a quota check and the write it allows (two creates cannot both fit)."""


def department_doc(d: Department, projects: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [p for p in projects if p.get("parentId") == d.name]
    return {"id": d.name, "name": d.name,
            "resources": {"gpu": {"deserved": d.deserved, "limit": d.limit,
                                  "overQuotaWeight": d.over_quota_weight}},
            "projects": [p["name"] for p in mine],
            "projectsDeserved": sum(p["resources"]["gpu"]["deserved"] for p in mine)}


def with_department(tenancy: Tenancy, doc: dict[str, Any]) -> dict[str, Any]:
    doc["parentId"] = tenancy.authz.department_of(doc["name"])
    return doc


def check_name_free(tenancy: Tenancy, backend: Backend, name: str, kind: str) -> None:
    """Departments and projects share one name space (the scheduler's tree, and on Kubernetes
    the Project objects): a new one may not take the other kind's name."""
    if kind == "project" and tenancy.store.department(name) is not None:
        raise Conflict(f"department {name} exists: a project may not have a department's name")
    if kind == "department" and any(p["name"] == name for p in backend.projects()):
        raise Conflict(f"project {name} exists: a department may not have a project's name")


def check_project_fits(tenancy: Tenancy, backend: Backend, department: str | None,
                       project: str | None, deserved: float, limit: float | None) -> None:
    """Refuse a project's quota that would take its department's projects past the
    department's: the sum of deserved at most the department's deserved, each limit at most
    the department's limit."""
    if department is None:
        return
    d = tenancy.store.department(department)
    if d is None:
        raise InvalidRequest("parentId", "no department with this name", department)
    others = 0.0
    for p in backend.projects():
        if p["name"] != project and tenancy.authz.department_of(p["name"]) == department:
            others += float(p["resources"]["gpu"]["deserved"])
    if others + deserved > d.deserved + 1e-9:
        raise InvalidRequest("resources.gpu.deserved",
                             f"the projects of department {department} would deserve "
                             f"{others + deserved:g} GPUs, more than the department's "
                             f"{d.deserved:g}", deserved)
    if d.limit is not None and (limit is None or limit > d.limit + 1e-9):
        raise InvalidRequest("resources.gpu.limit",
                             f"must be at most department {department}'s limit {d.limit:g}",
                             limit)


def mount_departments(api: APIRouter, tenancy: Tenancy, backend: Backend) -> None:
    store, authz = tenancy.store, tenancy.authz

    def projects() -> list[dict[str, Any]]:
        return [with_department(tenancy, p) for p in backend.projects()]

    @api.get("/org-unit/departments", tags=["departments"])
    def list_departments(request: Request) -> dict[str, Any]:
        """The departments the caller may read (a role on one, or on one of its projects)."""
        ds = store.departments()
        seen = authz.visible_departments(principal_of(request), "departments:read",
                                         [d.name for d in ds])
        ps = projects()
        return {"departments": [department_doc(d, ps) for d in ds
                                if seen is None or d.name in seen]}

    @api.post("/org-unit/departments", status_code=201, tags=["departments"])
    def create_department(body: DepartmentCreate) -> dict[str, Any]:
        check_name(body.name)
        gpu = body.resources.gpu
        _check_quota(gpu.deserved, gpu.limit)
        with LOCK:
            if store.department(body.name) is not None:
                raise Conflict(f"department {body.name} already exists")
            check_name_free(tenancy, backend, body.name, "department")
            d = Department(body.name, gpu.deserved, gpu.limit, gpu.overQuotaWeight)
            store.put_department(d, create=True)
        return department_doc(d, [])

    @api.get("/org-unit/departments/{departmentId}", tags=["departments"])
    def get_department(departmentId: str) -> dict[str, Any]:
        d = store.department(departmentId)
        if d is None:
            raise NotFound(f"department {departmentId} not found")
        return department_doc(d, projects())

    @api.put("/org-unit/departments/{departmentId}", tags=["departments"])
    def update_department(departmentId: str, body: DepartmentUpdate) -> dict[str, Any]:
        """New quota; refused when it is less than its projects already deserve."""
        gpu = body.resources.gpu
        _check_quota(gpu.deserved, gpu.limit)
        with LOCK:
            d = store.department(departmentId)
            if d is None:
                raise NotFound(f"department {departmentId} not found")
            ps = projects()
            doc = department_doc(d, ps)
            if doc["projectsDeserved"] > gpu.deserved + 1e-9:
                raise InvalidRequest("resources.gpu.deserved",
                                     f"must be at least what its projects deserve "
                                     f"({doc['projectsDeserved']:g})", gpu.deserved)
            if gpu.limit is not None:
                for p in ps:
                    lim = p["resources"]["gpu"]["limit"]
                    if p.get("parentId") == d.name and (lim is None or lim > gpu.limit + 1e-9):
                        raise InvalidRequest("resources.gpu.limit",
                                             f"project {p['name']}'s limit is above it",
                                             gpu.limit)
            d = Department(d.name, gpu.deserved, gpu.limit, gpu.overQuotaWeight)
            store.put_department(d, create=False)
        return department_doc(d, projects())

    @api.delete("/org-unit/departments/{departmentId}", status_code=204, tags=["departments"])
    def delete_department(departmentId: str) -> Response:
        with LOCK:
            if store.department(departmentId) is None:
                raise NotFound(f"department {departmentId} not found")
            mine = [p for p, d in store.project_departments().items() if d == departmentId]
            if mine:
                raise Conflict(f"department {departmentId} has {len(mine)} project(s); move or "
                               "delete them first")
            store.delete_department(departmentId)
        return Response(status_code=204)


def _check_quota(deserved: float, limit: float | None) -> None:
    if limit is not None and limit < deserved:
        raise InvalidRequest("resources.gpu.limit", f"must be at least deserved ({deserved:g})",
                             limit)
