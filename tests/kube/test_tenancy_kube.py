"""Tenancy on Kubernetes, against the real API server: access rules become RoleBindings in the
project namespaces (reconciled when rules change or a binding is removed by hand), checked
with the API server's own authorizer (``kubectl auth can-i --as``), so kubectl access and
tessera's agree; the REST API refuses a researcher of one project in another exactly as in
embedded mode; the API server runs as its ServiceAccount with deploy/api-rbac.yaml's rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from tessera.api.tenancy.store import Rule
from tessera.kube import names
from tessera.kube.tenancy_sync import MANAGED, desired_bindings
from tessera.testing.cluster import TestCluster
from tessera.testing.kube_api import KubeApiServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
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
    assert got == [("ns-a", "admin", "User", "oidc:root"), ("ns-a", "edit", "User", "oidc:alice"),
                   ("ns-b", "admin", "User", "oidc:root"), ("ns-b", "view", "Group", "ml"),
                   ("ns-c", "admin", "User", "oidc:root")]


@pytest.fixture(scope="module")
def server(kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KubeApiServer]:
    kube_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "api-rbac.yaml"))
    kubeconfig = kube_cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-api")
    s = KubeApiServer(tmp_path_factory.mktemp("kube-tenancy"), kubeconfig)
    s.start()
    try:
        yield s
    finally:
        s.cleanup()


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
