"""Typed responses in ``/openapi.json``: every JSON route's answer named by a pydantic model
(:mod:`tessera.api.response_models`), in one table so a new route is one line here.

The routes keep building their documents as before (the models describe them and a test checks
real answers against them, ``tests/api/test_response_models.py``); :func:`install` puts each
model under ``components.schemas`` and points the route's success response at it. Routes that
answer with something else say so: the logs route plain text, the single sign-on redirects a
302. ``tests/api/test_response_models.py`` fails on any JSON route left untyped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tessera.api import response_models as m

W = "/api/v1/workloads/{kind}/{workloadId}"
ROUTES: dict[tuple[str, str], type[BaseModel]] = {
    ("GET", "/healthz"): m.Health,
    ("POST", "/api/v1/token"): m.Token,
    ("GET", "/api/v1/auth/oidc"): m.OidcInfo,
    ("POST", "/api/v1/auth/oidc/device"): m.DeviceStart,
    ("POST", "/api/v1/auth/oidc/device/token"): m.Token,
    ("GET", "/api/v1/me"): m.Me,
    ("GET", "/api/v1/users"): m.UserList,
    ("POST", "/api/v1/users"): m.UserCreated,
    ("POST", "/api/v1/users/{userId}/reset-password"): m.TempPassword,
    ("GET", "/api/v1/apps"): m.AppList,
    ("POST", "/api/v1/apps"): m.AppSecret,
    ("POST", "/api/v1/apps/{appId}/secret"): m.AppSecret,
    ("GET", "/api/v1/authorization/roles"): m.RoleList,
    ("GET", "/api/v1/authorization/access-rules"): m.AccessRuleList,
    ("POST", "/api/v1/authorization/access-rules"): m.AccessRule,
    ("GET", "/api/v1/org-unit/departments"): m.DepartmentList,
    ("POST", "/api/v1/org-unit/departments"): m.Department,
    ("GET", "/api/v1/org-unit/departments/{departmentId}"): m.Department,
    ("PUT", "/api/v1/org-unit/departments/{departmentId}"): m.Department,
    ("GET", "/api/v1/audit/log"): m.AuditLog,
    ("GET", "/api/v1/cluster"): m.Cluster,
    ("GET", "/api/v1/org-unit/projects"): m.ProjectList,
    ("POST", "/api/v1/org-unit/projects"): m.Project,
    ("GET", "/api/v1/org-unit/projects/{projectId}"): m.Project,
    ("PUT", "/api/v1/org-unit/projects/{projectId}"): m.Project,
    ("PATCH", "/api/v1/org-unit/projects/{projectId}"): m.Project,
    ("GET", "/api/v1/workloads"): m.WorkloadList,
    ("GET", "/api/v1/workloads/{kind}"): m.WorkloadList,
    ("POST", "/api/v1/workloads/{kind}"): m.WorkloadDetail,
    ("GET", W): m.WorkloadDetail,
    ("DELETE", W): m.WorkloadDeleted,
    ("POST", f"{W}/suspend"): m.WorkloadDetail,
    ("POST", f"{W}/resume"): m.WorkloadDetail,
    ("GET", f"{W}/pods"): m.PodList,
    ("POST", f"{W}/exec"): m.ExecResult,
    ("GET", "/api/v1/reports/usage"): m.UsageReport,
    ("GET", "/api/v1/overview"): m.Overview,
    ("GET", "/api/v1/metrics/history"): m.MetricsHistory,
}
TEXT = {("GET", f"{W}/logs")}
"""Routes that answer plain text."""
REDIRECTS = {("GET", "/api/v1/auth/oidc/login"), ("GET", "/api/v1/auth/oidc/callback")}
"""Routes that answer with a redirect (302)."""


def _ref(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, str]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                     mode="serialization")
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def typed(doc: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with the table's models in place (in place; returned)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            key = (method.upper(), path)
            responses = op.setdefault("responses", {})
            ok = next((c for c in responses if c.startswith("2")), "200")
            if key in ROUTES:
                responses.setdefault(ok, {"description": "OK"})["content"] = {
                    "application/json": {"schema": _ref(ROUTES[key], schemas)}}
            elif key in TEXT:
                responses.setdefault(ok, {"description": "OK"})["content"] = {
                    "text/plain": {"schema": {"type": "string"}}}
            elif key in REDIRECTS:
                responses.pop(ok, None)
                responses["302"] = {"description": "A redirect (Location)"}
    return doc


def install(app: FastAPI) -> None:
    """``app.openapi`` builds FastAPI's document once, then types it."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = typed(base())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
