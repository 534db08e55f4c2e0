"""Property test of the tenancy routes: any body or query (well-typed nonsense included) gets a
2xx or a 4xx that names a field or a rule, never a 500, and a refused request writes nothing."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.testing.embedded import EmbeddedServer

TEXT = st.one_of(st.text(max_size=40), st.sampled_from(
    ["admin", "viewer", "researcher", "department-admin", "project", "department", "cluster",
     "user", "group", "app", "team-a", "", "alice", "x@y", "2026-11-27T00:00:00Z", "-1", "1e309"]))
VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**20), st.floats(), TEXT,
                  st.lists(TEXT, max_size=2))
ROUTES = [
    ("POST", "/api/v1/users", ["username", "password"]),
    ("POST", "/api/v1/authorization/access-rules",
     ["subjectType", "subjectId", "roleName", "scopeType", "scopeId"]),
    ("POST", "/api/v1/org-unit/departments", ["name", "resources"]),
    ("POST", "/api/v1/me/password", ["currentPassword", "newPassword"]),
    ("POST", "/api/v1/apps", ["name"]),
    ("POST", "/api/v1/token", ["grantType", "clientId", "clientSecret", "username", "password"]),
]


@given(route=st.sampled_from(ROUTES), data=st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_tenancy_bodies_never_crash(server: EmbeddedServer, route: Any, data: Any) -> None:
    method, path, fields = route
    body = {f: data.draw(VALUE, label=f) for f in data.draw(
        st.lists(st.sampled_from(fields), unique=True))}
    if data.draw(st.booleans(), label="stray"):
        body["stray"] = 1
    with server.http() as c:
        # json.dumps, not httpx's encoder: non-finite floats go out as Python writes them
        # (Infinity, NaN), as a careless client would send them
        r = c.request(method, path, content=json.dumps(body),
                      headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (path, body, r.text)
        if r.status_code == 422:
            assert ":" in r.json()["message"]


@given(start=TEXT, end=TEXT, by=TEXT, rid=TEXT)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_tenancy_queries_never_crash(server: EmbeddedServer, start: str, end: str, by: str,
                                     rid: str) -> None:
    name = urllib.parse.quote(rid, safe="") or "x"
    with server.http() as c:
        for r in (c.get("/api/v1/reports/usage", params={"from": start, "to": end, "by": by}),
                  c.get("/api/v1/audit/log", params={"from": start, "to": end}),
                  c.delete(f"/api/v1/authorization/access-rules/{name}"),
                  c.get(f"/api/v1/org-unit/departments/{name}")):
            assert r.status_code < 500, (r.request.url, r.text)
