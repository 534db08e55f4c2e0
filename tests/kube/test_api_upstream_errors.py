"""The REST API on the Kubernetes backend when the API server cannot do what it is asked: a
cluster without tessera's CRDs answers 502 naming the fix, never 500 "internal error"
(tessera.kube.upstream). Its own API server, so the shared cluster keeps its CRDs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.testing.cluster import TestCluster
from tessera.testing.kube_api import KubeApiServer


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    cluster = TestCluster()
    cluster.start()
    server = KubeApiServer(tmp_path_factory.mktemp("bare"), Path(cluster.kubeconfig))
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
        cluster.stop()


def test_missing_crds_are_named_with_the_fix(bare: KubeApiServer) -> None:
    for path in ("/api/v1/org-unit/projects", "/api/v1/workloads"):
        r = bare.http().get(path)
        assert r.status_code == 502, (path, r.status_code, r.text)
        message = r.json()["message"]
        assert "CRDs are not installed" in message and "deploy/crds" in message, message
    r = bare.http().post("/api/v1/org-unit/projects", json={"name": "team-a", "resources": {
        "gpu": {"deserved": 1}}})
    assert r.status_code == 502 and "CRDs" in r.json()["message"], r.text
    assert bare.http().get("/healthz").status_code == 200
