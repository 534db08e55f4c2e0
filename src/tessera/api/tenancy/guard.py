"""The one place every ``/api/v1`` request is authorized: a router-level dependency that turns
the bearer token into a principal and checks the route's permission on the route's scope.

``POLICY`` names, for every route, the permission it needs and where its scope comes from (the
cluster, any scope (a listing the route filters), the project in the path, the project of the
workload in the path, the project in the body, the department in the path, or the caller
itself). A route missing from ``POLICY`` is refused to everyone but cluster admins (fail closed),
and ``tests/api/test_tenancy.py`` checks that every route of the OpenAPI is in it.
A caller who cannot read a project gets the same 404 as for a project that does not exist.
"""


import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tessera.api.backend import NotFound
from tessera.api.tenancy.policy import Authorizer, Forbidden, Principal

KIND_TYPES = {"trainings": "Training", "workspaces": "Workspace", "inferences": "Inference"}

CLUSTER, ANY, PROJECT, WORKLOAD, BODY_PROJECT, DEPARTMENT, SELF = (
    "cluster", "any", "project", "workload", "body-project", "department", "self")

POLICY: dict[tuple[str, str], tuple[str, str]] = {
    ("GET", "/api/v1/cluster"): ("cluster:read", ANY),
    ("GET", "/api/v1/overview"): ("cluster:read", ANY),
    ("GET", "/api/v1/metrics/history"): ("cluster:read", ANY),
    ("GET", "/api/v1/org-unit/projects"): ("projects:read", ANY),
    ("POST", "/api/v1/org-unit/projects"): ("projects:create", BODY_PROJECT),
    ("GET", "/api/v1/org-unit/projects/{projectId}"): ("projects:read", PROJECT),
    ("PUT", "/api/v1/org-unit/projects/{projectId}"): ("projects:update", PROJECT),
    ("PATCH", "/api/v1/org-unit/projects/{projectId}"): ("projects:update", PROJECT),
    ("DELETE", "/api/v1/org-unit/projects/{projectId}"): ("projects:delete", PROJECT),
    ("GET", "/api/v1/workloads"): ("workloads:read", ANY),
    ("GET", "/api/v1/workloads/{kind}"): ("workloads:read", ANY),
    ("POST", "/api/v1/workloads/{kind}"): ("workloads:create", BODY_PROJECT),
    ("GET", "/api/v1/workloads/{kind}/{workloadId}"): ("workloads:read", WORKLOAD),
    ("DELETE", "/api/v1/workloads/{kind}/{workloadId}"): ("workloads:delete", WORKLOAD),
    ("POST", "/api/v1/workloads/{kind}/{workloadId}/suspend"): ("workloads:update", WORKLOAD),
    ("POST", "/api/v1/workloads/{kind}/{workloadId}/resume"): ("workloads:update", WORKLOAD),
    ("GET", "/api/v1/workloads/{kind}/{workloadId}/pods"): ("workloads:read", WORKLOAD),
    ("GET", "/api/v1/workloads/{kind}/{workloadId}/logs"): ("workloads:read", WORKLOAD),
    ("POST", "/api/v1/workloads/{kind}/{workloadId}/exec"): ("workloads:update", WORKLOAD),
    ("GET", "/api/v1/org-unit/departments"): ("departments:read", ANY),
    ("POST", "/api/v1/org-unit/departments"): ("departments:create", CLUSTER),
    ("GET", "/api/v1/org-unit/departments/{departmentId}"): ("departments:read", DEPARTMENT),
    ("PUT", "/api/v1/org-unit/departments/{departmentId}"): ("departments:update", DEPARTMENT),
    ("DELETE", "/api/v1/org-unit/departments/{departmentId}"): ("departments:delete", CLUSTER),
    ("GET", "/api/v1/users"): ("users:read", ANY),
    ("POST", "/api/v1/users"): ("users:create", ANY),
    ("DELETE", "/api/v1/users/{userId}"): ("users:delete", CLUSTER),
    ("POST", "/api/v1/users/{userId}/logout"): ("users:update", CLUSTER),
    ("POST", "/api/v1/users/{userId}/reset-password"): ("users:update", CLUSTER),
    ("POST", "/api/v1/me/password"): ("", SELF),
    ("GET", "/api/v1/me"): ("", SELF),
    ("GET", "/api/v1/apps"): ("apps:read", CLUSTER),
    ("POST", "/api/v1/apps"): ("apps:create", CLUSTER),
    ("DELETE", "/api/v1/apps/{appId}"): ("apps:delete", CLUSTER),
    ("POST", "/api/v1/apps/{appId}/secret"): ("apps:update", CLUSTER),
    ("GET", "/api/v1/authorization/roles"): ("", SELF),
    ("GET", "/api/v1/authorization/access-rules"): ("access-rules:read", ANY),
    ("POST", "/api/v1/authorization/access-rules"): ("access-rules:create", ANY),
    ("DELETE", "/api/v1/authorization/access-rules/{accessRuleId}"):
        ("access-rules:delete", ANY),
    ("GET", "/api/v1/audit/log"): ("audit:read", CLUSTER),
    ("GET", "/api/v1/reports/usage"): ("reports:read", ANY),
}
"""(method, route path) -> (permission, where its scope comes from)."""


