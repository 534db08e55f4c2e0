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


def test_a_502_keeps_the_connection_open(bare: KubeApiServer) -> None:
    """Two requests on one keep-alive connection, the first answered 502: the second is
    answered on the same socket (Starlette's catch-all handler used to re-raise after
    answering, and the server closed the connection: a pooled client's next request was reset)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(bare.url)
    token = bare.token()
    request = (f"GET /api/v1/workloads HTTP/1.1\r\nHost: {url.netloc}\r\n"
               f"Authorization: Bearer {token}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        answers = []
        for _ in range(3):
            s.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                assert chunk, f"connection closed after {len(answers)} answer(s)"
                head += chunk
            headers, _, body = head.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in headers.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += s.recv(65536)
            answers.append(headers.split(b" ")[1])
    assert answers == [b"502"] * 3
    assert "Exception in ASGI application" not in (bare.root / "server.log").read_text()
