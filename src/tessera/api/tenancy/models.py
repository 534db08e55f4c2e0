"""Request bodies of the tenancy routes (Run:ai's field names where it has them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tessera.api.models import GpuQuota, NameText, SecretText, ShortText, Strict, _clean

SubjectName = Annotated[str, Field(min_length=1, max_length=128,
                                   pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$"),
                        AfterValidator(_clean)]
Password = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_clean)]


class TokenGrant(Strict):
    """``client_credentials`` (clientId, clientSecret; ``app_token`` with AppId/AppSecret is
    the same) or ``password`` (username, password)."""

    grantType: Literal["client_credentials", "app_token", "password"] = "client_credentials"
    clientId: SecretText | None = None
    clientSecret: SecretText | None = None
    AppId: SecretText | None = None
    AppSecret: SecretText | None = None
    username: SecretText | None = None
    password: Password | None = None


class UserCreate(Strict):
    username: SubjectName
    password: Password | None = Field(
        default=None, description="Omit to get a generated first password (tempPassword), "
        "which must be changed at first sign-in")


class PasswordChange(Strict):
    currentPassword: Password
    newPassword: Password


class AppCreate(Strict):
    name: SubjectName


class AccessRuleCreate(Strict):
    subjectId: SubjectName
    subjectType: Literal["user", "group", "app"]
    roleName: ShortText = Field(description="admin, department-admin, researcher or viewer")
    scopeType: Literal["cluster", "department", "project"]
    scopeId: ShortText = Field(default="", description="Department or project name; empty "
                               "for the cluster")


class DepartmentResources(Strict):
    gpu: GpuQuota = Field(default_factory=GpuQuota)


class DepartmentCreate(Strict):
    name: NameText
    resources: DepartmentResources = Field(default_factory=DepartmentResources)


class DepartmentUpdate(Strict):
    resources: DepartmentResources = Field(default_factory=DepartmentResources)
