"""What the cycle refuses in a snapshot's workloads, also for adapters to refuse at submission."""

from __future__ import annotations

from collections.abc import Iterable

from tessera.core.errors import InvalidRequest
from tessera.core.projects import ProjectTree
from tessera.core.workloads import PRIORITY_CLASSES, Workload


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


def plainly_valid(w: Workload, leaves: frozenset[str] | set[str]) -> bool:
    """True only where ``validate_workload`` passes, by a handful of tests that cover the usual
    workload (no gang minimum, anchors, constraints or pod names; a known class; a leaf
    project; started if placed). False says nothing: the full validation then decides, with
    its words. Each rule of ``Workload.validate`` and ``validate_workload`` holds under these
    tests: the id is a non-empty string, there are pods, the class is known, no minimum is set,
    placements are empty or one per pod, constraints/pod names/anchors are empty, a workload
    with placements has ``started_at``, and the project is a leaf (``leaves``: the tree's
    projects without children)."""
    try:
        wid, pods, placements = w.id, w.pods, w.placements
        return (type(wid) is str and wid != "" and type(pods) is tuple and len(pods) > 0
                and w.min_members is None and not w.constraints and not w.pod_names and not w.anchors
                and type(placements) is tuple and (not placements or (len(placements) == len(pods)
                                                                      and w.started_at is not None))
                and type(w.priority_class) is str and w.priority_class in PRIORITY_CLASSES
                and type(w.project) is str and w.project in leaves)
    except Exception:  # an odd field type: let the full validation word it
        return False


def leaf_projects(tree: ProjectTree) -> frozenset[str]:
    """The projects that may hold workloads (no child projects)."""
    return frozenset(name for name in tree.projects if tree.is_leaf(name))


def validate_workloads(workloads: Iterable[Workload], tree: ProjectTree) -> None:
    """Every workload of a snapshot, each as ``validate_workload`` (most through
    ``plainly_valid``, which passes only what it would pass), and ids unique."""
    seen: set[str] = set()
    leaves = leaf_projects(tree)
    for w in workloads:
        if w.id in seen:
            raise InvalidRequest(f"workloads.{w.id}", "is given twice; workload ids must be unique")
        seen.add(w.id)
        if not plainly_valid(w, leaves):
            validate_workload(w, tree)
