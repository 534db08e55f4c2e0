"""Embedded mode's departments in the scheduler's tree: what the API's tenancy store holds
(departments, each project's department; the same SQLite file) read each cycle and put above
their projects by :func:`tessera.core.departments.with_departments`."""

from __future__ import annotations

from pathlib import Path

from tessera.api.tenancy.store import TenancyStore
from tessera.core.departments import Department, with_departments
from tessera.core.projects import Project, Quota


class DepartmentTree:
    def __init__(self, path: Path) -> None:
        self.store = TenancyStore(path)

    def __call__(self, projects: tuple[Project, ...]) -> tuple[Project, ...]:
        departments = [Department(d.name, Quota(d.deserved, d.limit, d.over_quota_weight))
                       for d in self.store.departments()]
        if not departments:
            return projects
        return with_departments(projects, departments, self.store.project_departments())
