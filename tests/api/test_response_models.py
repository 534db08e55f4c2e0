"""Typed responses (tessera.api.openapi_types): every JSON route of the served /openapi.json
answers a named schema with typed properties (a new route left out of the table fails here),
and real answers of a running embedded server validate against their models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.api.openapi_types import REDIRECTS, ROUTES, TEXT, W
from tessera.testing.embedded import EmbeddedServer, submit_body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(Path(tmp_path_factory.mktemp("models")), simulate=["1xV100-16GB"])
    with s.serving():
        yield s


def test_every_json_route_answers_a_typed_schema(server: EmbeddedServer) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    schemas = doc["components"]["schemas"]
    untyped = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            key = (method.upper(), path)
            ok = {c: r for c, r in op["responses"].items() if c.startswith(("2", "3"))}
            assert ok, key
            for code, r in ok.items():
                content = r.get("content") or {}
                if "application/json" in content:
                    ref = content["application/json"]["schema"].get("$ref", "")
                    target = schemas.get(ref.removeprefix("#/components/schemas/"))
                    if not ref or not target or not target.get("properties"):
                        untyped.append((*key, code))
                elif content and "text/plain" not in content:
                    untyped.append((*key, code))
                elif not content and code not in ("204", "302"):
                    untyped.append((*key, code))  # says nothing of what it answers
    assert untyped == []
    assert set(ROUTES) | TEXT | REDIRECTS <= {(m.upper(), p) for p, ops in doc["paths"].items()
                                               for m in ops}
    workload = schemas["WorkloadDetail"]["properties"]
    assert workload["phase"]["type"] == "string" and "workloadId" in workload
    assert schemas["UsageReport"]["properties"]["rows"]["items"]["$ref"].endswith("UsageRow")


def test_real_answers_match_their_models(server: EmbeddedServer) -> None:
    seen: set[tuple[str, str]] = set()

    def check(method: str, template: str, r: httpx.Response) -> Any:
        assert r.status_code < 300, (method, template, r.status_code, r.text)
        ROUTES[(method, template)].model_validate(r.json())
        seen.add((method, template))
        return r.json()

    with server.http() as c:
        check("GET", "/healthz", c.get("/healthz"))
        check("POST", "/api/v1/token", httpx.post(f"{server.url}/api/v1/token",
                                                  json=server.credentials()))
        check("GET", "/api/v1/auth/oidc", c.get("/api/v1/auth/oidc"))
        check("GET", "/api/v1/me", c.get("/api/v1/me"))
        check("POST", "/api/v1/users", c.post("/api/v1/users", json={"username": "mia"}))
        check("GET", "/api/v1/users", c.get("/api/v1/users"))
        check("POST", "/api/v1/users/{userId}/reset-password",
              c.post("/api/v1/users/mia/reset-password"))
        check("POST", "/api/v1/apps", c.post("/api/v1/apps", json={"name": "ci"}))
        check("GET", "/api/v1/apps", c.get("/api/v1/apps"))
        check("POST", "/api/v1/apps/{appId}/secret", c.post("/api/v1/apps/ci/secret"))
        check("GET", "/api/v1/authorization/roles", c.get("/api/v1/authorization/roles"))
        dept = {"name": "dd", "resources": {"gpu": {"deserved": 1, "limit": 1}}}
        check("POST", "/api/v1/org-unit/departments", c.post("/api/v1/org-unit/departments",
                                                              json=dept))
        check("GET", "/api/v1/org-unit/departments", c.get("/api/v1/org-unit/departments"))
        check("GET", "/api/v1/org-unit/departments/{departmentId}",
              c.get("/api/v1/org-unit/departments/dd"))
        check("PUT", "/api/v1/org-unit/departments/{departmentId}",
              c.put("/api/v1/org-unit/departments/dd", json={"resources": dept["resources"]}))
        project = {"name": "pp", "parentId": "dd", "resources": {"gpu": {"deserved": 1,
                                                                         "limit": 1}}}
        check("POST", "/api/v1/org-unit/projects", c.post("/api/v1/org-unit/projects",
                                                           json=project))
        check("GET", "/api/v1/org-unit/projects", c.get("/api/v1/org-unit/projects"))
        check("GET", "/api/v1/org-unit/projects/{projectId}", c.get("/api/v1/org-unit/projects/pp"))
        check("PUT", "/api/v1/org-unit/projects/{projectId}", c.put(
            "/api/v1/org-unit/projects/pp", json={"resources": project["resources"]}))
        check("PATCH", "/api/v1/org-unit/projects/{projectId}", c.patch(
            "/api/v1/org-unit/projects/pp", json={"priority": 60}))
        check("POST", "/api/v1/authorization/access-rules", c.post(
            "/api/v1/authorization/access-rules", json={
                "subjectType": "user", "subjectId": "mia", "roleName": "viewer",
                "scopeType": "project", "scopeId": "pp"}))
        check("GET", "/api/v1/authorization/access-rules",
              c.get("/api/v1/authorization/access-rules"))
        wid = check("POST", "/api/v1/workloads/{kind}", c.post(
            "/api/v1/workloads/trainings", json=submit_body(
                "w", "pp", gpuRequestType="portion", gpuPortionRequest=0.5)))["workloadId"]
        server.wait_phase(c, "trainings", wid, "Running")
        base = f"/api/v1/workloads/trainings/{wid}"
        check("GET", "/api/v1/workloads", c.get("/api/v1/workloads"))
        check("GET", "/api/v1/workloads/{kind}", c.get("/api/v1/workloads/trainings"))
        check("GET", W, c.get(base))
        check("GET", f"{W}/pods", c.get(f"{base}/pods"))
        check("POST", f"{W}/exec", c.post(f"{base}/exec", json={"command": ["true"]}))
        logs = c.get(f"{base}/logs")
        assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
        check("GET", "/api/v1/cluster", c.get("/api/v1/cluster"))
        check("GET", "/api/v1/overview", c.get("/api/v1/overview"))
        check("GET", "/api/v1/metrics/history", c.get("/api/v1/metrics/history"))
        check("GET", "/api/v1/reports/usage", c.get("/api/v1/reports/usage", params={
            "from": "2026-01-01T00:00:00Z", "to": "2026-12-01T00:00:00Z", "by": "workload"}))
        check("POST", f"{W}/suspend", c.post(f"{base}/suspend"))
        server.wait_phase(c, "trainings", wid, "Stopped")
        check("POST", f"{W}/resume", c.post(f"{base}/resume"))
        check("DELETE", W, c.delete(base))
        check("GET", "/api/v1/audit/log", c.get("/api/v1/audit/log", params={"limit": 5}))
    # the device flow needs a provider: its models are checked against Dex in test_sso.py
    assert set(ROUTES) - seen == {("POST", "/api/v1/auth/oidc/device"),
                                  ("POST", "/api/v1/auth/oidc/device/token")}
