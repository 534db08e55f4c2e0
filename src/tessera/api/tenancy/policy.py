"""Who may do what: a principal's access rules compiled into one index per subject set.

A rule gives a role's permissions on a scope: the cluster (everything), a department (it and its
projects) or a project. ``allowed`` answers from the compiled index (a few set lookups); the
index is rebuilt for a subject set when the store's version changes (a rule, a department or a
project's department changed). ``python -m tessera.bench.authz`` measures it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from tessera.api.tenancy.roles import ROLES
from tessera.api.tenancy.store import Rule, TenancyStore


@dataclass(frozen=True)
class Principal:
    kind: str
    """``app`` (client id and secret), ``user`` (local account) or ``sso`` (OIDC user)."""
    name: str
    groups: tuple[str, ...] = ()
    restricted: bool = False
    """A generated first password not yet changed: only the password change is allowed."""

    @property
    def subjects(self) -> tuple[tuple[str, str], ...]:
        own = ("app", self.name) if self.kind == "app" else ("user", self.name)
        return (own, *(("group", g) for g in self.groups))

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass
class Grant:
    """Where one permission holds."""

    cluster: bool = False
    departments: set[str] = field(default_factory=set)
    projects: set[str] = field(default_factory=set)


class Forbidden(Exception):
    def __init__(self, permission: str, scope: str) -> None:
        super().__init__(f"permission denied: {permission} is missing on {scope}")
        self.permission = permission
        self.scope = scope


def scope_text(project: str | None = None, department: str | None = None) -> str:
    if project is not None:
        return f"project {project}"
    if department is not None:
        return f"department {department}"
    return "the cluster"


class Authorizer:
    def __init__(self, store: TenancyStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cache: dict[tuple[tuple[str, str], ...], tuple[int, dict[str, Grant]]] = {}
        self._departments: tuple[int, dict[str, str]] = (-1, {})

    def department_of(self, project: str) -> str | None:
        version = self.store.version
        cached = self._departments
        if cached[0] != version:
            cached = (version, self.store.project_departments())
            self._departments = cached
        return cached[1].get(project)

    def grants(self, principal: Principal) -> dict[str, Grant]:
        key = principal.subjects
        version = self.store.version
        hit = self._cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        grants = compile_rules(self.store.rules_of(key))
        with self._lock:
            if len(self._cache) > 50_000:
                self._cache.clear()
            self._cache[key] = (version, grants)
        return grants

    def allowed(self, principal: Principal, permission: str, project: str | None = None,
                department: str | None = None) -> bool:
        """Whether ``permission`` holds on the project (or department, or the cluster when
        neither is given)."""
        g = self.grants(principal).get(permission)
        if g is None:
            return False
        if g.cluster:
            return True
        if project is not None:
            if project in g.projects:
                return True
            department = self.department_of(project)
            return department is not None and department in g.departments
        if department is not None:
            return department in g.departments
        return False

    def anywhere(self, principal: Principal, permission: str) -> bool:
        g = self.grants(principal).get(permission)
        return g is not None and (g.cluster or bool(g.departments) or bool(g.projects))

    def require(self, principal: Principal, permission: str, project: str | None = None,
                department: str | None = None) -> None:
        if not self.allowed(principal, permission, project, department):
            raise Forbidden(permission, scope_text(project, department))

    def visible(self, principal: Principal, permission: str,
                projects: Iterable[str]) -> set[str] | None:
        """The projects among ``projects`` where ``permission`` holds; None: all of them."""
        g = self.grants(principal).get(permission)
        if g is None:
            return set()
        if g.cluster:
            return None
        return {p for p in projects if p in g.projects
                or (g.departments and self.department_of(p) in g.departments)}

    def visible_departments(self, principal: Principal, permission: str,
                            departments: Iterable[str]) -> set[str] | None:
        g = self.grants(principal).get(permission)
        if g is None:
            return set()
        if g.cluster:
            return None
        mine = set(g.departments) | {d for p in g.projects
                                     if (d := self.department_of(p)) is not None}
        return {d for d in departments if d in mine}

    def holds_role(self, principal: Principal, role: str, project: str | None = None,
                   department: str | None = None) -> str | None:
        """None when the principal holds every permission of ``role`` on the scope; else the
        first missing permission (a rule may not grant more than its granter holds)."""
        for permission in sorted(ROLES[role]):
            if not self.allowed(principal, permission, project, department):
                return permission
        return None


def compile_rules(rules: Iterable[Rule]) -> dict[str, Grant]:
    grants: dict[str, Grant] = {}
    for r in rules:
        for permission in ROLES.get(r.role, ()):
            g = grants.setdefault(permission, Grant())
            if r.scope_type == "cluster":
                g.cluster = True
            elif r.scope_type == "department":
                g.departments.add(r.scope)
            else:
                g.projects.add(r.scope)
    return grants
