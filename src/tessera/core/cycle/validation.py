"""What the cycle refuses in a snapshot's workloads, also for adapters to refuse at submission."""

from __future__ import annotations

from collections.abc import Iterable

from tessera.core.errors import InvalidRequest
from tessera.core.projects import ProjectTree
from tessera.core.workloads import Workload


def validate_workload(w: Workload, tree: ProjectTree) -> None:
    """Refuse a workload the cycle would refuse (adapters call this at submission)."""
    w.validate()
    if w.project not in tree:
        raise InvalidRequest(f"workloads.{w.id}.project", "names a project that does not exist", w.project)
    if not tree.is_leaf(w.project):
        raise InvalidRequest(
            f"workloads.{w.id}.project",
            "names a department (a project with child projects); only leaf projects hold workloads",
            w.project,
        )


def validate_workloads(workloads: Iterable[Workload], tree: ProjectTree) -> None:
    seen: set[str] = set()
    for w in workloads:
        if w.id in seen:
            raise InvalidRequest(f"workloads.{w.id}", "is given twice; workload ids must be unique")
        seen.add(w.id)
        validate_workload(w, tree)
