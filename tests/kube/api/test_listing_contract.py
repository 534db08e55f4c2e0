"""One listing contract, two backends: the workload list's ``filterBy``, ``sortBy`` /
``sortOrder``, ``search``, ``offset`` / ``limit`` / ``next``, ``fields`` / ``shape=rows`` and
their refusals give the same answers in embedded mode (SQL, ``local/store.py``) and on
Kubernetes (Python over the API server's objects, ``kube/cluster_workloads.py``). The same
requests run against a real embedded server and a real REST API server on the test cluster (as
its ServiceAccount with the chart's RBAC); workloads stay pending on Kubernetes (no scheduler
here), which the listing does not depend on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tessera.kube import names
from tessera.testing.embedded import EmbeddedServer, submit_body
from tessera.testing.kube_api import KubeApiServer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=["embedded", "kubernetes"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[EmbeddedServer]:
    s: EmbeddedServer
    if request.param == "embedded":
        s = EmbeddedServer(tmp_path_factory.mktemp("contract-embedded"), simulate=["2xV100-16GB"])
    else:
        cluster = request.getfixturevalue("kube_cluster")
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd", "--all")
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "api-rbac.yaml"))
        kubeconfig = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-api")
        s = KubeApiServer(tmp_path_factory.mktemp("contract-kube"), kubeconfig)
    s.start()
    try:
        with s.http() as c:
            r = c.post("/api/v1/org-unit/projects", json={
                "name": "p-list", "resources": {"gpu": {"deserved": 0, "limit": None}}})
            assert r.status_code == 201, r.text
            for name in ("c-one", "a-two", "b-three"):
                r = c.post("/api/v1/workloads/trainings", json=submit_body(name, "p-list"))
                assert r.status_code == 202, r.text
        yield s
    finally:
        s.cleanup()


def _names(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [w["name"] for w in r.json()["workloads"]]


def test_filter_sort_and_pages(backend: EmbeddedServer) -> None:
    with backend.http() as c:
        page = c.get("/api/v1/workloads", params={
            "filterBy": "projectName==p-list", "sortBy": "name", "limit": 2}).json()
        assert [w["name"] for w in page["workloads"]] == ["a-two", "b-three"]
        assert page["total"] == 3 and page["next"] == 2
        r = c.get("/api/v1/workloads", params={
            "filterBy": "projectName==p-list", "sortBy": "name", "offset": 2, "limit": 2})
        assert _names(r) == ["c-one"] and r.json()["next"] is None
        r = c.get("/api/v1/workloads", params={
            "filterBy": "projectName==p-list", "sortBy": "name", "sortOrder": "desc"})
        assert _names(r) == ["c-one", "b-three", "a-two"]
        assert _names(c.get("/api/v1/workloads", params={
            "filterBy": "projectName==nobody", "sortBy": "name"})) == []


def test_search_and_type(backend: EmbeddedServer) -> None:
    with backend.http() as c:
        assert _names(c.get("/api/v1/workloads", params={
            "filterBy": "projectName==p-list", "search": "thr"})) == ["b-three"]
        assert _names(c.get("/api/v1/workloads/trainings", params={
            "filterBy": "projectName==p-list", "sortBy": "name"})) == ["a-two", "b-three", "c-one"]
        assert _names(c.get("/api/v1/workloads/workspaces", params={
            "filterBy": "projectName==p-list"})) == []


def test_fields_as_rows(backend: EmbeddedServer) -> None:
    with backend.http() as c:
        r = c.get("/api/v1/workloads", params={
            "filterBy": "projectName==p-list", "sortBy": "name", "fields": "phase,name",
            "shape": "rows"})
        assert r.status_code == 200, r.text
        assert r.json()["columns"] == ["phase", "name"]
        assert [row[1] for row in r.json()["rows"]] == ["a-two", "b-three", "c-one"]
        assert all(len(row) == 2 and row[0] for row in r.json()["rows"])


@pytest.mark.parametrize("params, field", [
    ({"fields": "name,colour"}, "fields"),
    ({"filterBy": "colour==red"}, "filterBy"),
    ({"limit": 0}, "limit"),
    ({"sortBy": "colour"}, "sortBy"),
])
def test_bad_queries_are_refused_naming_the_parameter(backend: EmbeddedServer,
                                                      params: dict[str, object],
                                                      field: str) -> None:
    with backend.http() as c:
        r = c.get("/api/v1/workloads", params=params)
        assert r.status_code == 422 and r.json()["message"].startswith(field), r.text