def principal_of(request: Request) -> Principal:
    """The authorized caller of this request (set by the guard)."""
    p: Principal = request.state.principal
    return p


class ApiRefusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def make_guard(authz: Authorizer, resolve_token: Callable[[str], Principal | None],
               backend: Any) -> Callable[..., Any]:
    bearer = HTTPBearer(auto_error=False)

    async def body(request: Request) -> Any:
        if request.method not in ("POST", "PUT", "PATCH"):
            return None
        raw = await request.body()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def guard(request: Request,
              creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
              data: Annotated[Any, Depends(body)]) -> Principal:
        if creds is None or creds.scheme.lower() != "bearer":
            raise ApiRefusal(401, "authentication required: send Authorization: Bearer <token>")
        principal = resolve_token(creds.credentials)
        if principal is None:
            raise ApiRefusal(401, "the token is invalid, revoked or has expired; run tessera login")
        request.state.principal = principal
        route = request.scope.get("route")
        path = getattr(route, "path", request.url.path)
        permission, source = POLICY.get((request.method, path), ("*", CLUSTER))
        if source == SELF:
            return principal
        if principal.restricted:
            raise ApiRefusal(403, "the generated first password must be changed first: run "
                             "tessera user password (POST /api/v1/me/password)")
        params = request.path_params
        try:
            if permission == "*":  # a route without a policy entry: cluster admins only
                if authz.holds_role(principal, "admin") is not None:
                    raise Forbidden("admin", "the cluster")
            elif source == CLUSTER:
                authz.require(principal, permission)
            elif source == ANY:
                if not authz.anywhere(principal, permission):
                    raise Forbidden(permission, "any scope")
            elif source == DEPARTMENT:
                _department(authz, principal, permission, params["departmentId"])
            elif source == BODY_PROJECT:
                _body_scope(authz, principal, permission, data, backend, path)
            else:
                if source == PROJECT:
                    project = _project_name(backend, params["projectId"])
                else:
                    project = str(backend.workload(params["workloadId"],
                                                   KIND_TYPES.get(params["kind"]))["projectName"])
                _project(authz, principal, permission, project,
                         "project" if source == PROJECT else "workload",
                         params.get("workloadId") or params.get("projectId"))
        except Forbidden as exc:
            raise ApiRefusal(403, str(exc)) from None
        return principal

    return guard


def _project_name(backend: Any, id_or_name: str) -> str:
    return str(backend.project(id_or_name)["name"])


def _project(authz: Authorizer, principal: Principal, permission: str, project: str,
             what: str, given: str | None) -> None:
    """403 naming the permission when the caller sees the project; else the 404 of a project
    (or workload) that does not exist."""
    if authz.allowed(principal, permission, project):
        return
    read = "workloads:read" if permission.startswith("workloads") else "projects:read"
    if not authz.allowed(principal, read, project):
        raise NotFound(f"{what} {given} not found")
    raise Forbidden(permission, f"project {project}")


def _department(authz: Authorizer, principal: Principal, permission: str, name: str) -> None:
    if authz.allowed(principal, permission, department=name):
        return
    if authz.store.department(name) is None or \
            not authz.allowed(principal, "departments:read", department=name):
        raise NotFound(f"department {name} not found")
    raise Forbidden(permission, f"department {name}")


def _body_scope(authz: Authorizer, principal: Principal, permission: str, data: Any,
                backend: Any, path: str) -> None:
    if not isinstance(data, dict):
        data = {}
    if path.endswith("/projects"):  # a new project: on its department, else the cluster
        parent = data.get("parentId")
        if isinstance(parent, str) and parent:
            _department(authz, principal, permission, parent)
        else:
            authz.require(principal, permission)
        return
    given = data.get("projectId") or data.get("projectName")
    if not isinstance(given, str) or not given:
        raise ApiRefusal(422, "projectId: is required (or projectName)")
    try:
        project = _project_name(backend, given)
    except NotFound:
        # the backend's own refusal for an unknown project, or its 404 for an invisible one
        if authz.anywhere(principal, permission):
            raise ApiRefusal(422, f"projectId: no project with this id or name (got {given!r})"
                             ) from None
        raise
    if not authz.allowed(principal, permission, project) and \
            not authz.allowed(principal, "workloads:read", project):
        raise ApiRefusal(422, f"projectId: no project with this id or name (got {given!r})")
    authz.require(principal, permission, project)
