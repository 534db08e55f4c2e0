"""Built-in roles and their permissions (pure data), after Run:ai's: a permission is
``resource:action``; a role is a set of them; an access rule gives a role on a scope."""

from __future__ import annotations

RESOURCES = ("cluster", "projects", "departments", "workloads", "users", "apps",
             "access-rules", "audit", "reports")
ACTIONS = ("create", "read", "update", "delete")


def _all(resource: str) -> set[str]:
    return {f"{resource}:{a}" for a in ACTIONS}


ADMIN = frozenset(p for r in RESOURCES for p in _all(r))
DEPARTMENT_ADMIN = frozenset(
    _all("projects") | _all("workloads") | _all("access-rules")
    | {"departments:read", "cluster:read", "reports:read", "users:read", "users:create"})
RESEARCHER = frozenset(_all("workloads") | {"projects:read", "departments:read", "cluster:read",
                                            "reports:read"})
VIEWER = frozenset({"projects:read", "departments:read", "workloads:read", "cluster:read",
                    "reports:read"})

ROLES: dict[str, frozenset[str]] = {
    "admin": ADMIN,
    "department-admin": DEPARTMENT_ADMIN,
    "researcher": RESEARCHER,
    "viewer": VIEWER,
}
"""Role name -> permissions. ``admin`` has every permission; the others are bounded by scope."""

ROLE_TEXT = {
    "admin": "everything, on its scope (on the cluster: users, apps, audit, departments too)",
    "department-admin": "its department's projects and their quotas (inside the department's), "
                        "their workloads, and access rules inside the department",
    "researcher": "submit and operate workloads in its projects; read its projects",
    "viewer": "read only",
}

SCOPE_TYPES = ("cluster", "department", "project")
SUBJECT_TYPES = ("user", "group", "app")
