"""The console's GPU usage on the Kubernetes backend: a real API server, kwok nodes, one real
tessera-node per node on its own fake NVML machine, and the real ``tessera.kube.api_server``.

Each agent publishes where it serves ``/usage`` on its Node; the API server polls the agents and
joins their reports to ``GET /api/v1/cluster``. A node without an agent, and a node whose agent
stops answering (SIGSTOP: the connection is accepted, no answer comes), say so instead of showing
zeros, and the request is answered all the same."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.kube_api import KubeApiServer
from tessera.testing.node_agents import NodeAgent
from tests.console.conftest import artifacts, browser  # noqa: F401 (Chromium, screenshots)
from tests.waiting import wait_until


class PollingApiServer(KubeApiServer):
    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "TESSERA_USAGE_INTERVAL": "0.3", "TESSERA_USAGE_TIMEOUT": "0.5",
                "TESSERA_METERING_INTERVAL": "0.5"}


@pytest.fixture(scope="module")
def setup(kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[PollingApiServer, dict[str, NodeAgent], str]]:
    # The chart installs tessera's CRDs with the API server; the module must not rely on an
    # earlier module's scheduler having applied them (it failed alone with 502 on PodGroups).
    kube_cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[3] / "deploy" / "crds"))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    with_agents = kube_cluster.create_gpu_nodes(2, NodeShape(gpus=2, model="L4-24GB"),
                                                prefix="usage-node-")
    group = kube_cluster.node_agents[-1]
    agents = {name: group.agents[name] for name in with_agents}
    (bare,) = kube_cluster.create_gpu_nodes(1, NodeShape(gpus=2, model="L4-24GB"),
                                            prefix="usage-bare-", node_agents=False)
    server = PollingApiServer(tmp_path_factory.mktemp("kube-usage"), kube_cluster.kubeconfig)
    server.start()
    try:
        yield server, agents, bare
    finally:
        server.cleanup()
        for a in agents.values():
            if a.process.popen is not None and a.process.popen.poll() is None:
                os.kill(a.process.popen.pid, signal.SIGCONT)
        group.stop()
        client = kube_cluster.client()
        for n in [*with_agents, bare]:
            client.delete(Node, n)


def nodes(server: KubeApiServer) -> dict[str, dict[str, Any]]:
    with server.http() as c:
        r = c.get("/api/v1/cluster", timeout=10)
    r.raise_for_status()
    return {n["name"]: n for n in r.json()["nodes"]}


def _used(server: KubeApiServer, name: str) -> float | None:
    """GPU-hours used of the workload named ``name`` over the last hour (None: not measured)."""
    span = {"from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600)),
            "to": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60)),
            "by": "workload"}
    with server.http() as c:
        rows = c.get("/api/v1/reports/usage", params=span).json()["rows"]
    mine = [r["gpu_hours_used"] for r in rows if r.get("name") == name]
    return mine[0] if mine else None


def test_each_agent_publishes_its_address_once(setup: Any, kube_client: Client) -> None:
    _, agents, bare = setup
    for name, agent in agents.items():
        ann = kube_client.get(Node, name).metadata.annotations  # type: ignore[union-attr]
        assert ann["tessera.io/node-agent-url"] == f"http://127.0.0.1:{agent.metrics_port}"
    bare_ann = kube_client.get(Node, bare).metadata.annotations or {}  # type: ignore[union-attr]
    assert "tessera.io/node-agent-url" not in bare_ann


def test_cluster_document_has_each_nodes_usage_or_says_why_not(setup: Any) -> None:
    server, agents, bare = setup
    got = wait_until("the agents' reports", lambda: (n := nodes(server)) and all(
        n[a]["agent"]["state"] == "ok" for a in agents) and n)
    for name, agent in agents.items():
        gpus = got[name]["gpus"]
        assert [g["uuid"] for g in gpus] == agent.uuids
        assert all(g["usedBytes"] == 0 and g["utilization"] == 0.0 for g in gpus)
    b = got[bare]["agent"]
    assert b["state"] == "no-agent" and "tessera.io/node-agent-url" in b["message"]
    assert all("usedBytes" not in g for g in got[bare]["gpus"])


def test_a_stuck_agent_is_reported_and_does_not_hold_the_request(setup: Any) -> None:
    server, agents, _ = setup
    name = sorted(agents)[0]
    popen = agents[name].process.popen
    assert popen is not None
    wait_until("its report", lambda: nodes(server)[name]["agent"]["state"] == "ok")
    os.kill(popen.pid, signal.SIGSTOP)
    try:
        # every request is answered (within the client's 10 s) while the agent hangs
        stuck = wait_until("the stuck agent's report", lambda: (n := nodes(server)[name])[
            "agent"]["state"] == "unreachable" and n)
        assert "did not answer within 0.5 s" in stuck["agent"]["message"]
        assert all("usedBytes" not in g for g in stuck["gpus"])  # no numbers, not zeros
        other = sorted(agents)[1]
        assert nodes(server)[other]["agent"]["state"] == "ok"
    finally:
        os.kill(popen.pid, signal.SIGCONT)
    wait_until("its recovery", lambda: nodes(server)[name]["agent"]["state"] == "ok")


def test_the_node_is_written_once_not_per_sync(setup: Any) -> None:
    """The address is published with the readiness annotations, and the agent patches its Node
    only when they change (it logs each patch): after many syncs and polls, one write."""
    server, agents, _ = setup
    name = sorted(agents)[1]
    wait_until("polls", lambda: nodes(server)[name]["agent"]["state"] == "ok")
    log = agents[name].process.log_path.read_text()
    assert log.count(f"node {name}: ready=") == 1, log


def test_a_dynamic_fraction_on_a_node_shows_its_usage_and_loan(
        setup: Any, stack: TestCluster, kube_client: Client) -> None:
    """A Run:ai manifest admitted by the webhook and bound by tessera-scheduler; its container's
    process (cuprobe on the node's fake driver, with exactly the pod's mounts) takes 6 GiB against
    a 2 GiB request: the API server's cluster document shows it, joined by namespace/pod."""
    from tessera.isolation.build import ensure_built
    from tessera.testing import pod_process
    from tests.kube.admission_helpers import (
        create,
        create_project_namespace,
        runai_pod,
        wait_webhook_sees_project,
    )
    from tests.kube.node_helpers import Process, agent_of

    server = setup[0]
    (node,) = stack.create_gpu_nodes(1, NodeShape(gpus=1, model="L4-24GB"), prefix="usage-dyn-")
    agent = agent_of(stack, node)
    ns, _ = create_project_namespace(kube_client, "usage")
    wait_webhook_sees_project(kube_client, ns)
    manifest = runai_pod("dyn", {"gpu-memory": "2048", "gpu-memory-limit": "10240"})
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    create(kube_client, manifest, ns)
    proc: Process | None = None
    try:
        from lightkube.resources.core_v1 import Pod

        pod = wait_until("the pod bound", lambda: (
            p := kube_client.get(Pod, "dyn", namespace=ns)).spec.nodeName and p)
        wait_until("its config", lambda: any(
            (agent.containers_dir / pod.metadata.annotations["tessera.io/gpu-config-key"]).glob(
                "conf/*/gpu-isolation.conf")))
        native = ensure_built()
        env = {**agent.env, "CUDA_VISIBLE_DEVICES": agent.uuids[0], "FAKE_GPU_SM_UTIL": "30"}
        proc = Process(pod_process.start(pod, pod.spec.containers[0].name, agent.root,
                                         [str(native.program("cuprobe")), "dlsym"], env,
                                         agent.library_dir / "libtessera-cuda.so"))
        assert proc("init").startswith("rc=0") and proc("ctx 0").startswith("rc=0")
        assert proc(f"alloc {6 * 2**30}").startswith("rc=0")

        def share() -> dict[str, Any] | None:
            gpu = nodes(server)[node]["gpus"][0]
            mine = [w for w in gpu["workloads"] if w.get("pod") == f"{ns}/dyn"]
            return {**mine[0], "gpu": gpu} if mine and mine[0].get("usedBytes") else None

        got = wait_until("the share's usage", share)
        # NVML's figure: its 6 GiB and its CUDA context (448 MiB on the fake L4, as CUDA 12's)
        assert got["usedBytes"] == 6 * 2**30 + 448 * 2**20 and got["utilization"] == 0.3
        assert got["chargedBytes"] > 6 * 2**30  # and its CUDA context
        assert got["loanedBytes"] == got["chargedBytes"] - 2 * 2**30
        assert got["gpu"]["usedBytes"] == 6 * 2**30 + 448 * 2**20
        assert got["gpu"]["loanedBytes"] == got["loanedBytes"]
        # GPU-hours used (docs/accounting.md): the API server meters the agent's 30% into the
        # ledger, so over any stretch the report grows by 0.3 GPU-seconds per second
        used_1, t_1 = wait_until("metered", lambda: (u := _used(server, "dyn")) and u), time.time()
        time.sleep(6.0)
        used_2, t_2 = _used(server, "dyn"), time.time()
        assert used_1 is not None and used_2 is not None
        expected = 0.3 * (t_2 - t_1)
        assert expected - 0.7 < (used_2 - used_1) * 3600 < expected + 0.7, (used_1, used_2)
    finally:
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait()
        import contextlib

        from lightkube.resources.core_v1 import Pod

        with contextlib.suppress(Exception):
            kube_client.delete(Pod, "dyn", namespace=ns, grace_period=0)
        with contextlib.suppress(Exception):
            kube_client.delete(Node, node)


