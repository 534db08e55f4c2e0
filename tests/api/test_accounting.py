"""GPU accounting: the ledger against a synthetic day's bindings (exact integral), and the
embedded server's triggers against a real 0.5 GPU workload that runs, is suspended and resumes,
across a server restart; the report through REST and the CLI."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from tessera.api.tenancy.ledger import Ledger
from tessera.testing.embedded import EmbeddedServer, submit_body

DAY = 86400.0
T0 = 1_790_000_000.0


def _synthetic_day(rng: random.Random, workloads: int) -> list[tuple[float, str, str, float]]:
    """(time, workload, project, GPUs held from then on): each workload binds, changes,
    is suspended (0) and resumes at random times in one day."""
    events = []
    for i in range(workloads):
        project = f"p{i % 7}"
        t = T0 + rng.uniform(0, DAY * 0.9)
        for _ in range(rng.randint(1, 6)):
            gpus = rng.choice([0.0, 0.25, 0.5, 1.0, 2.0, 3 / 7, 1 / 7])
            events.append((t, f"w{i}", project, gpus))
            t += rng.expovariate(1 / 3600)
        events.append((min(t, T0 + DAY * 1.1), f"w{i}", project, 0.0))
    events.sort()
    return events


def _integral(events: list[tuple[float, str, str, float]], since: float,
              until: float) -> dict[str, float]:
    held: dict[str, tuple[float, str, float]] = {}
    out: dict[str, float] = defaultdict(float)
    for t, w, project, gpus in events:
        if w in held:
            start, p, g = held.pop(w)
            out[p] += g * max(0.0, min(t, until) - max(start, since)) / 3600
        if gpus > 0:
            held[w] = (t, project, gpus)
    return out


def test_report_equals_the_bindings_integral_over_a_synthetic_day(tmp_path: Path) -> None:
    rng = random.Random(31)
    events = _synthetic_day(rng, 400)
    ledger = Ledger(tmp_path / "ledger.db")
    state: dict[str, tuple[str, str, str, float]] = {}
    i = 0
    while i < len(events):  # events at one instant are observed together
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, w, project, gpus = events[i]
            state[w] = (w, project, "user:u", gpus)
            i += 1
        ledger.observe(t, {k: v for k, v in state.items() if v[3] > 0})
    for since, until in ((T0, T0 + DAY), (T0 + 6 * 3600, T0 + 18 * 3600)):
        expected = _integral(events, since, until)
        got = {r["project"]: r["gpu_hours_allocated"]
               for r in ledger.report(since, until, "project", now=T0 + 2 * DAY)}
        assert set(got) == {p for p, h in expected.items() if h > 0}
        for project, hours in expected.items():
            if hours > 0:
                assert got[project] == pytest.approx(hours, rel=0.005)
    # 0.5 GPU for exactly 2 hours is 1.00 GPU-hour; 1 h suspended in between costs nothing
    ledger2 = Ledger(tmp_path / "half.db")
    ledger2.observe(T0, {"h": ("half", "p", "u", 0.5)})
    ledger2.observe(T0 + 3600, {})
    ledger2.observe(T0 + 7200, {"h": ("half", "p", "u", 0.5)})
    ledger2.observe(T0 + 3 * 3600, {})
    [row] = ledger2.report(T0, T0 + DAY, "workload", now=T0 + DAY)
    assert row["gpu_hours_allocated"] == pytest.approx(1.0, abs=1e-9)


def _hours(c: httpx.Client, by: str, **extra: str) -> list[dict]:
    now = time.time()
    r = c.get("/api/v1/reports/usage", params={
        "from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600)),
        "to": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600)), "by": by, **extra})
    assert r.status_code == 200, r.text
    return list(r.json()["rows"])


def test_half_gpu_workload_suspend_not_counted_durable_across_restart(tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    with s.serving("acct"):
        with s.http() as c:
            r = c.post("/api/v1/workloads/trainings", json=submit_body(
                "half", "acct", gpuRequestType="portion", gpuPortionRequest=0.5))
            wid = r.json()["workloadId"]
            s.wait_phase(c, "trainings", wid, "Running")
            t_run = time.time()
            time.sleep(2.0)
            c.post(f"/api/v1/workloads/trainings/{wid}/suspend")
            t_suspend = time.time()
            s.wait_phase(c, "trainings", wid, "Stopped")
            time.sleep(3.0)  # suspended: not counted
            c.post(f"/api/v1/workloads/trainings/{wid}/resume")
            s.wait_phase(c, "trainings", wid, "Running")
            t_resumed = time.time()
            time.sleep(1.0)
            c.post(f"/api/v1/workloads/trainings/{wid}/suspend")
            t_end = time.time()
            s.wait_phase(c, "trainings", wid, "Stopped")
            [row] = [r for r in _hours(c, "workload") if r["workload"] == wid]
        running = (t_suspend - t_run) + (t_end - t_resumed)
        seconds = row["gpu_hours_allocated"] * 3600 / 0.5
        assert running - 0.6 < seconds < running + 0.6, (seconds, running)
        s.stop(stop_workloads=False)
        s.start()
        with s.http() as c:
            [after] = [r for r in _hours(c, "project") if r["project"] == "acct"]
            assert after["gpu_hours_allocated"] == pytest.approx(row["gpu_hours_allocated"])
            metrics = c.get("/metrics").text
            assert 'tessera_gpu_hours_allocated_total{department="",project="acct"}' in metrics
            # bad ranges: from after to; beyond the retention
            bad = c.get("/api/v1/reports/usage", params={
                "from": "2026-11-27T10:00:00Z", "to": "2026-11-27T09:00:00Z"})
            assert bad.status_code == 422 and bad.json()["message"].startswith("from: must not")
            bad = c.get("/api/v1/reports/usage", params={
                "from": "2020-01-01T00:00:00Z", "to": "2026-11-27T09:00:00Z"})
            assert bad.status_code == 422 and "retention" in bad.json()["message"]
        now = time.time()
        span = ["--from", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600)),
                "--to", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 60))]
        rows = json.loads(s.cli("report", "usage", *span, "--by", "project", "-o", "json").stdout)
        assert any(r["project"] == "acct" and r["gpu_hours_allocated"] > 0 for r in rows)
        csv_out = s.cli("report", "usage", *span, "--by", "user", "-o", "csv").stdout
        assert csv_out.splitlines()[0] == "user,gpu_hours_allocated,gpu_hours_used"
        assert "app:admin" in csv_out
        bad = s.cli("report", "usage", *span, "--by", "team", check=False)
        assert bad.returncode == 1 and bad.stderr.startswith("error: --by")
