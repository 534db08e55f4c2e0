"""GPU memory used, loans and utilisation for the console, from the node agent's code:

- embedded mode on the fake driver's NVML (``tessera up`` reads usage in its own process): the
  cluster document, the overview, ``/metrics`` and the history route carry what the fake driver
  reports for real workload processes — with the isolation library, and without it (a process
  known only by its pod's session);
- simulated GPUs: nothing to read, said as such (no zeros);
- the Kubernetes side's poller against real ``tessera-node local`` agents: one answering, one
  stopped (SIGSTOP: it accepts the connection and never answers), none published, a bad address;
- the join of a report to the cluster document (pure code, in-memory documents).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.api.usage import NodeReport, busy, merge, report_of
from tessera.isolation.build import ensure_built
from tessera.kube.agent_usage import AgentPoller
from tessera.testing.cluster import free_ports
from tessera.testing.embedded import EmbeddedServer
from tests.console.fakegpu import FakeGpuServer, GiB
from tests.waiting import wait_until as wait_for

HEADROOM = 320 * 2**20
"""What the isolation library charges per CUDA context on a V100 (its headroom)."""


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGpuServer]:
    s = FakeGpuServer(tmp_path_factory.mktemp("usage"))
    s.start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        s.cli("project", "create", "team-b", "--gpu", "1")
        s.submit_gpu("busy", "team-a", 40, 2 * GiB, "-g", "0.5")
        s.submit_gpu("borrow", "team-a", 20, 3 * GiB, "--gpu-memory-request", "1Gi",
                     "--gpu-memory-limit", "6Gi")
        s.submit_gpu("plain", "team-b", 10, GiB, "-g", "0.25", preload=False)
        s.cli("wait", "busy", "borrow", "-p", "team-a", "--timeout", "30")
        s.cli("wait", "plain", "-p", "team-b", "--timeout", "30")
        yield s
    finally:
        s.cleanup()


def shares(server: EmbeddedServer) -> dict[str, dict[str, Any]]:
    with server.http() as c:
        doc = c.get("/api/v1/cluster").json()
    return {w["name"]: {**w, "gpu": g} for n in doc["nodes"] for g in n["gpus"]
            for w in g["workloads"]}


def test_cluster_document_carries_what_the_driver_reports(fake: FakeGpuServer) -> None:
    got = wait_for("usage of all three workloads", lambda: (s := shares(fake)) and all(
        s[n].get("usedBytes") for n in ("busy", "borrow", "plain")) and s)
    busy_, borrow, plain = got["busy"], got["borrow"], got["plain"]
    # what each process allocated, as NVML reports it
    # NVML's figures include each process's CUDA context (HEADROOM on the fake V100, as on a real one)
    assert (busy_["usedBytes"], borrow["usedBytes"], plain["usedBytes"]) == (
        2 * GiB + HEADROOM, 3 * GiB + HEADROOM, GiB + HEADROOM)
    assert (busy_["utilization"], borrow["utilization"], plain["utilization"]) == (0.4, 0.2, 0.1)
    # the library charged the preloaded ones their allocation and one CUDA context
    assert busy_["chargedBytes"] == 2 * GiB + HEADROOM
    assert borrow["chargedBytes"] == 3 * GiB + HEADROOM
    # a loan: what the dynamic fraction holds above its 1 GiB request
    assert borrow["loanedBytes"] == 3 * GiB + HEADROOM - GiB
    assert busy_["loanedBytes"] == 0
    # without the library nothing is charged; the process is the pod's by its session
    assert plain["chargedBytes"] == 0 and plain["loanedBytes"] == 0
    with fake.http() as c:
        doc = c.get("/api/v1/cluster").json()
    node = doc["nodes"][0]
    assert doc["simulated"] is False and node["agent"]["state"] == "ok"
    assert sum(g["usedBytes"] for g in node["gpus"]) == 6 * GiB + 3 * HEADROOM
    assert sum(g["utilization"] for g in node["gpus"]) == pytest.approx(0.7)
    assert borrow["gpu"]["loanedBytes"] == borrow["loanedBytes"]


def test_overview_and_metrics_add_memory_used(fake: FakeGpuServer) -> None:
    with fake.http() as c:
        o = wait_for("the overview's usage", lambda: (x := c.get("/api/v1/overview").json())[
            "gpus"]["memoryUsedBytes"] == 6 * GiB + 3 * HEADROOM and x)
    assert o["gpus"]["busy"] == pytest.approx(0.7)
    assert o["gpus"]["memoryLoanedBytes"] == 2 * GiB + HEADROOM
    text = httpx.get(f"{fake.url}/metrics", timeout=10).text
    mem = {s.labels["state"]: s.value for f in text_string_to_metric_families(text)
           if f.name == "tessera_cluster_gpu_memory_bytes" for s in f.samples}
    assert mem["used"] == 6 * GiB + 3 * HEADROOM and mem["loaned"] == 2 * GiB + HEADROOM


def test_embedded_metrics_carry_each_gpu_and_workload(fake: FakeGpuServer) -> None:
    """No node agent runs in embedded mode: /metrics has the per-GPU series under the agent's
    names and labels (with ``gpu``, NVML's index), and each workload's memory used and busy."""
    with fake.http() as c:
        wait_for("usage", lambda: c.get("/api/v1/overview").json()["gpus"]["memoryUsedBytes"]
                 == 6 * GiB + 3 * HEADROOM)  # each process's context counts, as NVML says
        doc = c.get("/api/v1/cluster").json()
    text = httpx.get(f"{fake.url}/metrics", timeout=10).text
    samples = [(f.name, s.labels, s.value) for f in text_string_to_metric_families(text)
               for s in f.samples]
    used = {lab["gpu"]: (lab["gpu_uuid"], v) for name, lab, v in samples
            if name == "tessera_gpu_memory_used_bytes"}
    nvml = {str(g["index"]): (g["uuid"], g["usedBytes"]) for g in doc["nodes"][0]["gpus"]}
    assert used == nvml and sum(v for _, v in used.values()) == 6 * GiB + 3 * HEADROOM
    util = sum(v for name, _, v in samples if name == "tessera_gpu_utilization_ratio")
    assert util == pytest.approx(0.7)
    per_workload = {lab["workload"]: v for name, lab, v in samples
                    if name == "tessera_workload_gpu_memory_used_bytes"}
    assert per_workload == {"busy": 2 * GiB + HEADROOM, "borrow": 3 * GiB + HEADROOM, "plain": GiB + HEADROOM}
    busy = {lab["workload"]: v for name, lab, v in samples if name == "tessera_workload_gpu_busy"}
    assert busy == pytest.approx({"busy": 0.4, "borrow": 0.2, "plain": 0.1})


def test_history_route_serves_utilisation_per_project_and_workload(fake: FakeGpuServer) -> None:
    def latest() -> dict[str, Any] | None:
        with fake.http() as c:
            h = c.get("/api/v1/metrics/history", params={"minutes": 10}).json()
        u = h["utilization"]
        ok = u["workloads"].get("team-a/busy") and u["workloads"]["team-a/busy"][-1] is not None \
            and u["workloads"].get("team-b/plain", [None])[-1] is not None
        return h if ok else None

    h = wait_for("samples with every workload's utilisation", latest)
    u = h["utilization"]
    n = len(h["time"])
    assert len(u["all"]) == n and all(len(v) == n for v in u["workloads"].values())
    assert u["workloads"]["team-a/busy"][-1] == 0.4
    assert u["workloads"]["team-a/borrow"][-1] == 0.2
    assert u["workloads"]["team-b/plain"][-1] == 0.1
    assert u["projects"]["team-a"][-1] == pytest.approx(0.6)
    assert u["projects"]["team-b"][-1] == pytest.approx(0.1)
    assert u["all"][-1] == pytest.approx(0.7)
    assert h["memoryUsed"]["projects"]["team-a"][-1] == 5 * GiB + 2 * HEADROOM
    assert h["memoryUsed"]["projects"]["team-b"][-1] == GiB + HEADROOM
    # a narrower window holds fewer samples; bad windows are refused naming the parameter
    with fake.http() as c:
        r = c.get("/api/v1/metrics/history", params={"minutes": 25 * 60})
        assert r.status_code == 422 and "minutes" in r.json()["message"]
    assert httpx.get(f"{fake.url}/api/v1/metrics/history").status_code == 401


def test_a_deleted_workload_leaves_the_usage(fake: FakeGpuServer) -> None:
    fake.cli("delete", "plain", "-p", "team-b")
    wait_for("plain's share gone and its memory freed",
             lambda: "plain" not in shares(fake) and _used(fake) == 5 * GiB + 2 * HEADROOM)


def _used(server: EmbeddedServer) -> int:
    with server.http() as c:
        doc = c.get("/api/v1/cluster").json()
    return sum(g.get("usedBytes", 0) for n in doc["nodes"] for g in n["gpus"])


def test_simulated_gpus_say_there_is_no_usage(server: EmbeddedServer) -> None:
    with server.http() as c:
        doc = c.get("/api/v1/cluster").json()
        o = c.get("/api/v1/overview").json()
        h = c.get("/api/v1/metrics/history", params={"minutes": 5}).json()
    node = doc["nodes"][0]
    assert node["agent"]["state"] == "simulated" and "simulated" in node["agent"]["message"]
    assert all("usedBytes" not in g and "utilization" not in g for g in node["gpus"])
    assert o["gpus"]["memoryUsedBytes"] is None and o["gpus"]["busy"] is None
    assert all(x is None for x in h["utilization"]["all"])
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'state="used"' not in text


# -- the Kubernetes side's poller, against real agents ------------------------------------------

@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Two real ``tessera-node local`` agents on the fake NVML; the second is SIGSTOPped."""
    native = ensure_built()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_"))}
    env.update({"LD_LIBRARY_PATH": str(native.fake_dir),
                "FAKE_GPU_DEVICES": "NVIDIA H100 80GB HBM3=81559Mi",
                "FAKE_GPU_STATE": str(tmp_path / "gpu.state")})
    ports = free_ports(2)
    procs = [subprocess.Popen([sys.executable, "-m", "tessera.node", "local",
                               f"--shares-dir={tmp_path / f'shares-{i}'}", f"--node-name=n{i}",
                               f"--metrics-port={port}", f"--loans-dir={tmp_path / 'loans'}",
                               "--sync-interval=0.2"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i, port in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            wait_for(f"{url}/usage", lambda u=url: _answers(u))  # type: ignore[misc]
        os.kill(procs[1].pid, signal.SIGSTOP)
        yield urls[0], procs[1]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
                p.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/usage", timeout=2).json()["gpus"] is not None
    except (httpx.HTTPError, ValueError):
        return False


def test_poller_reports_each_agent_and_never_waits_for_a_stuck_one(
        agents: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    good, stuck = agents
    stuck_url = "http://127.0.0.1:" + _port_of(stuck)
    poller = AgentPoller(lambda: {"n0": good, "n1": stuck_url, "n2": "",
                                  "n3": "file:///etc/passwd"}, interval=0.3, timeout=0.5,
                         workers=2)
    try:
        got = wait_for("every node's report", lambda: (r := poller.reports()) and
                       {"n0", "n1", "n2", "n3"} <= set(r) and r["n1"].state != "ok" and r)
        ok = got["n0"]
        assert ok.state == "ok" and ok.document is not None
        gpu = ok.document["gpus"][0]
        assert gpu["memoryTotalBytes"] == 81559 * 2**20 and gpu["memoryUsedBytes"] == 0
        assert got["n1"].state == "unreachable" and "did not answer within 0.5 s" in got["n1"].message
        assert got["n2"].state == "no-agent" and "tessera.io/node-agent-url" in got["n2"].message
        assert got["n3"].state == "unreachable" and "http(s)" in got["n3"].message
        # the stuck agent answers again once it runs: its node's report recovers
        os.kill(stuck.pid, signal.SIGCONT)
        wait_for("the stuck agent's recovery", lambda: poller.reports()["n1"].state == "ok")
        wait_for("the rounds to go on", lambda: poller.rounds >= 2)
    finally:
        poller.stop()


def _port_of(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    assert isinstance(args, list)
    return next(str(a).split("=", 1)[1] for a in args if str(a).startswith("--metrics-port="))


# -- the join (pure) ------------------------------------------------------------------------------

def _cluster() -> dict[str, Any]:
    return {"nodes": [
        {"name": "a", "gpus": [
            {"uuid": "GPU-1", "memoryBytes": 16 * GiB, "workloads": [
                {"name": "w1", "project": "p", "pod": "p/w1-0", "bytes": 4 * GiB, "exclusive": False},
                {"name": "w2", "project": "p", "pod": "p/w2-0", "bytes": 2 * GiB, "exclusive": False}]},
            {"uuid": "GPU-2", "memoryBytes": 16 * GiB, "workloads": [
                {"name": "w3", "project": "q", "pod": "q/w3-0", "bytes": 16 * GiB, "exclusive": True}]}]},
        {"name": "b", "gpus": [{"uuid": "GPU-3", "memoryBytes": 16 * GiB, "workloads": []}]},
        {"name": "c", "gpus": [{"uuid": "GPU-4", "memoryBytes": 16 * GiB, "workloads": []}]},
    ]}


def test_merge_joins_shares_by_pod_and_gpu_and_says_why_a_node_has_none() -> None:
    doc = {"gpus": [{"uuid": "GPU-1", "memoryUsedBytes": 7 * GiB, "utilization": 0.5},
                    {"uuid": "GPU-2", "memoryUsedBytes": 9 * GiB, "utilization": 0.9}],
           "shares": [{"namespace": "p", "pod": "w1-0", "gpuUuid": "GPU-1", "usedBytes": 6 * GiB,
                       "chargedBytes": 6 * GiB, "loanedBytes": 2 * GiB, "smUtilization": 0.3},
                      {"namespace": "p", "pod": "w2-0", "gpuUuid": "GPU-9", "usedBytes": GiB}]}
    reports = {"a": report_of("a", doc, now=100.0),
               "b": NodeReport("b", "unreachable", "the agent at http://x did not answer", 90.0)}
    cluster = merge(_cluster(), reports, now=101.0)
    a, b, c = cluster["nodes"]
    assert a["agent"] == {"state": "ok", "message": "", "ageSeconds": 1.0}
    g1, g2 = a["gpus"]
    assert (g1["usedBytes"], g1["utilization"], g1["loanedBytes"]) == (7 * GiB, 0.5, 2 * GiB)
    w1, w2 = g1["workloads"]
    assert (w1["usedBytes"], w1["loanedBytes"], w1["utilization"]) == (6 * GiB, 2 * GiB, 0.3)
    assert "usedBytes" not in w2  # its share was reported on another GPU: not joined here
    assert g2["workloads"][0]["usedBytes"] == 9 * GiB  # a whole GPU: the GPU's own figures
    assert g2["workloads"][0]["utilization"] == 0.9
    assert b["agent"]["state"] == "unreachable" and "usedBytes" not in b["gpus"][0]
    assert c["agent"]["state"] == "waiting" and "usedBytes" not in c["gpus"][0]
    total = busy(cluster)
    assert total.known and total.gpus_busy == pytest.approx(1.4)
    assert total.workloads_busy == {("p", "w1"): 0.3, ("q", "w3"): 0.9}
    assert total.memory_used == 16 * GiB and total.memory_loaned == 2 * GiB


@pytest.mark.parametrize(("answer", "state", "words"), [
    ([1, 2], "unreachable", "not a JSON object"),
    ({"gpus": None, "message": "NVML could not be initialised"}, "not-ready", "NVML"),
    ({"gpus": "many"}, "unreachable", "malformed"),
    ({"gpus": [1]}, "unreachable", "malformed"),
    ({"gpus": [], "shares": {}}, "unreachable", "malformed"),
])
def test_a_malformed_or_empty_answer_is_a_state_not_a_crash(answer: Any, state: str,
                                                            words: str) -> None:
    r = report_of("n", answer)
    assert r.state == state and words in r.message and r.document is None
    cluster = merge(_cluster(), {"a": r})
    assert cluster["nodes"][0]["agent"]["state"] == state
    assert not busy(cluster).known


def test_the_agent_and_the_api_server_name_the_same_annotation() -> None:
    from tessera.kube import names
    from tessera.node import publish

    assert names.AGENT_URL == publish.AGENT_URL == "tessera.io/node-agent-url"


def test_one_missed_answer_keeps_the_last_report_until_it_is_stale() -> None:
    poller = AgentPoller(lambda: {}, interval=5, timeout=1)
    good = NodeReport("n", "ok", "", 100.0, {"gpus": [], "shares": []})
    miss = NodeReport("n", "unreachable", "the agent at http://x did not answer within 1 s", 104.0)
    kept = poller._keep_recent(good, miss)
    assert kept.state == "ok" and kept.time == 100.0 and kept.document == good.document
    assert "did not answer" in kept.message  # said, with the age, on the page
    late = NodeReport("n", "unreachable", "the agent at http://x did not answer within 1 s", 116.0)
    assert poller._keep_recent(kept, late) is late  # 16 s > 3 intervals: no numbers any more
    assert poller._keep_recent(None, miss) is miss


def test_history_keeps_bounded_samples_and_the_busiest_workloads() -> None:
    """Retention is a fixed number of samples (hours / interval) and at most MAX_WORKLOADS
    workloads' utilisation per sample, the busiest; a snapshot sampled twice is kept once."""
    from tessera.api.history import MAX_WORKLOADS, History
    from tessera.api.telemetry import Snapshot, SnapshotCache

    base = int(time.time()) - 100  # snapshot times near now: the cache ages them by the clock
    clock = iter(range(base, base + 1000))

    def reader(_: Any) -> Snapshot:
        busy_ = {("p", f"w{i}"): i / 1000 for i in range(MAX_WORKLOADS + 50)}
        return Snapshot(float(next(clock)), False, 8, 1, 0, 0, 0, (), (), {}, True, 2.5, 0,
                        busy_, {})

    cache = SnapshotCache(None, max_age=-1, reader=reader)  # type: ignore[arg-type]
    history = History(cache, interval=1, hours=10 / 3600)
    for _ in range(25):
        history.sample()
    doc = history.document(0)
    assert len(doc["time"]) == 10 and doc["time"][0] == base + 15  # the newest ten
    workloads = doc["utilization"]["workloads"]
    assert len(workloads) == MAX_WORKLOADS
    assert "p/w149" in workloads and "p/w49" not in workloads  # the busiest kept
    assert doc["utilization"]["all"] == [2.5] * 10
    assert doc["utilization"]["projects"]["p"][-1] == pytest.approx(
        sum(range(MAX_WORKLOADS + 50)) / 1000)
    cache.max_age = 3600  # the same snapshot again: no new sample
    history.sample()
    history.sample()
    assert len(history.document(0)["time"]) == 10 and history.samples[-1].time == base + 24


# -- the same reports from a real Prometheus (TESSERA_PROMETHEUS_URL) ---------------------------

def test_prometheus_source_reports_what_the_agent_exported(native: Any, tmp_path: Path) -> None:
    """Debian's Prometheus scrapes a real ``tessera-node local`` (fake NVML, two share processes
    with the isolation library); the API server's Prometheus source builds the same report the
    agent's ``/usage`` gives; a node Prometheus has no series of is ``no-agent``; once the agent is
    gone and its last sample ages, ``unreachable``; Prometheus down: every node says so."""
    from tessera.kube.prometheus_usage import PrometheusUsage
    from tests.isolation.conftest import CTX
    from tests.node.machines import INFER, TRAIN, UUIDS, Machine
    from tests.prometheus_server import start_prometheus

    m = Machine(native, tmp_path)
    from tessera.node.containers import write_share

    for share in (TRAIN, INFER):
        write_share(m.shares, share, host_paths=True)
    prom: subprocess.Popen[bytes] | None = None
    try:
        a = m.share_process(TRAIN, sm=40)
        a.alloc(10 * GiB)  # 2 GiB (and its context) above its 8 GiB request
        m.share_process(INFER, sm=20).alloc(3 * GiB)
        m.start_agent("warn")
        prom, port = start_prometheus(tmp_path, "tessera-node", [f"127.0.0.1:{m.port}"])
        source = PrometheusUsage(f"http://127.0.0.1:{port}", lambda: ["box", "ghost"],
                                 interval=0.5, timeout=2, stale_after=3)

        def shares_seen() -> Any:
            try:
                r = source.read()
            except Exception:
                return None
            box = r["box"]
            return r if box.state == "ok" and len(box.shares) == 2 else None

        got = wait_for("Prometheus to have scraped the agent", shares_seen, timeout=60)
        box = got["box"]
        g0 = box.gpus[UUIDS[0]]
        assert g0["usedBytes"] == 13 * GiB + 2 * CTX and g0["utilization"] == pytest.approx(0.6)
        train = box.shares[(UUIDS[0], "team-a/train-a")]
        assert train["usedBytes"] == 10 * GiB + CTX and train["loanedBytes"] == 2 * GiB + CTX
        assert train["utilization"] == pytest.approx(0.4)
        assert got["ghost"].state == "no-agent" and "no tessera-node metrics" in got["ghost"].message
        cluster = merge({"nodes": [{"name": "box", "gpus": [{"uuid": UUIDS[0], "workloads": [
            {"name": "train-a", "project": "team-a", "pod": "team-a/train-a", "bytes": 8 * GiB,
             "exclusive": False}]}]}]}, got)
        assert cluster["nodes"][0]["gpus"][0]["loanedBytes"] == 2 * GiB + CTX
        assert m.agent is not None
        m.agent.terminate()
        m.agent.wait(10)
        gone = wait_for("the agent's samples to age", lambda: (
            r := source.read()["box"]).state == "unreachable" and r, timeout=30)
        assert "has not scraped this node's agent" in gone.message
        prom.terminate()
        prom.wait(10)
        down = source.read()
        assert {r.state for r in down.values()} == {"unreachable"}
        assert "did not answer" in down["ghost"].message
        bad = PrometheusUsage("ftp://x", lambda: ["box"]).read()["box"]
        assert bad.state == "unreachable" and "TESSERA_PROMETHEUS_URL" in bad.message
    finally:
        m.stop()
        if prom is not None and prom.poll() is None:
            prom.kill()
            prom.wait()


@pytest.fixture
def native() -> Any:
    return ensure_built()


def test_compute_gpu_time_reaches_the_gpus_and_workload_pages_on_kubernetes() -> None:
    """Issue 30, item 4: tessera-node adds each compute share's charged GPU time to its /usage
    shares (a share NVML does not show gets an entry of its own); the API server joins it into
    the GPUs page's holders and the workload's computeShare.gpus, as embedded mode shows it."""
    from tessera.kube.compute_usage import add_gpu_time
    from tessera.node.report import usage_document
    from tessera.node.usage import NodeUsage

    timed = {"gpuTime1s": 0.29, "gpuTime10s": 0.3, "gpuSecondsTotal": 12.5,
             "computeRequest": 0.3, "computeLimit": 0.8, "computeEnforced": True}
    doc = usage_document("a", NodeUsage([], {}, (), ()), True,
                         extra={("GPU-1", "p", "w1-0"): timed})
    (share,) = doc["shares"]  # NVML showed no process: an entry of its own, with the fields
    assert share == {"namespace": "p", "pod": "w1-0", "gpuUuid": "GPU-1", **timed}
    doc["gpus"] = [{"uuid": "GPU-1", "memoryUsedBytes": GiB, "utilization": 0.4}]
    doc["shares"].append({"namespace": "p", "pod": "x", "gpuUuid": "GPU-1",
                          "gpuTime1s": "lots", "computeEnforced": "yes"})  # malformed: dropped
    reports = {"a": report_of("a", doc, now=100.0)}
    cluster = merge(_cluster(), reports, now=101.0)
    w1 = cluster["nodes"][0]["gpus"][0]["workloads"][0]
    assert {k: w1[k] for k in timed} == timed  # what console computeText/gpuTimeLine read
    assert reports["a"].shares[("GPU-1", "p/x")] == {"utilization": None}

    wdoc = {"computeShare": {"gpuComputeRequest": "0.3", "text": "request 0.3, limit 0.8 (fair)"},
            "pods": [{"name": "w1-0", "namespace": "p", "nodeName": "a"},
                     {"name": "w1-1", "namespace": "p", "nodeName": "gone"}]}
    add_gpu_time(wdoc, reports)
    assert wdoc["computeShare"]["gpus"] == [{"gpu": "GPU-1", "pod": "w1-0", "gpuTime1s": 0.29,
                                             "gpuTime10s": 0.3, "gpuSecondsTotal": 12.5,
                                             "enforced": True}]
    assert wdoc["computeShare"]["text"].endswith("; GPU time 0.29 (1 s) 0.30 (10 s)")
    assert add_gpu_time({"pods": []}, reports) == {"pods": []}  # no compute share: untouched
