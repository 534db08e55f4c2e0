"""Departments on Kubernetes: the API server mirrors its tenancy store's departments as Project
objects (cluster-scoped, no namespace, labelled ``tessera.io/department``) and sets
``spec.parent`` on their projects, so tessera-scheduler's tree has them above their projects
and their quotas apply at placement time (:mod:`tessera.core.departments`; the scheduler reads
``spec.parent`` as it always has). Reconciled with the RoleBindings
(:mod:`tessera.kube.tenancy_sync`): missing department objects are created, changed ones
patched, parents set or cleared, then stale department objects deleted; objects without the
label are never deleted. The REST API's project list leaves department objects out."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.types import PatchType

from tessera.api.tenancy.store import Department
from tessera.kube.objects import ProjectResource

log = logging.getLogger(__name__)

DEPARTMENT_LABEL = "tessera.io/department"
LABELS = {DEPARTMENT_LABEL: "true", "app.kubernetes.io/managed-by": "tessera-api"}


def is_department(obj: Any) -> bool:
    return (obj.metadata.labels or {}).get(DEPARTMENT_LABEL) == "true"


def department_spec(d: Department, priority: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {"deserved": d.deserved, "overQuotaWeight": d.over_quota_weight}
    if d.limit is not None:
        gpu["limit"] = d.limit
    return {"priority": priority, "resources": {"gpu": gpu}}


def _gpu(spec: Mapping[str, Any]) -> dict[str, Any]:
    return dict((spec.get("resources") or {}).get("gpu") or {})


def reconcile_departments(client: Any, departments: list[Department],
                          membership: Mapping[str, str]) -> tuple[int, int, int]:
    """Department objects and projects' parents as the store says: (created or changed,
    parents changed, deleted). ``membership``: project -> department."""
    objs = list(client.list(ProjectResource))
    projects = {o.metadata.name: o for o in objs if not is_department(o)}
    mirrored = {o.metadata.name: o for o in objs if is_department(o)}
    wanted = {d.name: d for d in departments if d.name not in projects}
    for d in departments:
        if d.name in projects:
            log.warning("department %s: a Project object not made for it has its name; its "
                        "quota is not applied by the scheduler", d.name)
    changed = parents = deleted = 0
    for name, d in wanted.items():
        kids = [p for p, dep in membership.items() if dep == name and p in projects]
        priority = max([int((projects[k].get("spec") or {}).get("priority", 100)) for k in kids]
                       or [100])
        spec = department_spec(d, priority)
        have = mirrored.get(name)
        try:
            if have is None:
                client.create(ProjectResource(metadata=ObjectMeta(name=name, labels=LABELS),
                                              spec=spec))
                changed += 1
            else:
                old = have.get("spec") or {}
                if _gpu(old) != spec["resources"]["gpu"] or old.get("priority") != priority:
                    patch = {"spec": {**spec, "resources": {"gpu": {
                        **spec["resources"]["gpu"], "limit": d.limit}}}}
                    client.patch(ProjectResource, name, patch, patch_type=PatchType.MERGE)
                    changed += 1
        except ApiError as exc:
            log.warning("department %s: writing its Project object failed: %s", name, exc)
    for name, obj in projects.items():
        want = membership.get(name) if membership.get(name) in wanted else None
        have_parent = (obj.get("spec") or {}).get("parent") or None
        if have_parent == want or (have_parent is not None and have_parent not in mirrored
                                   and have_parent not in wanted and want is None):
            continue  # as wanted, or a parent someone else set (not one of ours): left alone
        try:
            client.patch(ProjectResource, name, {"spec": {"parent": want}},
                         patch_type=PatchType.MERGE)
            parents += 1
        except ApiError as exc:
            log.warning("project %s: setting its department failed: %s", name, exc)
    for name in mirrored:
        if name not in wanted:
            try:
                client.delete(ProjectResource, name)
                deleted += 1
            except ApiError as exc:
                log.warning("department %s: deleting its Project object failed: %s", name, exc)
    return changed, parents, deleted
