"""Users, applications, roles and access rules, departments and the audit trail, against the
real embedded server (its own process, its SQLite database), through REST and the CLI."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tessera.api.tenancy.guard import POLICY
from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.waiting import wait_until

PASSWORD = "Correct-Horse-42"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("tenancy"), simulate=["2xV100-16GB"])
    s.start()
    try:
        with s.http() as admin:
            for name in ("team-a", "team-b"):
                assert admin.post("/api/v1/org-unit/projects", json={
                    "name": name, "resources": {"gpu": {"deserved": 1}}}).status_code == 201
        yield s
    finally:
        s.cleanup()


def _user(server: EmbeddedServer, name: str, role: str | None = None,
          project: str | None = None) -> httpx.Client:
    """A local user with a role on a project, and a client holding its token."""
    with server.http() as admin:
        r = admin.post("/api/v1/users", json={"username": name, "password": PASSWORD})
        assert r.status_code == 201, r.text
        if role:
            r = admin.post("/api/v1/authorization/access-rules", json={
                "subjectType": "user", "subjectId": name, "roleName": role,
                "scopeType": "project", "scopeId": project})
            assert r.status_code == 201, r.text
    return _login(server, name)


def _login(server: EmbeddedServer, name: str, password: str = PASSWORD) -> httpx.Client:
    r = httpx.post(f"{server.url}/api/v1/token", json={
        "grantType": "password", "username": name, "password": password})
    assert r.status_code == 200, r.text
    return httpx.Client(base_url=server.url, timeout=30,
                        headers={"Authorization": f"Bearer {r.json()['accessToken']}"})


def test_every_api_route_has_a_policy(server: EmbeddedServer) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    open_routes = {("POST", "/api/v1/token"), ("DELETE", "/api/v1/token"), ("GET", "/healthz"),
                   ("GET", "/api/v1/auth/oidc"), ("GET", "/api/v1/auth/oidc/login"),
                   ("GET", "/api/v1/auth/oidc/callback"), ("POST", "/api/v1/auth/oidc/device"),
                   ("POST", "/api/v1/auth/oidc/device/token")}
    missing = [(m.upper(), path) for path, ops in schema["paths"].items() for m in ops
               if (m.upper(), path) not in POLICY and (m.upper(), path) not in open_routes]
    assert missing == []


def test_researcher_of_team_a_cannot_see_submit_to_or_delete_in_team_b(
        server: EmbeddedServer) -> None:
    with server.http() as admin:
        r = admin.post("/api/v1/workloads/trainings", json=submit_body("b-job", "team-b"))
        assert r.status_code == 202, r.text
        b_job = r.json()["workloadId"]
    alice = _user(server, "alice", "researcher", "team-a")
    projects = [p["name"] for p in alice.get("/api/v1/org-unit/projects").json()["projects"]]
    assert projects == ["team-a"]
    # team-b reads exactly like a project that does not exist
    hidden, absent = alice.get("/api/v1/org-unit/projects/team-b"), \
        alice.get("/api/v1/org-unit/projects/no-such")
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["message"].replace("team-b", "X") == \
        absent.json()["message"].replace("no-such", "X")
    r = alice.post("/api/v1/workloads/trainings", json=submit_body("a-job", "team-b"))
    assert r.status_code == 422 and r.json()["message"].startswith("projectId: no project")
    assert alice.delete(f"/api/v1/workloads/trainings/{b_job}").status_code == 404
    assert alice.get(f"/api/v1/workloads/trainings/{b_job}").status_code == 404
    listed = alice.get("/api/v1/workloads").json()["workloads"]
    assert all(w["projectName"] == "team-a" for w in listed)
    # what alice may do in team-a works
    r = alice.post("/api/v1/workloads/trainings", json=submit_body("a-job", "team-a"))
    assert r.status_code == 202, r.text
    assert alice.delete(f"/api/v1/workloads/trainings/{r.json()['workloadId']}").status_code == 202
    # the cluster document hides team-b's workload's name and project
    doc = alice.get("/api/v1/cluster").json()
    tenants = [w for n in doc["nodes"] for g in n["gpus"] for w in g["workloads"]]
    assert all(w["project"] in ("team-a", "") for w in tenants)
    assert "b-job" not in str(tenants)
    # the Overview is read from a snapshot at most a second old: wait for one with the projects
    overview = wait_until("an overview with the projects", lambda: (
        o := alice.get("/api/v1/overview").json())["projects"] and o)
    assert [p["name"] for p in overview["projects"]] == ["team-a"]
    history = alice.get("/api/v1/metrics/history").json()
    assert "team-b" not in str(history) and "b-job" not in str(history)
    with server.http() as admin:
        admin.delete(f"/api/v1/workloads/trainings/{b_job}")


def test_viewer_cannot_mutate_and_the_refusal_names_permission_and_scope(
        server: EmbeddedServer) -> None:
    victor = _user(server, "victor", "viewer", "team-a")
    assert victor.get("/api/v1/org-unit/projects/team-a").status_code == 200
    r = victor.post("/api/v1/workloads/trainings", json=submit_body("v-job", "team-a"))
    assert r.status_code == 403
    assert r.json()["message"] == \
        "permission denied: workloads:create is missing on project team-a"
    r = victor.patch("/api/v1/org-unit/projects/team-a",
                     json={"resources": {"gpu": {"deserved": 2}}})
    assert r.status_code == 403 and "projects:update" in r.json()["message"]
    assert victor.delete("/api/v1/org-unit/projects/team-a").status_code == 403
    assert victor.post("/api/v1/org-unit/departments", json={"name": "d"}).status_code == 403
    assert victor.post("/api/v1/users", json={"username": "x"}).status_code == 403


def test_bad_input_is_refused_naming_field_and_rule(server: EmbeddedServer) -> None:
    with server.http() as admin:
        base = {"subjectType": "user", "subjectId": "alice", "scopeType": "project"}
        r = admin.post("/api/v1/authorization/access-rules",
                       json={**base, "roleName": "superuser", "scopeId": "team-a"})
        assert r.status_code == 422 and r.json()["message"].startswith("roleName: must be one of")
        r = admin.post("/api/v1/authorization/access-rules",
                       json={**base, "roleName": "viewer", "scopeId": "nope"})
        assert r.status_code == 422 and r.json()["message"].startswith("scopeId: no project")
        r = admin.post("/api/v1/users", json={"username": "weak", "password": "short"})
        assert r.status_code == 422
        assert r.json()["message"].startswith("password: is below the password policy")
        assert "short" not in r.text
        before = len(admin.get("/api/v1/authorization/access-rules").json()["accessRules"])
        assert admin.get("/api/v1/users").json()["users"].count("weak") == 0
    # a researcher may not grant a role it does not hold (admin), nor on another project
    rita = _user(server, "rita", "researcher", "team-a")
    r = rita.post("/api/v1/authorization/access-rules", json={
        "subjectType": "user", "subjectId": "rita", "roleName": "admin",
        "scopeType": "project", "scopeId": "team-a"})
    assert r.status_code == 403
    with server.http() as admin:
        after = len(admin.get("/api/v1/authorization/access-rules").json()["accessRules"])
    assert after == before + 1  # rita's own rule only: nothing half-applied


def test_generated_first_password_must_be_changed(server: EmbeddedServer) -> None:
    with server.http() as admin:
        r = admin.post("/api/v1/users", json={"username": "gina"})
        temp = r.json()["tempPassword"]
        admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "user", "subjectId": "gina", "roleName": "viewer",
            "scopeType": "project", "scopeId": "team-a"})
    gina = _login(server, "gina", temp)
    r = gina.get("/api/v1/org-unit/projects")
    assert r.status_code == 403 and "first password must be changed" in r.json()["message"]
    r = gina.post("/api/v1/me/password", json={"currentPassword": temp, "newPassword": "abc"})
    assert r.status_code == 422 and r.json()["message"].startswith("newPassword: is below")
    r = gina.post("/api/v1/me/password", json={"currentPassword": temp,
                                               "newPassword": PASSWORD})
    assert r.status_code == 204
    assert gina.get("/api/v1/org-unit/projects").status_code == 401  # old token revoked
    assert _login(server, "gina").get("/api/v1/org-unit/projects").status_code == 200


def test_deleted_user_token_and_logout_and_regenerated_secret(server: EmbeddedServer) -> None:
    dora = _user(server, "dora", "viewer", "team-a")
    assert dora.get("/api/v1/me").json()["name"] == "dora"
    with server.http() as admin:
        assert admin.delete("/api/v1/users/dora").status_code == 204
    assert dora.get("/api/v1/me").status_code == 401
    ed = _user(server, "ed", "viewer", "team-a")
    assert ed.delete("/api/v1/token").status_code == 204
    assert ed.get("/api/v1/me").status_code == 401
    with server.http() as admin:
        app = admin.post("/api/v1/apps", json={"name": "ci"}).json()
        admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "app", "subjectId": "ci", "roleName": "viewer",
            "scopeType": "project", "scopeId": "team-a"})
        tok = httpx.post(f"{server.url}/api/v1/token", json={
            "clientId": "ci", "clientSecret": app["clientSecret"]}).json()["accessToken"]
        headers = {"Authorization": f"Bearer {tok}"}
        assert httpx.get(f"{server.url}/api/v1/me", headers=headers).status_code == 200
        assert admin.post("/api/v1/apps/ci/secret").status_code == 200
        assert httpx.get(f"{server.url}/api/v1/me", headers=headers).status_code == 401


def test_wrong_secrets_are_throttled_per_client(server: EmbeddedServer) -> None:
    statuses = [httpx.post(f"{server.url}/api/v1/token", json={
        "clientId": "admin", "clientSecret": f"wrong-{i}"}).status_code for i in range(8)]
    assert statuses[:5] == [401] * 5 and 429 in statuses[5:]
    # another client is not slowed by it
    assert httpx.post(f"{server.url}/api/v1/token", json={
        "clientId": "nobody", "clientSecret": "x"}).status_code == 401


def test_department_admin_cannot_exceed_the_department_quota(server: EmbeddedServer) -> None:
    with server.http() as admin:
        assert admin.post("/api/v1/org-unit/departments", json={
            "name": "research", "resources": {"gpu": {"deserved": 2}}}).status_code == 201
        admin.post("/api/v1/users", json={"username": "dan", "password": PASSWORD})
        r = admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "user", "subjectId": "dan", "roleName": "department-admin",
            "scopeType": "department", "scopeId": "research"})
        assert r.status_code == 201, r.text
    dan = _login(server, "dan")
    r = dan.post("/api/v1/org-unit/projects", json={
        "name": "vision", "parentId": "research", "resources": {"gpu": {"deserved": 1.5}}})
    assert r.status_code == 201, r.text
    r = dan.post("/api/v1/org-unit/projects", json={
        "name": "speech", "parentId": "research", "resources": {"gpu": {"deserved": 1}}})
    assert r.status_code == 422
    assert r.json()["message"].startswith("resources.gpu.deserved: the projects of department "
                                          "research would deserve 2.5 GPUs")
    r = dan.patch("/api/v1/org-unit/projects/vision", json={"resources": {"gpu": {"deserved": 3}}})
    assert r.status_code == 422
    assert [p["name"] for p in dan.get("/api/v1/org-unit/projects").json()["projects"]] == \
        ["vision"]
    # outside its department: no projects, no cluster-wide project
    r = dan.post("/api/v1/org-unit/projects", json={"name": "rogue"})
    assert r.status_code == 403
    assert "projects:create is missing on the cluster" in r.json()["message"]
    # a rule inside the department is allowed; one on team-a (not its) reads as no project
    r = dan.post("/api/v1/authorization/access-rules", json={
        "subjectType": "user", "subjectId": "alice", "roleName": "researcher",
        "scopeType": "project", "scopeId": "vision"})
    assert r.status_code == 201, r.text
    r = dan.post("/api/v1/authorization/access-rules", json={
        "subjectType": "user", "subjectId": "alice", "roleName": "researcher",
        "scopeType": "project", "scopeId": "team-a"})
    assert r.status_code == 422 and r.json()["message"].startswith("scopeId: no project")


def test_audit_trail_records_changes_without_secrets(server: EmbeddedServer) -> None:
    secret = "Audit-Secret-Pass-99"
    with server.http() as admin:
        admin.post("/api/v1/users", json={"username": "audrey", "password": secret})
    httpx.post(f"{server.url}/api/v1/token", json={
        "grantType": "password", "username": "audrey", "password": "Wrong-Password-123"})
    with server.http() as admin:
        entries = admin.get("/api/v1/audit/log").json()["entries"]
    create = next(e for e in entries if e["path"] == "/api/v1/users" and e["httpStatus"] == 201)
    assert create["subject"] == "app:admin" and create["action"] == "users:create"
    assert create["source"] == "127.0.0.1"
    failed = next(e for e in entries if e["subject"] == "user:audrey")
    assert failed["httpStatus"] == 401 and failed["action"] == "sign-in"
    db = sqlite3.connect(server.data / "tessera.db")
    dump = "\n".join(db.iterdump())
    assert secret not in dump and "Wrong-Password-123" not in dump
    alice = _login(server, "alice")
    assert alice.get("/api/v1/audit/log").status_code == 403


def test_cli_users_rules_login_and_departments(server: EmbeddedServer) -> None:
    out = server.cli("user", "create", "carl").stdout
    assert "first password" in out
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "user", "create", "cora",
                           "--password-stdin"], input=PASSWORD + "\n", env=server.env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = server.cli("access-rule", "create", "--user", "cora", "--role", "researcher",
                     "--project", "team-a").stdout
    assert "researcher on project team-a" in out
    bad = server.cli("access-rule", "create", "--user", "cora", "--role", "boss",
                     "--project", "team-a", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: --role: must be one of")
    bad = server.cli("access-rule", "create", "--user", "cora", "--role", "viewer",
                     "--project", "nowhere", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: --project: no project")
    rules = server.cli_json("access-rule", "list")
    assert any(r["subjectId"] == "cora" for r in rules)
    server.cli("department", "create", "ops", "--deserved", "1")
    bad = server.cli("project", "create", "big", "--department", "ops", "--deserved", "2",
                     check=False)
    assert bad.returncode == 1 and "deserved" in bad.stderr
    server.cli("project", "create", "small", "--department", "ops", "--deserved", "1")
    ds = server.cli_json("department", "list")
    assert next(d for d in ds if d["name"] == "ops")["projects"] == ["small"]
    # cora logs in non-interactively; her token lands in the config file
    cfg = server.root / "cora.json"
    env = {**server.env, "TESSERA_CONFIG": str(cfg)}
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "login", "--user", "cora",
                           "--password-stdin"], input=PASSWORD + "\n", env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"token"' in cfg.read_text()
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "project", "list",
                           "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "team-b" not in proc.stdout and "team-a" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "submit", "x", "-p",
                           "team-b", "--", "sleep", "1"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "no project" in proc.stderr
    audit = server.cli("audit").stdout
    assert "access-rules:create" in audit or "/api/v1/authorization/access-rules" in audit


def test_expired_token_is_refused(tmp_path_factory: pytest.TempPathFactory,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TESSERA_TOKEN_TTL_SECONDS", "1")
    s = EmbeddedServer(tmp_path_factory.mktemp("ttl"))
    s.start()
    try:
        with s.http() as admin:
            assert admin.get("/api/v1/me").status_code == 200
            time.sleep(1.5)
            r = admin.get("/api/v1/me")
            assert r.status_code == 401 and "expired" in r.json()["message"]
    finally:
        s.cleanup()


def test_allowed_hosts_and_metrics_token(tmp_path_factory: pytest.TempPathFactory,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_ALLOWED_HOSTS", "127.0.0.1,tessera.example.com")
    monkeypatch.setenv("TESSERA_METRICS_REQUIRE_TOKEN", "true")
    s = EmbeddedServer(tmp_path_factory.mktemp("hosts"))
    s.start()
    try:
        r = httpx.get(f"{s.url}/api/v1/me", headers={"Host": "evil.example.org"})
        assert r.status_code == 400 and "answers only for" in r.json()["message"]
        assert httpx.get(f"{s.url}/healthz", headers={"Host": "10.1.2.3"}).status_code == 200
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        with s.http() as admin:
            assert admin.get("/metrics").status_code == 200
            assert admin.get("/api/v1/me", headers={"Host": "tessera.example.com"}
                             ).status_code == 200
    finally:
        s.cleanup()
