"""The Metrics history from a real Prometheus (Debian's, installed by ./dev setup) that scrapes a
real embedded API server: with ``TESSERA_PROMETHEUS_URL`` set the history's series come from
range queries; with Prometheus gone the server's own samples come back, saying why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tessera.testing.cluster import free_ports
from tessera.testing.embedded import EmbeddedServer
from tests.prometheus_server import start_prometheus
from tests.waiting import wait_until


def last(values: list[Any]) -> Any:
    return next((v for v in reversed(values) if v is not None), None)


def test_history_comes_from_prometheus_and_falls_back_when_it_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api_port, prom_port = free_ports(2)
    prom, _ = start_prometheus(tmp_path, "tessera-api", [f"127.0.0.1:{api_port}"], prom_port)
    monkeypatch.setenv("TESSERA_PROMETHEUS_URL", f"http://127.0.0.1:{prom_port}")
    server = EmbeddedServer(tmp_path / "server", simulate=["2xV100-16GB"], port=api_port)
    try:
        server.start()
        server.cli("login")
        server.cli("project", "create", "team-a", "--gpu", "2")
        server.cli("submit", "half", "-p", "team-a", "-g", "0.5", "--", "sleep", "600")
        server.cli("submit", "whole", "-p", "team-a", "-g", "1", "--", "sleep", "600")
        server.cli("wait", "half", "whole", "-p", "team-a", "--timeout", "30")
        with server.http() as c:
            def scraped() -> dict[str, Any] | None:
                h = c.get("/api/v1/metrics/history", params={"minutes": 5}).json()
                ok = h.get("source") == "prometheus" and last(h["allocated"]) == pytest.approx(1.5)
                return h if ok else None

            h = wait_until("Prometheus to have scraped the API server twice", scraped, timeout=60)
            assert last(h["total"]) == 2
            assert len(h["time"]) == len(h["allocated"]) == len(h["projects"]["team-a"])
            assert h["time"] == sorted(h["time"]) and h["interval"] >= 1
            assert last(h["projects"]["team-a"]) == pytest.approx(1.5)
            assert last(h["workloads"]["team-a/half"]) == pytest.approx(0.5)
            assert last(h["workloads"]["team-a/whole"]) == pytest.approx(1.0)
            assert h["utilization"]["all"] == [None] * len(h["time"])  # simulated: no agent
            day = c.get("/api/v1/metrics/history", params={"minutes": 24 * 60}).json()
            assert day["source"] == "prometheus" and len(day["time"]) <= 721
            server.cli("delete", "whole", "-p", "team-a")
            wait_until("the deleted workload's share to leave the history", lambda: last(
                c.get("/api/v1/metrics/history", params={"minutes": 5}).json()["allocated"]
            ) == pytest.approx(0.5), timeout=60)
            prom.terminate()
            prom.wait(10)
            down = c.get("/api/v1/metrics/history", params={"minutes": 5}).json()
            assert down["source"] == "server" and "did not answer" in down["note"]
            assert down["allocated"] and len(down["time"]) == len(down["allocated"])
    finally:
        server.cleanup()
        if prom.poll() is None:
            prom.kill()
        prom.wait()
