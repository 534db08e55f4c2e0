"""A scaling inference's replica proxy (tessera.kube.replica_proxy, the real program) and what the
autoscaler makes of its ``/activity`` (tessera.kube.replica_activity): the times connections
closed on the autoscaler's clock, what it missed, and the proxy's exit on SIGTERM (the pod
deleted) that neither cuts a request nor keeps an idle pod."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tessera.bench.inference_kube import MODEL_SERVER
from tessera.core.autoscale import ScalingRule, decide, total
from tessera.kube.replica_activity import Activity, fetch
from tessera.testing.embedded import free_port
from tests.waiting import wait_until


def test_activity_is_put_on_the_autoscalers_clock_and_gaps_are_unknown() -> None:
    st = Activity(known_since=0.0)
    # Bucket 1: 3 opened at 95 (age 5 at 100), the last closed at 97 (age 3).
    st.update("a", {"open": 0, "next": 2, "buckets": [[1, 5.0, 3.0, 3, 0, 3]]}, 100.0)
    assert total(st.series()) == [(95.0, 3), (97.0, 0)]
    assert st.opened() == [97.0] * 3 and st.known_since == 0.0
    rule = ScalingRule(1, 3, "concurrency", 1, 2)
    d = decide(rule, 3, total(st.series()), 100.0, st.known_since)
    assert (d.replicas, d.lower_since) == (1, 97.0)  # the close, not the look at 100
    # A proxy first read with buckets it no longer keeps (ids 1-4 gone): unknown before now.
    st.update("b", {"open": 1, "next": 9, "buckets": [[5, 1.0, 1.0, 1, 1, 1]]}, 101.0)
    assert st.known_since == 101.0
    assert decide(rule, 3, total(st.series()), 102.0, st.known_since).replicas == 3
    # A pod gone: its connections count no more from then; forgotten after the horizon.
    st.went({"a"}, 103.0)
    assert total(st.series())[-1] == (103.0, 0)
    st.prune(104.0)
    assert set(st.pods) == {"a"} and st.pods["a"].base == (97.0, 0)
    assert st.unread_recently(["a"], 105.0) == ["a"] and st.unread_recently(["a"], 111.0) == []
    # Its proxy restarted (a new boot, ids from 1 again): not mistaken for the old buckets.
    st.update("a", {"open": 0, "next": 1, "boot": "x", "buckets": []}, 106.0)
    st.update("a", {"open": 1, "next": 2, "boot": "y", "buckets": [[1, 0.5, 0.5, 1, 1, 1]]},
              107.0)
    assert st.known_since == 107.0 and total(st.series()) == [(106.5, 1)]


@pytest.fixture
def proxy() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    port, target, metrics = free_port(), free_port(), free_port()
    model = subprocess.Popen([sys.executable, "-c", MODEL_SERVER, str(target)])
    proc = subprocess.Popen([sys.executable, "-m", "tessera.kube.replica_proxy",
                             f"--port={port}", f"--target={target}",
                             f"--metrics-port={metrics}"],
                            env={"POD_IP": "127.0.0.1", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": ":".join(sys.path)})
    try:
        wait_until("the proxy answers", lambda: _get(port, 0) == 200, timeout=30)
        yield proc, port, metrics
    finally:
        for p in (proc, model):
            p.kill()
            p.wait()


def _get(port: int, seconds: float) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/{seconds}", timeout=30).status_code
    except httpx.HTTPError:
        return None


def test_proxy_reports_the_close_and_drains_on_sigterm(
        proxy: tuple[subprocess.Popen[bytes], int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, port, metrics = proxy
    monkeypatch.setattr("tessera.kube.replica_proxy.METRICS_PORT", metrics)
    st = Activity(known_since=time.time())
    got: list[int | None] = []
    held = threading.Thread(target=lambda: got.append(_get(port, 1.5)))
    held.start()
    time.sleep(0.5)
    doc = fetch("127.0.0.1")
    assert doc is not None and doc["open"] == 1
    proc.send_signal(signal.SIGTERM)  # the pod deleted while a request is in flight
    time.sleep(0.3)
    assert proc.poll() is None  # it finishes the request first
    held.join()
    closed = time.time()
    assert got == [200]
    doc = fetch("127.0.0.1")
    assert doc is not None and doc["open"] == 0
    st.update("p", doc, time.time())
    last = total(st.series())[-1]
    assert last[1] == 0 and closed - 0.3 <= last[0] <= time.time(), (last, closed)
    proc.wait(timeout=10)  # idle: it exits (--drain-quiet 0.5 s), not at the grace period
    assert proc.returncode == 0
