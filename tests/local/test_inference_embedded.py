"""Inference that scales, in embedded mode (tessera.local.inference): replicas behind one stable
URL on 127.0.0.1, added when the metric (open connections) rises above the threshold and taken
away once it has stayed low for the scale-down delay."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tessera.local.exposed_urls import HOST_ENV as EXTERNAL_HOST_ENV
from tessera.testing.embedded import EmbeddedServer, free_port
from tests.waiting import wait_until

SERVER = r'''
import os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(self.path.strip("/") or 0))
        body = os.environ["TESSERA_WORKLOAD_NAME"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''

EXTERNAL = "127.0.0.2"
"""This machine's 'external' address in the test: another loopback address, which the
workload's process (listening on 127.0.0.1 only) does not listen on."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("infer"), simulate=["1xV100-16GB"])
    os.environ[EXTERNAL_HOST_ENV] = EXTERNAL  # the server's external address (--external-url)
    try:
        with s.serving("team", gpu="1"):
            os.environ.pop(EXTERNAL_HOST_ENV, None)
            yield s
    finally:
        os.environ.pop(EXTERNAL_HOST_ENV, None)


def running(server: EmbeddedServer, prefix: str) -> list[str]:
    rows = server.cli_json("list", "-p", "team")["workloads"]
    return sorted(w["name"] for w in rows
                  if w["name"].startswith(prefix + "-") and w["phase"] == "Running")


BOUND = 1.0
"""The scale-down decision is taken between the delay and the delay + this many seconds after
the last connection closed (the control cycle is woken when it is due; docs/workloads.md)."""
SEEN_LATE = 0.25
"""The test's clients see the end of their answer after the proxy saw the connection close (the
model server closes first): up to this much later on a loaded machine."""


def test_inference_scales_on_concurrency_and_back(server: EmbeddedServer, tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SERVER)
    port = free_port()
    delay = 2.0
    got = server.cli("inference", "submit", "svc", "-p", "team", "-g", "0.25", "--port",
                     str(port), "--min-replicas", "1", "--max-replicas", "3", "--metric",
                     "concurrency", "--metric-threshold", "1", "--scale-down-delay", str(delay),
                     "--working-dir", str(tmp_path), "--", sys.executable, str(script))
    url = f"http://127.0.0.1:{port}"
    assert url in got.stdout
    answer = wait_until("the stable URL answers", lambda: _get(f"{url}/0"), timeout=30)
    assert answer == "svc-0"
    assert running(server, "svc") == ["svc-0"]
    # Three requests held open: concurrency 3, threshold 1 per replica -> 3 replicas.
    t0 = time.monotonic()
    answers: list[str] = []
    ends: list[float] = []

    def hold(seconds: float) -> None:
        answers.append(_get(f"{url}/{seconds}") or "")
        ends.append(time.time())

    load = [threading.Thread(target=hold, args=(4,)) for _ in range(3)]
    for t in load:
        t.start()
    wait_until("3 replicas running", lambda: running(server, "svc") == ["svc-0", "svc-1", "svc-2"],
               timeout=30)
    scale_up = time.monotonic() - t0
    for t in load:
        t.join()
    assert answers == ["svc-0"] * 3  # they arrived before the new replicas
    # A lull shorter than the delay, then load again: no replica goes.
    time.sleep(delay / 2)
    lull_end = time.time()
    again = [threading.Thread(target=hold, args=(1.5,)) for _ in range(3)]
    for t in again:
        t.start()
    for t in again:
        t.join()
    end = max(ends)  # the last connection closed (its client saw the answer just before)
    # Idle: back to the minimum, decided the delay after the last connection closed.
    wait_until("back to 1 replica", lambda: running(server, "svc") == ["svc-0"], timeout=30)
    gone = time.time() - end
    with server.http() as http:
        wid = next(w["workloadId"] for w in http.get(
            "/api/v1/workloads", params={"projectId": "team"}).json()["workloads"]
            if w["name"] == "svc-0")
        history = http.get(f"/api/v1/workloads/inferences/{wid}").json()["inference"]["history"]
    after_up = history[[h["replicas"] for h in history].index(3):]
    early = [h for h in after_up if h["replicas"] < 3 and h["time"] < lull_end + 1.4]
    assert not early and history[-1]["replicas"] == 1, (early, history, end)  # none in the lull
    decided = history[-1]["time"] - end
    assert delay - SEEN_LATE <= decided <= delay + BOUND, (decided, history, end)
    assert _get(f"{url}/0") == "svc-0"
    print(f"scale up 1->3 in {scale_up:.1f} s; down 3->1 decided {decided:.2f} s after the last "
          f"connection closed (delay {delay} s), replicas gone after {gone:.2f} s")


