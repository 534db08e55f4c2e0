"""The REST API (FastAPI), shaped like Run:ai's: token, workloads, projects.

Every route but ``/healthz``, ``POST /api/v1/token`` and the OpenAPI documents needs a bearer
token. Errors are ``{code, message, details}``; a refused request changes nothing.
"""


import dataclasses
import json
import logging
import re
import secrets
import sqlite3
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tessera.api import openapi_types
from tessera.api.backend import (
    Backend,
    Conflict,
    NotFound,
    ProjectFields,
    Upstream,
    WorkloadQuery,
    WorkloadSubmission,
)
from tessera.api.cluster_cache import ClusterCache, FreshAfterWrites
from tessera.api.console import mount_console
from tessera.api.exec_slots import ExecSlots
from tessera.api.limits import BodyLimit
from tessera.api.models import (
    CORE_TO_API,
    ExecRequest,
    ProjectCreate,
    ProjectPatch,
    ProjectUpdate,
    WorkloadCreate,
)
from tessera.api.offline_docs import mount_offline_docs
from tessera.api.storage import storage_error
from tessera.api.tenancy.audit import AuditTrail, mount_audit
from tessera.api.tenancy.departments import LOCK as DEPARTMENT_LOCK
from tessera.api.tenancy.departments import (
    check_name_free,
    check_project_fits,
    mount_departments,
    with_department,
)
from tessera.api.tenancy.exposure import Exposure
from tessera.api.tenancy.guard import ApiRefusal, make_guard, principal_of
from tessera.api.tenancy.ledger import Ledger
from tessera.api.tenancy.metering import Meter, interval_from_env, reader
from tessera.api.tenancy.oidc_routes import mount_oidc
from tessera.api.tenancy.reports import AccountingCollector, mount_reports
from tessera.api.tenancy.routes import mount_auth
from tessera.api.tenancy.service import Tenancy
from tessera.api.tenancy.visibility import redact_cluster
from tessera.api.unexpected import AnswerUnexpected
from tessera.core.error_text import rule_of
from tessera.core.errors import InvalidRequest

DEPARTMENTS = DEPARTMENT_LOCK
KINDS = {"trainings": "Training", "workspaces": "Workspace", "inferences": "Inference"}
Kind = Literal["trainings", "workspaces", "inferences"]
FILTER = re.compile(r"^(\w+)(==|!=|=@)(.*)$")
FILTER_KEYS = ("name", "type", "phase", "status", "projectName", "projectId", "nodeName",
               "priorityClass")
SORT_KEYS = ("name", "createdAt", "phase", "projectName", "type", "gpus")
MAX_PAGE = 10_000
BRIEF_KEYS = (
    "workloadId", "name", "requestedName", "type", "projectId", "projectName", "phase",
    "phaseMessage", "createdAt", "startedAt", "completedAt", "exitCode", "priorityClass",
    "preemptible", "nodeName", "gpuDevices", "workers", "minWorkers", "runningPods", "gpus",
    "simulated", "image", "serviceUrls",
)


log = logging.getLogger("tessera.api")


