"""A department's quota at placement time in embedded mode (docs/tenancy.md#departments): two
projects each within their own limit, in a department limited to 1 GPU, on a machine with 2
free GPUs: the second whole-GPU workload waits, told that the department is at its limit; when
the department's limit is raised it runs. A department and a project may not share a name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(Path(tmp_path_factory.mktemp("dept")), simulate=["2xV100-16GB"])
    with s.serving():
        yield s


def _workload(c: httpx.Client, wid: str) -> dict[str, Any]:
    return dict(c.get(f"/api/v1/workloads/trainings/{wid}").json())


def test_department_limit_holds_back_a_workload_its_project_allows(server: EmbeddedServer) -> None:
    with server.http() as c:
        r = c.post("/api/v1/org-unit/departments", json={
            "name": "ml", "resources": {"gpu": {"deserved": 1, "limit": 1}}})
        assert r.status_code == 201, r.text
        for p in ("ml-a", "ml-b"):
            r = c.post("/api/v1/org-unit/projects", json={
                "name": p, "parentId": "ml", "resources": {"gpu": {"deserved": 0.5, "limit": 1}}})
            assert r.status_code == 201, r.text
        first = c.post("/api/v1/workloads/trainings", json=submit_body(
            "one", "ml-a", gpuDevicesRequest=1)).json()["workloadId"]
        server.wait_phase(c, "trainings", first, "Running")
        second = c.post("/api/v1/workloads/trainings", json=submit_body(
            "two", "ml-b", gpuDevicesRequest=1)).json()["workloadId"]
        w = wait_until("the department's reason", lambda: (
            w := _workload(c, second))["phase"] == "Pending" and "limit" in w["phaseMessage"]
            and w)
        assert w["phaseMessage"].startswith("department ml is at its limit of 1 GPU"), w
        # raising the department's limit lets it run (the project's own limit allowed it)
        r = c.put("/api/v1/org-unit/departments/ml", json={
            "resources": {"gpu": {"deserved": 1, "limit": 2}}})
        assert r.status_code == 200, r.text
        server.wait_phase(c, "trainings", second, "Running")
        for wid in (first, second):
            c.delete(f"/api/v1/workloads/trainings/{wid}")


def test_departments_and_projects_share_one_name_space(server: EmbeddedServer) -> None:
    with server.http() as c:
        assert c.post("/api/v1/org-unit/projects", json={"name": "solo"}).status_code == 201
        r = c.post("/api/v1/org-unit/departments", json={"name": "solo"})
        assert r.status_code == 409 and "project solo exists" in r.json()["message"], r.text
        assert c.post("/api/v1/org-unit/departments", json={"name": "grp"}).status_code == 201
        r = c.post("/api/v1/org-unit/projects", json={"name": "grp"})
        assert r.status_code == 409 and "department grp exists" in r.json()["message"], r.text
