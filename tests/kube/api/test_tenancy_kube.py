"""Tenancy on Kubernetes, against the real API server: access rules become RoleBindings in the
project namespaces (reconciled when rules change or a binding is removed by hand), checked
with the API server's own authorizer (``kubectl auth can-i --as``), so kubectl access and
tessera's agree; the REST API refuses a researcher of one project in another exactly as in
embedded mode; the API server runs as its ServiceAccount with deploy/api-rbac.yaml's rules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from tessera.api.tenancy.store import Rule
from tessera.kube import names
from tessera.kube.tenancy_sync import MANAGED, desired_bindings
from tessera.testing.cluster import TestCluster, start_scheduler
from tessera.testing.kube_api import KubeApiServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "Correct-Horse-42"


def _rule(i: int, st: str, s: str, role: str, scope_type: str, scope: str) -> Rule:
    return Rule(i, st, s, role, scope_type, scope, 0.0, "t")


def test_desired_bindings_cover_scopes_and_skip_apps() -> None:
    rules = [_rule(1, "user", "alice", "researcher", "project", "a"),
             _rule(2, "group", "ml", "viewer", "department", "d"),
             _rule(3, "app", "ci", "admin", "cluster", ""),
             _rule(4, "user", "root", "admin", "cluster", "")]
    want = desired_bindings(rules, {"a": "ns-a", "b": "ns-b", "c": "ns-c"}, {"b": "d"},
                            user_prefix="oidc:")
    got = sorted((b.namespace, b.role, b.kind, b.subject) for b in want.values())
    assert got == [("ns-a", "tessera-project-admin", "User", "oidc:root"),
                   ("ns-a", "tessera-researcher", "User", "oidc:alice"),
                   ("ns-b", "tessera-project-admin", "User", "oidc:root"),
                   ("ns-b", "tessera-viewer", "Group", "ml"),
                   ("ns-c", "tessera-project-admin", "User", "oidc:root")]


@pytest.fixture(scope="module")
def server(kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KubeApiServer]:
    before = list(kube_cluster.processes)
    assert start_scheduler(kube_cluster) is not None  # also applies the CRDs
    started = [p for p in kube_cluster.processes if p not in before]
    kube_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "api-rbac.yaml"))
    kubeconfig = kube_cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-api")
    s = KubeApiServer(tmp_path_factory.mktemp("kube-tenancy"), kubeconfig)
    s.start()
    try:
        yield s
    finally:
        s.cleanup()
        for p in reversed(started):  # the scheduler holds the leader Lease otherwise
            p.stop()
            kube_cluster.processes.remove(p)


def _can(cluster: TestCluster, verb: str, ns: str, *who: str) -> bool:
    out = cluster.kubectl("auth", "can-i", verb, "pods", "-n", ns, *who, check=False)
    return out.stdout.strip() == "yes"


def test_rules_become_rolebindings_that_kubernetes_enforces(
        server: KubeApiServer, kube_cluster: TestCluster) -> None:
    client = kube_cluster.client()
    with server.http() as admin:
        for p in ("ten-a", "ten-b"):
            r = admin.post("/api/v1/org-unit/projects", json={"name": p})
            assert r.status_code == 201, r.text
        admin.post("/api/v1/users", json={"username": "alice", "password": PASSWORD})
        r = admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "user", "subjectId": "alice", "roleName": "researcher",
            "scopeType": "project", "scopeId": "ten-a"})
        assert r.status_code == 201, r.text
        alice_rule = r.json()["id"]
        r = admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "group", "subjectId": "ml-viewers", "roleName": "viewer",
            "scopeType": "project", "scopeId": "ten-b"})
        assert r.status_code == 201, r.text
    wait_until("alice may create pods in ten-a",
               lambda: _can(kube_cluster, "create", "ten-a", "--as", "alice"), timeout=30)
    assert not _can(kube_cluster, "create", "ten-b", "--as", "alice")
    assert not _can(kube_cluster, "list", "ten-b", "--as", "alice")
    wait_until("ml-viewers may list pods in ten-b", lambda: _can(
        kube_cluster, "list", "ten-b", "--as", "bo", "--as-group", "ml-viewers"), timeout=30)
    assert not _can(kube_cluster, "create", "ten-b", "--as", "bo", "--as-group", "ml-viewers")
    # tessera's REST API agrees: alice sees ten-a only
    token = httpx.post(f"{server.url}/api/v1/token", json={
        "grantType": "password", "username": "alice", "password": PASSWORD}).json()
    with httpx.Client(base_url=server.url, timeout=30, headers={
            "Authorization": f"Bearer {token['accessToken']}"}) as alice:
        names_seen = [p["name"] for p in alice.get("/api/v1/org-unit/projects").json()["projects"]]
        assert names_seen == ["ten-a"]
        assert alice.get("/api/v1/org-unit/projects/ten-b").status_code == 404
    # reconciled: a binding deleted by hand comes back; a deleted rule's binding goes
    [mine] = [b for b in client.list(RoleBinding, namespace="ten-a", labels=MANAGED)]
    client.delete(RoleBinding, mine.metadata.name, namespace="ten-a")
    wait_until("the binding is back", lambda: list(
        client.list(RoleBinding, namespace="ten-a", labels=MANAGED)), timeout=30)
    with server.http() as admin:
        assert admin.delete(f"/api/v1/authorization/access-rules/{alice_rule}").status_code == 204
    wait_until("alice's binding is gone", lambda: not list(
        client.list(RoleBinding, namespace="ten-a", labels=MANAGED)), timeout=30)
    assert not _can(kube_cluster, "create", "ten-a", "--as", "alice")


def test_gpu_hours_of_a_half_gpu_workload_on_kubernetes(server: KubeApiServer) -> None:
    """The API server observes allocations each reconcile: a 0.5 GPU workload that runs and is
    suspended is charged 0.5 x its running time, within the reconcile interval."""
    with server.http() as admin:
        assert admin.post("/api/v1/org-unit/projects", json={
            "name": "ten-acct", "resources": {"gpu": {"deserved": 1}}}).status_code == 201
        r = admin.post("/api/v1/workloads/trainings", json={
            "name": "half", "projectId": "ten-acct", "spec": {
                "command": "sleep", "args": "600",
                "compute": {"gpuRequestType": "portion", "gpuPortionRequest": 0.5}}})
        assert r.status_code == 202, r.text
        wid = r.json()["workloadId"]
        server.wait_phase(admin, "trainings", wid, "Running", timeout=60)
        t_run = time.time()
        time.sleep(4.0)
        assert admin.post(f"/api/v1/workloads/trainings/{wid}/suspend").status_code == 202
        t_stop = time.time()
        wait_until("suspended", lambda: admin.get(f"/api/v1/workloads/trainings/{wid}").json()
                   ["gpus"]["allocated"] == 0, timeout=60)
        time.sleep(1.0)
        span = {"from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_run - 3600)),
                "to": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60)),
                "by": "workload"}
        rows = admin.get("/api/v1/reports/usage", params=span).json()["rows"]
    [row] = [r for r in rows if r["workload"] == wid]
    seconds = row["gpu_hours_allocated"] * 3600 / 0.5
    assert (t_stop - t_run) - 1.5 < seconds < (t_stop - t_run) + 3.0, (seconds, t_stop - t_run)
    assert row["project"] == "ten-acct"


def test_department_quota_applies_in_tessera_scheduler(
        server: KubeApiServer, kube_cluster: TestCluster) -> None:
    """Departments are mirrored as Project objects above their projects' (spec.parent), and
    tessera-scheduler applies the department's limit: a whole-GPU workload its own project
    allows waits, naming the department, until the department's limit is raised. The REST
    project list leaves the department's object out."""
    from tessera.kube.objects import ProjectResource

    client = kube_cluster.client()
    with server.http() as admin:
        r = admin.post("/api/v1/org-unit/departments", json={
            "name": "ten-dept", "resources": {"gpu": {"deserved": 1, "limit": 1}}})
        assert r.status_code == 201, r.text
        for p in ("ten-d1", "ten-d2"):
            r = admin.post("/api/v1/org-unit/projects", json={
                "name": p, "parentId": "ten-dept",
                "resources": {"gpu": {"deserved": 0.5, "limit": 1}}})
            assert r.status_code == 201, r.text
        wait_until("the department's Project object and its projects' parent", lambda: all(
            (client.get(ProjectResource, p).get("spec") or {}).get("parent") == "ten-dept"
            for p in ("ten-d1", "ten-d2")), timeout=30)
        dept = client.get(ProjectResource, "ten-dept")
        assert dept.metadata.labels["tessera.io/department"] == "true"
        assert dept["spec"]["resources"]["gpu"] == {"deserved": 1.0, "limit": 1.0,
                                                    "overQuotaWeight": 1.0}
        listed = [p["name"] for p in admin.get("/api/v1/org-unit/projects").json()["projects"]]
        assert "ten-dept" not in listed and "ten-d1" in listed
        assert admin.get("/api/v1/org-unit/projects/ten-dept").status_code == 404
        wids = []
        for name, project in (("one", "ten-d1"), ("two", "ten-d2")):
            r = admin.post("/api/v1/workloads/trainings", json={
                "name": name, "projectId": project, "spec": {
                    "command": "sleep", "args": "600", "compute": {"gpuDevicesRequest": 1}}})
            assert r.status_code == 202, r.text
            wids.append(r.json()["workloadId"])
            if name == "one":
                server.wait_phase(admin, "trainings", wids[0], "Running", timeout=60)
        doc = wait_until("the department's reason", lambda: "limit" in (
            d := admin.get(f"/api/v1/workloads/trainings/{wids[1]}").json())["phaseMessage"]
            and d, timeout=60)
        assert doc["phase"] == "Pending"
        assert "department ten-dept is at its limit of 1 GPU" in doc["phaseMessage"], doc
        r = admin.put("/api/v1/org-unit/departments/ten-dept", json={
            "resources": {"gpu": {"deserved": 1, "limit": 2}}})
        assert r.status_code == 200, r.text
        server.wait_phase(admin, "trainings", wids[1], "Running", timeout=60)
        for wid in wids:
            admin.delete(f"/api/v1/workloads/trainings/{wid}")
