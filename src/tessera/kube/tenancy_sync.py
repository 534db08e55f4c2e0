"""Tenancy on Kubernetes, reconciled by the API server's loop (every few seconds):

- **Access rules become RoleBindings** in the project namespaces, so ``kubectl`` access and
  tessera's agree: researcher -> the ClusterRole ``tessera-researcher`` (workloads: pods, Jobs,
  PodGroups, exec and logs), viewer -> ``tessera-viewer`` (read), department-admin and admin ->
  ``tessera-project-admin`` (also Secrets, ServiceAccounts, reading RoleBindings; never
  cluster-wide; the roles ship in deploy/api-rbac.yaml and the chart), in
  the namespaces of the projects the rule's scope covers (a project, a department's projects,
  or every project for the cluster scope). Subjects: a user is an RBAC ``User`` named
  ``TESSERA_KUBE_USER_PREFIX`` + its name, a group a ``Group`` (``TESSERA_KUBE_GROUP_PREFIX``
  + name), so giving the API server the same OIDC issuer with those prefixes makes them the same
  identities. Applications have no Kubernetes identity and get no binding. RoleBindings carry
  ``app.kubernetes.io/managed-by: tessera-api``; missing ones are created, changed or stale ones
  deleted, others are never touched.
- **Departments become Project objects** above their projects' (``spec.parent``), so the
  scheduler applies their quotas (:mod:`tessera.kube.department_sync`).
- **GPU accounting**: the workloads' allocated GPUs are observed each round into the ledger
  (``tessera.api.tenancy.ledger``), so intervals are exact to the reconcile interval.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from tessera.api.tenancy.ledger import Ledger
from tessera.api.tenancy.store import Rule, TenancyStore
from tessera.kube.department_sync import reconcile_departments

log = logging.getLogger(__name__)

MANAGED = {"app.kubernetes.io/managed-by": "tessera-api"}
RULE_LABEL = "tessera.io/access-rule"
CLUSTER_ROLE = {"researcher": "tessera-researcher", "viewer": "tessera-viewer",
                "department-admin": "tessera-project-admin", "admin": "tessera-project-admin"}


@dataclass(frozen=True)
class Binding:
    namespace: str
    name: str
    role: str
    kind: str
    subject: str
    rule_id: int


def desired_bindings(rules: Iterable[Rule], namespaces: dict[str, str],
                     departments: dict[str, str], user_prefix: str = "",
                     group_prefix: str = "") -> dict[tuple[str, str], Binding]:
    """(namespace, name) -> the RoleBinding each rule needs. ``namespaces``: project ->
    namespace; ``departments``: project -> department."""
    out: dict[tuple[str, str], Binding] = {}
    for r in rules:
        if r.subject_type == "app" or r.role not in CLUSTER_ROLE:
            continue
        if r.scope_type == "cluster":
            projects = list(namespaces)
        elif r.scope_type == "department":
            projects = [p for p in namespaces if departments.get(p) == r.scope]
        else:
            projects = [r.scope] if r.scope in namespaces else []
        kind = "User" if r.subject_type == "user" else "Group"
        subject = (user_prefix if kind == "User" else group_prefix) + r.subject
        role = CLUSTER_ROLE[r.role]
        digest = hashlib.sha256(f"{kind}/{subject}/{role}".encode()).hexdigest()[:10]
        for p in projects:
            ns = namespaces[p]
            if not ns:
                continue
            name = f"tessera-{role}-{digest}"
            out[(ns, name)] = Binding(ns, name, role, kind, subject, r.id)
    return out


def _object(b: Binding) -> RoleBinding:
    return RoleBinding(
        metadata=ObjectMeta(name=b.name, namespace=b.namespace,
                            labels={**MANAGED, RULE_LABEL: str(b.rule_id)},
                            annotations={"tessera.io/subject": f"{b.kind}/{b.subject}"}),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=b.role),
        subjects=[Subject(kind=b.kind, name=b.subject, apiGroup="rbac.authorization.k8s.io")])


class TenancySync:
    def __init__(self, client: Any, data_dir: Path,
                 projects: Callable[[], list[dict[str, Any]]],
                 allocations: Callable[[], dict[str, tuple[str, str, str, float]]],
                 every: float = 2.0) -> None:
        self.client = client
        self.store = TenancyStore(data_dir / "tessera.db")
        self.ledger = Ledger(data_dir / "tessera.db")
        self.projects = projects
        self.allocations = allocations
        self.every = every
        self._last = 0.0
        self.user_prefix = os.environ.get("TESSERA_KUBE_USER_PREFIX", "")
        self.group_prefix = os.environ.get("TESSERA_KUBE_GROUP_PREFIX", "")

    def close(self) -> None:
        self.store.close()
        self.ledger.close()

    def step(self) -> None:
        now = time.time()
        try:
            self.ledger.observe(now, self.allocations())
        except Exception as exc:
            log.warning("GPU accounting: observing allocations failed: %r", exc)
        if now - self._last >= self.every:
            self._last = now
            self.reconcile_bindings()
            reconcile_departments(self.client, self.store.departments(),
                                  self.store.project_departments())

    def reconcile_bindings(self) -> tuple[int, int]:
        """Create missing RoleBindings, delete tessera's stale ones: (created, deleted)."""
        namespaces = {p["name"]: p.get("namespace") or "" for p in self.projects()}
        want = desired_bindings(self.store.rules(), namespaces, self.store.project_departments(),
                                self.user_prefix, self.group_prefix)
        have = {(o.metadata.namespace, o.metadata.name): o for o in self.client.list(
            RoleBinding, namespace="*", labels=MANAGED)}
        created = deleted = 0
        for key, obj in have.items():
            b = want.get(key)
            subjects = [(s.kind, s.name) for s in obj.subjects or []]
            if b is None or obj.roleRef.name != b.role or subjects != [(b.kind, b.subject)]:
                try:
                    self.client.delete(RoleBinding, key[1], namespace=key[0])
                    deleted += 1
                except ApiError as exc:
                    log.warning("RoleBinding %s/%s: delete failed: %s", *key, exc)
        for key, b in want.items():
            obj = have.get(key)
            if obj is not None and obj.roleRef.name == b.role and \
                    [(s.kind, s.name) for s in obj.subjects or []] == [(b.kind, b.subject)]:
                continue
            try:
                self.client.create(_object(b))
                created += 1
            except ApiError as exc:
                if exc.status.code != 409:
                    log.warning("RoleBinding %s/%s: create failed: %s", *key, exc)
        return created, deleted


def allocations_of(workloads: Any, nodes: Callable[[], tuple[Any, Any, bool, Any]]
                   ) -> dict[str, tuple[str, str, str, float]]:
    """Workload id -> (name, project, who submitted it, GPUs allocated now), for the ledger."""
    node_map, uuids, simulated, _ = nodes()
    out: dict[str, tuple[str, str, str, float]] = {}
    for entry in workloads.entries():
        doc = workloads.doc(entry, node_map, uuids, brief=True, simulated=simulated,
                            events=False)
        gpus = float((doc.get("gpus") or {}).get("allocated") or 0.0)
        if gpus > 0:
            out[str(doc["workloadId"])] = (str(doc["name"]), str(doc["projectName"]),
                                           str((entry.rec.spec or {}).get("_submittedBy", "")),
                                           gpus)
    return out
