"""The Metrics history survives a server restart (kept in the data directory, not in the page):
a real embedded server sampling every 0.3 s is stopped and started again; the samples taken
before are still in /api/v1/metrics/history, a torn last line (a crash mid-write) is skipped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from tessera.testing.embedded import EmbeddedServer


@pytest.fixture
def server(tmp_path) -> Iterator[EmbeddedServer]:  # type: ignore[no-untyped-def]
    os.environ["TESSERA_HISTORY_INTERVAL"] = "0.3"  # the server inherits it
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    try:
        with s.serving("team-a"):
            yield s
    finally:
        os.environ.pop("TESSERA_HISTORY_INTERVAL", None)


def _history(server: EmbeddedServer) -> dict:  # type: ignore[type-arg]
    r = httpx.get(f"{server.url}/api/v1/metrics/history", params={"minutes": 60},
                  headers={"Authorization": f"Bearer {server.token()}"}, timeout=30)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_the_history_survives_a_restart(server: EmbeddedServer) -> None:
    server.cli("submit", "half", "-p", "team-a", "-g", "0.5", "--", "sleep", "600")
    server.cli("wait", "half", "-p", "team-a", "--timeout", "30")
    deadline = time.monotonic() + 30
    while 0.5 not in _history(server)["allocated"] or len(_history(server)["time"]) < 5:
        assert time.monotonic() < deadline, _history(server)
        time.sleep(0.3)
    before = _history(server)
    server.stop(stop_workloads=False)
    with open(server.data / "metrics-history.jsonl", "a") as f:
        f.write('{"time": 1')  # a line torn by a crash
    server.start()
    after = _history(server)
    assert set(before["time"]) <= set(after["time"])
    assert after["projects"]["team-a"][: len(before["time"])] == before["projects"]["team-a"]