class ApiError(Exception):
    def __init__(self, status: int, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details


def _error(status: int, message: str, details: Any = None) -> JSONResponse:
    return JSONResponse(
        {"code": status, "message": message, "details": details}, status_code=status
    )


def _api_field(field: str) -> str:
    if field in CORE_TO_API:
        return f"spec.compute.{CORE_TO_API[field]}"
    return field


_TYPE_TAGS = frozenset({"int", "float", "str", "bool", "none", "constrained-str", "json-or-python"})


def _type_tag(part: str) -> bool:
    """A union member's name pydantic puts in an error's location (``int``,
    ``function-after[_clean(), constrained-str]``), not a field the user wrote."""
    return part in _TYPE_TAGS or "[" in part


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    parts = []
    details = []
    seen: set[str] = set()
    for err in errors:
        loc = [str(x) for x in err.get("loc", ())
               if x not in ("body", "query", "path") and not _type_tag(str(x))]
        ctx = err.get("ctx") or {}
        if err.get("type") == "invalid_request" and "field" in ctx:
            field = ".".join([*loc, ctx["field"]])
            message = f"{field}: {ctx['rule']}{ctx.get('shown', '')}"
        else:
            if err.get("type") == "json_invalid":
                loc = []  # pydantic places it at the byte offset ("0"), not at a field
            field = ".".join(loc) or "body"
            message = f"{field}: {rule_of(err)}"
            given = err.get("input")
            if isinstance(given, int | float | str) and not isinstance(given, bool) \
                    and len(str(given)) <= 80 and err.get("type") != "missing":
                message += f" (got {given!r})"
        if field in seen:  # one message per field (a union's members each report one)
            continue
        seen.add(field)
        parts.append(message)
        details.append({"field": field, "message": message})
    return "; ".join(parts), details


def create_app(backend: Backend, *, title: str = "tessera") -> FastAPI:
    app = FastAPI(
        title=f"{title} API",
        version="1",
        description="Fractional GPU workloads, projects and quota (Run:ai-shaped REST API).",
        docs_url=None,
        redoc_url=None,
    )
    mount_offline_docs(app)
    openapi_types.install(app)  # every JSON answer typed by a model (tessera.api.response_models)
    app.add_middleware(BodyLimit)
    tenancy = Tenancy(backend.data_dir, backend.auth_store)
    tenancy.ensure_admin_rule()
    authz = tenancy.authz
    app.add_middleware(AuditTrail, store=tenancy.store)
    app.add_middleware(Exposure, resolve=tenancy.resolve)
    guard = make_guard(authz, tenancy.resolve, backend)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.details)

    @app.exception_handler(ApiRefusal)
    async def _refusal(_: Request, exc: ApiRefusal) -> JSONResponse:
        headers = {"Retry-After": exc.message.rsplit(" ", 2)[-2]} if exc.status == 429 else None
        answer = _error(exc.status, exc.message)
        if headers:
            answer.headers.update(headers)
        return answer

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        field = _api_field(exc.field)
        shown = "" if exc.value is None else f" (got {exc.value!r})"
        message = f"{field}: {exc.rule}{shown}"
        return _error(422, message, [{"field": field, "message": message}])

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(Upstream)
    async def _upstream(_: Request, exc: Upstream) -> JSONResponse:
        return _error(502, str(exc))

    def unexpected(exc: Exception) -> JSONResponse:
        """What a route did not expect: the backend's dependency failing (502, said in words)
        or a fault of tessera's (500, logged with its traceback)."""
        upstream = backend.upstream(exc)
        if upstream is not None:
            return _error(502, str(upstream))
        log.error("internal error", exc_info=exc)
        return _error(500, "internal error; the server's log has the details")

    app.add_middleware(AnswerUnexpected, answer=unexpected)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, details = _validation_message(list(exc.errors()))
        return _error(422, message, details)

    @app.exception_handler(sqlite3.Error)
    @app.exception_handler(OSError)
    async def _storage(_: Request, exc: Exception) -> JSONResponse:
        answer = storage_error(exc)
        if answer is None:
            raise exc
        return _error(*answer)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(guard)])
    mount_auth(app, api, tenancy, backend)
    mount_oidc(app, tenancy)
    mount_departments(api, tenancy, backend)
    mount_audit(api, tenancy.store)

    clusters = ClusterCache(backend.cluster)
    app.add_middleware(FreshAfterWrites, cache=clusters)

    def seen(request: Request, permission: str) -> frozenset[str] | None:
        """The projects the caller may ``permission`` (None: every project)."""
        names = [p["name"] for p in backend.projects()]
        visible = authz.visible(principal_of(request), permission, names)
        return None if visible is None else frozenset(visible)

    @api.get("/cluster", tags=["cluster"], response_model=dict[str, Any])
    def cluster(request: Request) -> Response:
        """Nodes and GPUs, with what each device holds, and where the node agents report it
        memory used, loans and utilisation; ``simulated`` says if they are real. Workloads of
        projects the caller cannot read are shown without name or project."""
        # Built at most once a second for every caller (tessera.api.cluster_cache).
        visible = seen(request, "workloads:read")
        return Response(content=clusters.body(
            None if visible is None else lambda doc: redact_cluster(doc, visible)),
            media_type="application/json")

    # -- projects ----------------------------------------------------------------------------

    @api.get("/org-unit/projects", tags=["projects"])
    def list_projects(request: Request) -> dict[str, Any]:
        """The projects the caller may read."""
        visible = seen(request, "projects:read")
        return {"projects": [with_department(tenancy, p) for p in backend.projects()
                             if visible is None or p["name"] in visible]}

    @api.post("/org-unit/projects", status_code=201, tags=["projects"])
    def create_project(body: ProjectCreate) -> dict[str, Any]:
        """A project; ``parentId`` puts it in a department, whose quota bounds its projects'."""
        gpu = body.resources.gpu
        fields = ProjectFields(body.name, gpu.deserved, gpu.limit, gpu.overQuotaWeight,
                               body.priority)
        with DEPARTMENTS:
            check_name_free(tenancy, backend, body.name, "project")
            check_project_fits(tenancy, backend, body.parentId, body.name, gpu.deserved,
                               gpu.limit)
            doc = backend.create_project(fields)
            if body.parentId:
                try:
                    tenancy.store.set_project_department(doc["name"], body.parentId)
                except BaseException:
                    backend.delete_project(doc["name"])  # all or nothing
                    raise
        return with_department(tenancy, doc)

    @api.get("/org-unit/projects/{projectId}", tags=["projects"])
    def get_project(projectId: str) -> dict[str, Any]:
        return with_department(tenancy, backend.project(projectId))

    def _update(projectId: str, fields: ProjectFields) -> dict[str, Any]:
        with DEPARTMENTS:
            name = backend.project(projectId)["name"]
            check_project_fits(tenancy, backend, authz.department_of(name), name,
                               fields.deserved, fields.limit)
            return with_department(tenancy, backend.update_project(projectId, fields))

    @api.put("/org-unit/projects/{projectId}", tags=["projects"])
    def update_project(projectId: str, body: ProjectUpdate) -> dict[str, Any]:
        gpu = body.resources.gpu
        return _update(projectId, ProjectFields(projectId, gpu.deserved, gpu.limit,
                                                gpu.overQuotaWeight, body.priority))

    @api.patch("/org-unit/projects/{projectId}", tags=["projects"])
    def patch_project(projectId: str, body: ProjectPatch) -> dict[str, Any]:
        """Change only the fields given (``resources.gpu.limit: null`` removes the limit);
        unknown fields are refused."""
        deserved, limit, weight, priority = body.merged(backend.project(projectId))
        return _update(projectId, ProjectFields(projectId, deserved, limit, weight, priority))

    @api.delete("/org-unit/projects/{projectId}", status_code=204, tags=["projects"])
    def delete_project(projectId: str) -> Response:
        name = backend.project(projectId)["name"]
        backend.delete_project(projectId)
        tenancy.store.forget_project(name)  # its department and its access rules
        return Response(status_code=204)

    # -- workloads ---------------------------------------------------------------------------

    def list_query(
        filterBy: Annotated[list[str] | None, Query(description="e.g. phase==Running")] = None,
        sortBy: Annotated[Literal[SORT_KEYS], Query()] = "createdAt",  # type: ignore[valid-type]
        sortOrder: Annotated[Literal["asc", "desc"], Query()] = "asc",
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        search: Annotated[str | None, Query(max_length=200)] = None,
        fields: Annotated[str | None, Query(max_length=500, description="Keys to return")] = None,
        shape: Annotated[Literal["objects", "rows"], Query(
            description="rows: {columns, rows} with one array per workload")] = "objects",
    ) -> WorkloadQuery:
        """The query parameters of both workload listings, checked."""
        wanted = None
        if fields:
            wanted = [f for f in fields.split(",") if f]
            unknown = [f for f in wanted if f not in BRIEF_KEYS]
            if unknown:
                raise ApiError(422, f"fields: unknown field {unknown[0]!r}; fields are "
                               f"{', '.join(BRIEF_KEYS)}")
        filters: list[tuple[str, str, str]] = []
        for raw in filterBy or []:
            for part in raw.split(","):
                if not part:
                    continue
                m = FILTER.match(part)
                if m is None or m.group(1) not in FILTER_KEYS:
                    raise ApiError(
                        422,
                        f"filterBy: must be KEY==VALUE, KEY!=VALUE or KEY=@TEXT with KEY one of "
                        f"{', '.join(FILTER_KEYS)} (got {part!r})",
                    )
                filters.append((m.group(1), m.group(2), m.group(3)))
        as_rows = shape == "rows"
        if as_rows and not wanted:
            wanted = list(BRIEF_KEYS)
        return WorkloadQuery(tuple(filters), search, sortBy, sortOrder == "desc", offset, limit,
                             None if wanted is None else tuple(wanted), as_rows)

    def _list(query: WorkloadQuery) -> Response:
        rows, total = backend.workloads_json(query)
        offset, limit = query.offset, query.limit
        count = min(limit, max(total - offset, 0))
        nxt = offset + count if offset + count < total else None
        simulated = "true" if backend.simulated() else "false"
        key = f'"columns":{json.dumps(list(query.fields or ()))},"rows"' if query.rows else '"workloads"'
        body = (f'{{{key}:{rows},"total":{total},'
                f'"next":{"null" if nxt is None else nxt},"simulated":{simulated}}}')
        return Response(content=body, media_type="application/json")

    @api.get("/workloads", tags=["workloads"])
    def list_workloads(request: Request,
                       query: Annotated[WorkloadQuery, Depends(list_query)]) -> Response:
        """The workloads of the projects the caller may read."""
        return _list(dataclasses.replace(query, projects=seen(request, "workloads:read")))

    @api.get("/workloads/{kind}", tags=["workloads"])
    def list_kind(request: Request, kind: Kind,
                  query: Annotated[WorkloadQuery, Depends(list_query)]) -> Response:
        return _list(dataclasses.replace(query, filters=(*query.filters,
                                                          ("type", "==", KINDS[kind])),
                                         projects=seen(request, "workloads:read")))

    @api.post("/workloads/{kind}", status_code=202, tags=["workloads"])
    def create_workload(kind: Kind, body: WorkloadCreate, request: Request) -> dict[str, Any]:
        name = body.name
        if body.useGivenNameAsPrefix:
            name = f"{name[:57]}-{secrets.token_hex(2)}"
        env = {e.name: e.value for e in body.spec.environmentVariables}
        return backend.submit(
            WorkloadSubmission(
                name=name,
                project=body.projectId or body.projectName or "",
                type=KINDS[kind],
                gpu=body.spec.compute.gpu,
                command=body.spec.argv,
                env=env,
                image=body.spec.image,
                working_dir=body.spec.workingDir,
                priority_class=body.spec.priorityClass,
                workers=body.spec.workers,
                min_workers=body.spec.minWorkers,
                spec=body.spec_doc(),
                mig_profile=body.spec.compute.gpuMigProfile,
                compute=(body.spec.compute.gpuComputeRequest, body.spec.compute.gpuComputeLimit,
                         body.spec.compute.gpuComputeMode),
                submitted_by=principal_of(request).label,
            )
        )

    @api.get("/workloads/{kind}/{workloadId}", tags=["workloads"])
    def get_workload(kind: Kind, workloadId: str) -> dict[str, Any]:
        return backend.workload(workloadId, KINDS[kind])

    @api.delete("/workloads/{kind}/{workloadId}", status_code=202, tags=["workloads"])
    def delete_workload(kind: Kind, workloadId: str) -> dict[str, str]:
        backend.delete_workload(workloadId, KINDS[kind])
        return {"workloadId": workloadId, "status": "deleting"}

    @api.post("/workloads/{kind}/{workloadId}/suspend", status_code=202, tags=["workloads"])
    def suspend(kind: Kind, workloadId: str) -> dict[str, Any]:
        return backend.suspend(workloadId, KINDS[kind])

    @api.post("/workloads/{kind}/{workloadId}/resume", status_code=202, tags=["workloads"])
    def resume(kind: Kind, workloadId: str) -> dict[str, Any]:
        return backend.resume(workloadId, KINDS[kind])

    @api.get("/workloads/{kind}/{workloadId}/pods", tags=["workloads"])
    def pods(kind: Kind, workloadId: str) -> dict[str, Any]:
        backend.workload(workloadId, KINDS[kind])
        return {"pods": backend.pods(workloadId)}

    @api.get("/workloads/{kind}/{workloadId}/logs", tags=["workloads"])
    def logs(
        kind: Kind,
        workloadId: str,
        pod: Annotated[int, Query(ge=0, le=63)] = 0,
        offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    ) -> Response:
        """The pod's output from byte ``offset``; ``X-Next-Offset`` says where to go on."""
        backend.workload(workloadId, KINDS[kind])
        data, nxt = backend.logs(workloadId, pod, offset)
        return Response(
            content=data, media_type="text/plain", headers={"X-Next-Offset": str(nxt)}
        )

    exec_slots = ExecSlots()

    @api.post("/workloads/{kind}/{workloadId}/exec", tags=["workloads"])
    async def exec_(kind: Kind, workloadId: str, body: ExecRequest) -> dict[str, Any]:
        """Run a command in one pod's environment (non-interactive; output returned at the end).
        At most ``EXEC_SESSIONS`` (8) run at once, on their own threads; one more gets 429."""
        def run() -> dict[str, Any]:
            backend.workload(workloadId, KINDS[kind])
            return backend.exec_command(workloadId, body.pod, body.command, body.timeoutSeconds)

        return await exec_slots.run(run)

    ledger = Ledger(backend.data_dir / "tessera.db")
    mount_reports(api, tenancy, ledger, lambda: [p["name"] for p in backend.projects()])
    history = mount_console(app, api, backend, [AccountingCollector(ledger)],
                            lambda request: seen(request, "workloads:read"))
    counters = [c.gpu_seconds for c in getattr(backend, "metrics_collectors", list)()
                if hasattr(c, "gpu_seconds")]  # embedded: the compute arbiters' GPU time
    every = interval_from_env()  # GPU-hours used
    Meter(ledger, reader(lambda: history.snapshots.get(every), counters), every).start()
    app.include_router(api)
    return app
