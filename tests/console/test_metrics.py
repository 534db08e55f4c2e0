"""Prometheus metrics: the API server's /metrics scraped from a real embedded server and parsed
(names, types, label sets, values against known state); the scheduler's and the webhook's
registries; and every query of the Grafana dashboards in deploy/grafana uses names these
components export."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.isolation.build import ensure_built
from tessera.kube import metrics as kube_metrics
from tessera.testing.embedded import EmbeddedServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def exported_series(text: str) -> set[str]:
    """Every series name a scrape may carry (a histogram's _bucket/_sum/_count, a counter's
    _total and _created), from its families' names and types."""
    out: set[str] = set()
    for f in text_string_to_metric_families(text):
        out.add(f.name)
        if f.type == "counter":
            out |= {f"{f.name}_total", f"{f.name}_created"}
        if f.type == "histogram":
            out |= {f"{f.name}_bucket", f"{f.name}_sum", f"{f.name}_count", f"{f.name}_created"}
        for s in f.samples:
            out.add(s.name)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("metrics"), simulate=["2xV100-16GB"])
    s.start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1", "--limit", "2")
        s.cli("project", "create", "team-b", "--gpu", "0.5")
        s.cli("submit", "half", "-p", "team-a", "-g", "0.5", "--", "sleep", "600")
        s.cli("submit", "whole", "-p", "team-a", "-g", "1", "--", "sleep", "600")
        s.cli("wait", "half", "whole", "-p", "team-a", "--timeout", "30")
        s.cli("submit", "big", "-p", "team-b", "-g", "0.9", "--", "sleep", "600")  # waits: quota
        yield s
    finally:
        s.cleanup()


def test_api_server_metrics_match_the_state(server: EmbeddedServer) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text  # no token: Prometheus scrapes it
    f = families(text)
    assert f["tessera_cluster_gpus"].type == "gauge"  # type: ignore[attr-defined]
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for fam in f.values() for s in fam.samples}  # type: ignore[attr-defined]
    assert value[("tessera_cluster_gpus", ())] == 2
    assert value[("tessera_cluster_gpus_allocated", ())] == pytest.approx(1.5)
    assert value[("tessera_project_gpu_allocated", (("project", "team-a"),))] == pytest.approx(1.5)
    assert value[("tessera_project_gpu_deserved", (("project", "team-b"),))] == 0.5
    assert value[("tessera_project_gpu_limit", (("project", "team-a"),))] == 2
    assert ("tessera_project_gpu_limit", (("project", "team-b"),)) not in value  # no limit
    assert value[("tessera_project_gpu_requested", (("project", "team-b"),))] == pytest.approx(0.9)
    assert value[("tessera_workloads", (("phase", "Running"), ("type", "Training")))] == 2
    assert value[("tessera_workloads", (("phase", "Pending"), ("type", "Training")))] == 1
    shares = {p: value[("tessera_project_gpu_fair_share", (("project", p),))] for p in ("team-a", "team-b")}
    assert sum(shares.values()) <= 2 + 1e-6 and shares["team-b"] >= 0.5 - 1e-6
    pending = f["tessera_workload_pending_seconds"]
    assert pending.type == "histogram"  # type: ignore[attr-defined]
    count = next(s.value for s in pending.samples  # type: ignore[attr-defined]
                 if s.name.endswith("_count") and s.labels.get("type") == "Training")
    assert count == 2  # the two started workloads


def test_overview_and_history_routes(server: EmbeddedServer) -> None:
    with server.http() as c:
        o = c.get("/api/v1/overview").json()
        assert o["gpus"]["total"] == 2 and o["workloadsByPhase"] == {"Pending": 1, "Running": 2}
        by = {p["name"]: p for p in o["projects"]}
        assert by["team-a"]["allocated"] == pytest.approx(1.5) and by["team-a"]["state"] in ("over", "at")
        h = c.get("/api/v1/metrics/history", params={"minutes": 5}).json()
        assert set(h) >= {"interval", "time", "allocated", "projects", "workloads"}
        assert len(h["time"]) == len(h["allocated"])
        assert c.get("/api/v1/metrics/history", params={"minutes": 0}).status_code == 422
        assert c.get("/api/v1/metrics/history", params={"minutes": "x"}).status_code == 422
    assert httpx.get(f"{server.url}/api/v1/overview").status_code == 401  # behind the token


