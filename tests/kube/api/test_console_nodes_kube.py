"""The GPUs page with many nodes, in Chromium against the Kubernetes API server (real
kube-apiserver, kwok nodes, the real ``tessera.kube.api_server``): every node is on the page at
once (its panel, name and summary line), but a node's GPU rows are drawn only when its panel
comes near the window — the page's cost at 500 nodes is the window's, not the cluster's
(docs/console.md; ``python -m tessera.bench.console --page`` measures it). Scrolling to the last
node draws its rows; the filter finds a node by name whether it was drawn or not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node

from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.kube_api import KubeApiServer
from tests.console.conftest import artifacts, browser  # noqa: F401 (Chromium, screenshots)
from tests.waiting import wait_until

COUNT = 40
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def many(kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[KubeApiServer, list[str]]]:
    kube_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    names = kube_cluster.create_gpu_nodes(COUNT, NodeShape(gpus=8, model="H100-80GB"),
                                          prefix="page-node-", node_agents=False)
    server = KubeApiServer(tmp_path_factory.mktemp("kube-page"), kube_cluster.kubeconfig)
    server.start()
    try:
        yield server, names
    finally:
        server.cleanup()
        client = kube_cluster.client()
        for n in names:
            client.delete(Node, n)


PANELS = """
return [...document.querySelectorAll('[data-node]')].map((p) => ({
  name: p.dataset.node, rows: p.querySelectorAll('.gpu').length, height: p.getBoundingClientRect().height,
  top: p.getBoundingClientRect().top, sum: (p.querySelector('.node-sum') || {}).textContent || '',
  hidden: p.hidden}));
"""


def test_every_node_is_listed_and_only_those_in_view_are_drawn(many: Any, browser: Any,  # noqa: F811
                                                               artifacts: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.console.browsing import go, login, shoot, until

    server, names = many

    def listed() -> list[str] | None:
        with server.http() as c:
            r = c.get("/api/v1/cluster")
        assert r.status_code == 200, r.text[:500]
        got = [n["name"] for n in r.json()["nodes"]]
        assert set(names) <= set(got), sorted(set(names) - set(got))[:5]
        return got
    everyone = wait_until("the API server's node cache", listed, ignore=(AssertionError,))
    login(browser, server)
    go(browser, server, "gpus")
    panels = until("every node's panel", lambda: (
        p if len(p := browser.execute_script(PANELS)) == len(everyone) else None))
    assert [p["name"] for p in panels] == everyone  # the document's order
    mine = [p for p in panels if p["name"] in names]
    for p in mine:  # each node summed up on its panel, drawn or not
        assert p["sum"].startswith("8 GPUs · 0 shares · ") and "allocated" in p["sum"], p
    window = browser.execute_script("return window.innerHeight")
    far = [p for p in panels if p["top"] > 3 * window]
    assert far, "the page is not taller than three windows"
    assert all(p["rows"] == 0 for p in far), far  # not drawn: far below the window
    near = [p for p in panels if p["top"] < window]
    assert near and all(p["rows"] == 8 for p in near), near  # drawn: in the window
    # the stand-ins keep the page's length: each as tall as its rows will be (within 30%)
    drawn_h = near[0]["height"]
    assert all(abs(p["height"] - drawn_h) < 0.3 * drawn_h for p in far), (drawn_h, far[:3])
    shoot(browser, artifacts, "gpus-many-nodes-top")

    last = browser.find_element(By.CSS_SELECTOR, f'[data-node="{everyone[-1]}"]')
    browser.execute_script("arguments[0].scrollIntoView()", last)
    until("the last node's rows", lambda: len(last.find_elements(By.CSS_SELECTOR, ".gpu")) == 8)
    shoot(browser, artifacts, "gpus-many-nodes-bottom")

    browser.execute_script("window.scrollTo(0, 0)")
    target = names[COUNT // 2]
    box = browser.find_element(By.ID, "gpu-filter")
    box.send_keys(target)
    shown = until("the filter", lambda: (
        v if len(v := [p for p in browser.execute_script(PANELS) if not p["hidden"]]) == 1 else None))
    assert shown[0]["name"] == target
    until("its rows", lambda: shown and browser.execute_script(
        f"return document.querySelector('[data-node=\"{target}\"]').querySelectorAll('.gpu').length") == 8)
    assert browser.find_element(By.ID, "gpu-count").text == f"1 of {len(everyone)} nodes"
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    until("all nodes again", lambda: all(not p["hidden"] for p in browser.execute_script(PANELS)))