def test_the_gpus_page_says_which_agent_does_not_answer(setup: Any, browser: Any, artifacts: Any,  # noqa: F811
                                                         ) -> None:
    """In Chromium: the Kubernetes API server's GPUs page shows usage for answering agents, and
    *node agent not answering* / *no node agent* (no numbers) for the others."""
    from selenium.webdriver.common.by import By

    from tests.console.browsing import go, login, shoot, until

    server, agents, bare = setup
    stuck, fine = sorted(agents)
    popen = agents[stuck].process.popen
    assert popen is not None
    os.kill(popen.pid, signal.SIGSTOP)
    try:
        wait_until("the stuck agent's report", lambda: nodes(server)[stuck]["agent"]["state"]
                   == "unreachable")
        browser.get(f"{server.url}/")
        until("the login page", lambda: browser.find_element(By.ID, "login-button"))
        login(browser, server)
        go(browser, server, "gpus")

        def badge(node: str) -> Any:
            return browser.find_element(By.CSS_SELECTOR, f'.node[data-node="{node}"] .agent')

        until("the badges", lambda: badge(stuck).get_attribute("data-agent-state") == "unreachable")
        assert "node agent not answering" in badge(stuck).text
        assert "did not answer within" in badge(stuck).text
        assert badge(bare).get_attribute("data-agent-state") == "no-agent"
        assert "no node agent" in badge(bare).text
        assert badge(fine).get_attribute("data-agent-state") == "ok"

        def rows(node: str) -> list[Any]:
            """The node's GPU rows, scrolled to: the page draws a node's rows only when its
            panel comes near the window (docs/console.md), and the session's cluster has many
            nodes by the time this test runs."""
            browser.execute_script("arguments[0].scrollIntoView()",
                                   browser.find_element(By.CSS_SELECTOR, f'.node[data-node="{node}"]'))
            return until(f"{node}'s GPU rows", lambda: browser.find_elements(
                By.CSS_SELECTOR, f'.node[data-node="{node}"] .gpu'))

        for node in (stuck, bare):  # no numbers rather than zeros
            gpus = rows(node)
            assert all(g.get_attribute("data-used") == "" for g in gpus)
            assert all("used: —" in g.text for g in gpus)
        ok_gpus = rows(fine)
        assert all(g.get_attribute("data-used") == "0" for g in ok_gpus)
        browser.execute_script("arguments[0].scrollIntoView()", badge(stuck))
        shoot(browser, artifacts, "kube-gpus-agents")
    finally:
        os.kill(popen.pid, signal.SIGCONT)