def test_scheduler_and_webhook_registries() -> None:
    scheduler = families(generate_latest(kube_metrics.SCHEDULER).decode())
    assert scheduler["tessera_scheduler_cycle_duration_seconds"].type == "histogram"  # type: ignore[attr-defined]
    assert scheduler["tessera_scheduler_bindings"].type == "counter"  # type: ignore[attr-defined]
    kube_metrics.set_pending(["would exceed fair share of team-a by 1 GPU", "0/3 nodes are available: "
                              "3 didn't match nodeSelector", "no GPU with 8 GiB free"])
    text = generate_latest(kube_metrics.SCHEDULER).decode()
    pending = {s.labels["reason"]: s.value for s in families(text)[
        "tessera_scheduler_pending_pods"].samples}  # type: ignore[attr-defined]
    assert (pending["quota"], pending["constraints"], pending["no-fit"], pending["other"]) == (1, 1, 1, 0)
    webhook = families(generate_latest(kube_metrics.WEBHOOK).decode())
    assert webhook["tessera_webhook_admission_duration_seconds"].type == "histogram"  # type: ignore[attr-defined]
    assert kube_metrics.refusal_field("metadata.annotations[gpu-fraction] extra") == \
        "metadata.annotations[gpu-fraction]"


def _node_agent_scrape(tmp_path: Path) -> str:
    native = ensure_built()
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(native.fake_dir),
           "FAKE_GPU_DEVICES": "NVIDIA H100 80GB HBM3=81559Mi", "FAKE_GPU_STATE": str(tmp_path / "s")}
    agent = subprocess.Popen([sys.executable, "-m", "tessera.node", "local",
                              f"--shares-dir={tmp_path / 'shares'}", f"--metrics-port={port}",
                              f"--loans-dir={tmp_path / 'loans'}", "--sync-interval=0.2"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the node agent did not serve /metrics"
                time.sleep(0.2)
    finally:
        agent.terminate()
        agent.wait(10)


def test_every_dashboard_query_uses_exported_names(server: EmbeddedServer, tmp_path: Path) -> None:
    exported = exported_series(httpx.get(f"{server.url}/metrics", timeout=10).text)
    exported |= exported_series(generate_latest(kube_metrics.SCHEDULER).decode())
    exported |= exported_series(generate_latest(kube_metrics.WEBHOOK).decode())
    node = _node_agent_scrape(tmp_path)
    exported |= exported_series(node)
    # The node agent's per-container families have no sample without a share: take their
    # HELP lines too (families are declared on every scrape).
    exported |= set(re.findall(r"^# TYPE (\w+) ", node, re.M))
    dashboards = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
    assert len(dashboards) >= 2
    used: set[str] = set()
    for path in dashboards:
        doc = json.loads(path.read_text())
        exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
        assert exprs, path
        for e in exprs:
            used |= set(re.findall(r"\btessera_[a-z0-9_]+", e))
    missing = sorted(n for n in used if n not in exported)
    assert not missing, f"dashboard queries name metrics nobody exports: {missing}"


def test_time_pending_counts_each_start_once_at_whole_seconds() -> None:
    """Start times come in whole seconds: two workloads started in the same second but seen in
    two scrapes are both counted, and none is counted twice."""
    from prometheus_client import Histogram

    from tessera.api.prometheus import ApiCollector
    from tessera.api.telemetry import Snapshot, WorkloadView

    second = float(int(time.time())) + 5
    a = WorkloadView("a", "p", "Training", "Running", 0.5, 0.5, second - 3, second)
    b = WorkloadView("b", "p", "Training", "Running", 0.5, 0.5, second - 1, second)
    c = WorkloadView("c", "p", "Training", "Running", 0.5, 0.5, second - 1, second + 1)
    snaps = [(a,), (a, b), (a, b, c), (a, b, c)]

    class Fixed:
        def get(self) -> Snapshot:
            ws = snaps.pop(0)
            return Snapshot(time.time(), True, 1, 1, 0, 0, 0, (), ws, {})

    hist = Histogram("pending_test_seconds", "test", ["type"], registry=None)
    collector = ApiCollector(Fixed(), hist)  # type: ignore[arg-type]
    for _ in range(4):
        list(collector.collect())
    sample = next(s for s in hist.collect()[0].samples if s.name.endswith("_count"))
    total = next(s for s in hist.collect()[0].samples if s.name.endswith("_sum"))
    assert sample.value == 3 and total.value == 3 + 1 + 2
