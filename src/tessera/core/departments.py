"""Departments above projects in the scheduler's tree (Run:ai's and KAI's two-level queues).

The API keeps departments (a GPU quota: deserved, limit, over-quota weight) and each project's
department; :func:`with_departments` puts them in the project tree the cycle divides, so a
department's quota applies at placement time, hierarchically, as the cycle already does for
any parent (``tessera.core.cycle.quota``):

- its **limit** caps the sum of its projects' allocations (a workload that would take the
  department past it waits: ``department D is at its limit of N GPUs``);
- its **deserved** is what the department is guaranteed, divided among its projects by their
  deserved and over-quota weights; non-preemptible workloads stay within the department's
  deserved as well as their project's;
- its **over-quota weight** is its share of idle GPUs against the other departments (and the
  projects that have none).

Pure: no I/O; both backends call it with what their store holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tessera.core.projects import Project, Quota


@dataclass(frozen=True, slots=True)
class Department:
    name: str
    gpu: Quota


def node_name(department: str, projects: Iterable[str]) -> str:
    """The department's name in the tree: its own, unless a project has it (older data; the
    API refuses the clash now), then ``department:NAME``."""
    return f"department:{department}" if department in set(projects) else department


def with_departments(projects: Iterable[Project], departments: Iterable[Department],
                     membership: Mapping[str, str]) -> tuple[Project, ...]:
    """``projects`` with each member of a department (``membership``: project -> department)
    placed under it, and a node for each department that has projects (priority: its
    projects' highest, so a department neither gains nor loses rank against top-level
    projects). A project that already has a parent, or names an unknown department, is left
    where it is."""
    ps = list(projects)
    names = [p.name for p in ps]
    known = {d.name: d for d in departments}
    members: dict[str, list[Project]] = {}
    out: list[Project] = []
    for p in ps:
        d = membership.get(p.name)
        if d in known and p.parent is None:
            p = replace(p, parent=node_name(d, names))
            members.setdefault(d, []).append(p)
        out.append(p)
    for name, kids in members.items():
        out.append(Project(node_name(name, names), gpu=known[name].gpu,
                           priority=max(k.priority for k in kids)))
    return tuple(out)