def test_with_prometheus_configured_the_usage_comes_from_it(
        setup: Any, kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """TESSERA_PROMETHEUS_URL: the API server reads the agents' metrics from Debian's Prometheus
    (scraping the real agents) instead of polling them; same document, same states."""
    from tests.prometheus_server import start_prometheus

    _, agents, bare = setup
    root = tmp_path_factory.mktemp("prometheus")
    prom, port = start_prometheus(root, "tessera-node",
                                  [f"127.0.0.1:{a.metrics_port}" for a in agents.values()])

    class FromPrometheus(PollingApiServer):
        @property
        def env(self) -> dict[str, str]:
            return {**super().env, "TESSERA_PROMETHEUS_URL": f"http://127.0.0.1:{port}"}

    server = FromPrometheus(root / "api", kube_cluster.kubeconfig)
    server.start()
    try:
        got = wait_until("usage from Prometheus", lambda: (n := nodes(server)) and all(
            n[a]["agent"]["state"] == "ok" for a in agents) and n, timeout=60)
        for name, agent in agents.items():
            gpus = got[name]["gpus"]
            assert [g["uuid"] for g in gpus] == agent.uuids
            assert all(g["usedBytes"] == 0 and g["utilization"] == 0.0 for g in gpus)
        b = got[bare]["agent"]
        assert b["state"] == "no-agent" and "Prometheus" in b["message"]
    finally:
        server.cleanup()
        prom.terminate()
        prom.wait(10)