def _get(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=30)
        return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def test_bad_inference_flags_are_named(server: EmbeddedServer) -> None:
    port = free_port()
    base = ["inference", "submit", "bad", "-p", "team", "-g", "0.25"]
    cases = [
        (["--port", str(port), "--min-replicas", "3", "--max-replicas", "2",
          "--metric-threshold", "1"], "--min-replicas: must be at most maxReplicas (2)"),
        (["--port", str(port), "--max-replicas", "2", "--metric", "latency",
          "--metric-threshold", "1"], "--metric: must be concurrency or throughput"),
        (["--port", "70000", "--max-replicas", "2", "--metric-threshold", "1"], "--port"),
        (["--max-replicas", "2", "--metric-threshold", "1"], "--port"),
        (["--port", str(port), "--max-replicas", "2"], "--metric-threshold"),
    ]
    for args, message in cases:
        got = server.cli(*base, *args, "--", "true", check=False)
        assert got.returncode != 0 and message in got.stderr, (args, got.stderr)
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        taken = busy.getsockname()[1]
        got = server.cli(*base, "--port", str(taken), "--max-replicas", "2",
                         "--metric-threshold", "1", "--", "true", check=False)
        assert got.returncode != 0 and f"--port: port {taken} is already in use" in got.stderr, \
            got.stderr
    finally:
        busy.close()
    got = server.cli("training", "submit", "t", "-p", "team", "-g", "0.25", "--max-replicas",
                     "2", "--", "true", check=False)
    assert "--max-replicas: only an inference scales" in got.stderr


def test_workspace_external_url_is_reachable(server: EmbeddedServer, tmp_path: Path) -> None:
    """``workspace submit --port P --external-url``: describe shows ``http://EXTERNAL:P``, and an
    HTTP request there reaches the workspace, whose own process listens on 127.0.0.1 only;
    deleting the workspace closes the URL."""
    script = tmp_path / "ws.py"
    script.write_text(SERVER)
    port = free_port()
    got = server.cli("workspace", "submit", "nb", "-p", "team", "-g", "0.25", "--port",
                     str(port), "--external-url",
                     "--working-dir", str(tmp_path), "--", sys.executable, str(script))
    url = f"http://{EXTERNAL}:{port}"
    assert url in got.stdout, got.stdout
    described = server.cli("describe", "nb", "-p", "team").stdout
    assert f"Service URL: http://127.0.0.1:{port}, {url}" in described, described
    assert wait_until("the external URL answers", lambda: _get(f"{url}/0"), timeout=30) == "nb"
    server.cli("delete", "nb", "-p", "team")
    wait_until("the external URL closed", lambda: _refused(EXTERNAL, port), timeout=30)


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return False
    except OSError:
        return True


def test_bad_external_url_is_named(server: EmbeddedServer) -> None:
    got = server.cli("workspace", "submit", "bad", "-p", "team", "--external-url", "--",
                     "true", check=False)
    assert got.returncode != 0 and "--external-url: give --port too" in got.stderr, got.stderr
    busy = socket.create_server((EXTERNAL, 0))
    try:
        taken = busy.getsockname()[1]
        got = server.cli("workspace", "submit", "bad", "-p", "team", "--port", str(taken),
                         "--external-url", "--", "true", check=False)
        assert got.returncode != 0 and \
            f"--external-url: cannot listen on {EXTERNAL}:{taken}" in got.stderr, got.stderr
    finally:
        busy.close()
    assert "bad" not in [w["name"] for w in server.cli_json("list", "-p", "team")["workloads"]]
    got = server.cli("inference", "submit", "bad", "-p", "team", "--port", str(free_port()),
                     "--external-url", "--max-replicas", "2", "--metric-threshold", "1", "--",
                     "true", check=False)
    assert got.returncode != 0 and "--external-url: is for a workspace" in got.stderr, got.stderr
