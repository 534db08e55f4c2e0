"""The documents the REST API answers with, as pydantic models, for ``/openapi.json``
(:mod:`tessera.api.openapi_types` attaches them to the routes).

They describe what the routes already build (both backends); fields a backend adds beyond these
are allowed (``extra="allow"``), so a document may carry more than its model names but never
less or other than it: ``tests/api/test_response_models.py`` validates real answers against
them. Shapes follow Run:ai's REST API where it has them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- auth, users, applications, roles, access rules ----------------------------------------------

class Health(Doc):
    status: str


class Token(Doc):
    accessToken: str
    expiresAt: int = Field(description="Unix time the token expires")
    mustChangePassword: bool | None = Field(None, description="Password grant: the user must "
                                            "change a generated password first")
    username: str | None = Field(None, description="Single sign-on: the provider's user")
    groups: list[str] | None = Field(None, description="Single sign-on: the user's groups")


class OidcInfo(Doc):
    enabled: bool
    issuer: str | None


class DeviceStart(Doc):
    deviceCode: str
    userCode: str
    verificationUri: str
    verificationUriComplete: str | None
    interval: int
    expiresIn: int


class AccessRule(Doc):
    id: str
    subjectType: str = Field(description="user, group or app")
    subjectId: str
    roleName: str
    scopeType: str = Field(description="cluster, department or project")
    scopeId: str
    scopeName: str
    createdAt: str
    createdBy: str


class AccessRuleList(Doc):
    accessRules: list[AccessRule]
    totalRecords: int


class Me(Doc):
    kind: str = Field(description="user, app or sso")
    name: str
    groups: list[str]
    mustChangePassword: bool
    accessRules: list[AccessRule]


class User(Doc):
    id: str
    username: str
    source: str = Field(description="local or sso")
    mustChangePassword: bool
    createdAt: str
    createdBy: str


class UserList(Doc):
    users: list[User]


class UserCreated(Doc):
    id: str
    username: str
    mustChangePassword: bool
    tempPassword: str | None = Field(None, description="The generated first password (when "
                                     "none was given); shown once")


class TempPassword(Doc):
    id: str
    tempPassword: str


class App(Doc):
    id: str
    name: str
    createdAt: str


class AppList(Doc):
    apps: list[App]


class AppSecret(Doc):
    id: str
    clientId: str
    clientSecret: str = Field(description="Shown once")
    name: str | None = None


class Role(Doc):
    name: str
    description: str
    permissions: list[str]


class RoleList(Doc):
    roles: list[Role]


# -- projects and departments ---------------------------------------------------------------------

class GpuQuota(Doc):
    deserved: float
    limit: float | None
    overQuotaWeight: float


class QuotaResources(Doc):
    gpu: GpuQuota


class ProjectStatus(Doc):
    allocated: dict[str, float]


class Project(Doc):
    id: str
    name: str
    resources: QuotaResources
    priority: int
    status: ProjectStatus
    createdAt: str | None
    parentId: str | None = Field(None, description="Its department")
    namespace: str | None = Field(None, description="Kubernetes: its namespace")


class ProjectList(Doc):
    projects: list[Project]


class Department(Doc):
    id: str
    name: str
    resources: QuotaResources
    projects: list[str]
    projectsDeserved: float


class DepartmentList(Doc):
    departments: list[Department]


# -- workloads ------------------------------------------------------------------------------------

class WorkloadGpus(Doc):
    requested: float
    allocated: float
    request: str = Field(description="The request as the user wrote it, e.g. '0.5 GPU'")


class Workload(Doc):
    """A workload as lists show it; one workload's document adds ``spec``, ``pods`` and more."""

    workloadId: str
    name: str
    type: str = Field(description="Training, Workspace, Inference, ...")
    projectId: str | None
    projectName: str | None
    phase: str
    phaseMessage: str
    createdAt: str | None
    startedAt: str | None = None
    completedAt: str | None = None
    gpus: WorkloadGpus | None = None


class WorkloadDetail(Workload):
    spec: dict[str, Any] | None = None
    pods: list[dict[str, Any]] | None = None


class WorkloadList(Doc):
    workloads: list[Workload]
    total: int
    next: str | None = Field(description="The cursor of the next page; null on the last")


class WorkloadDeleted(Doc):
    workloadId: str
    status: str


class Pod(Doc):
    index: int
    phase: str
    nodeName: str | None
    exitCode: int | None = None


class PodList(Doc):
    pods: list[Pod]


class ExecResult(Doc):
    exitCode: int | None
    stdout: str
    stderr: str


# -- cluster, console, reports, audit ------------------------------------------------------------

class AgentState(Doc):
    state: str = Field(description="ok, unreachable, no-agent, not-ready, waiting or simulated")
    message: str
    ageSeconds: float | None


class ClusterGpu(Doc):
    index: int
    uuid: str
    model: str
    memoryBytes: int
    allocatedBytes: int
    workloads: list[dict[str, Any]]


class ClusterNode(Doc):
    name: str
    gpus: list[ClusterGpu]
    agent: AgentState | None = None


class Cluster(Doc):
    backend: str = Field(description="embedded or kubernetes")
    simulated: bool
    scheduler: str
    isolation: str
    nodes: list[ClusterNode]


class OverviewGpus(Doc):
    total: float
    allocated: float
    free: float
    busy: float | None


class OverviewProject(Doc):
    name: str
    deserved: float
    limit: float | None
    allocated: float
    requested: float
    fairShare: float
    state: str = Field(description="over, at or under its fair share")


class Overview(Doc):
    time: float
    simulated: bool
    gpus: OverviewGpus
    workloadsByPhase: dict[str, int]
    projects: list[OverviewProject]


class Utilization(Doc):
    all: list[float | None]
    projects: dict[str, list[float | None]]
    workloads: dict[str, list[float | None]]


class MetricsHistory(Doc):
    retentionHours: float
    interval: float
    time: list[float]
    allocated: list[float]
    total: list[float]
    projects: dict[str, list[float | None]]
    workloads: dict[str, list[float | None]]
    utilization: Utilization
    memoryUsed: dict[str, dict[str, list[int | None]]]


class UsageRow(Doc):
    """One ``by`` key's GPU-hours; the key's field (``project``, ``department``, ``user`` or
    ``workload``) is named by ``by``."""

    gpu_hours_allocated: float
    gpu_hours_used: float | None = Field(description="Measured; null where nothing was")


class UsageReport(Doc):
    from_: str = Field(alias="from")
    to: str
    by: str
    rows: list[UsageRow]


class AuditEntry(Doc):
    id: int
    timestamp: str
    time: float
    subject: str
    source: str
    method: str
    path: str
    action: str
    httpStatus: int
    result: str


class AuditLog(Doc):
    entries: list[AuditEntry]
