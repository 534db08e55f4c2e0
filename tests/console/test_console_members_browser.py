"""The workload page's type and members in a real browser (Debian's Chromium through Selenium,
as the other console tests): a distributed PyTorch training of 2 workers shows its framework and
gang, and each member's pod, rank (torchrun's RANK, rank 0 the master), node and GPU share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from tessera.testing.embedded import EmbeddedServer
from tests.console.browsing import go, login, shoot, until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("members"), simulate=["2xV100-16GB"])
    s.start()
    try:
        s.cli("login")
        s.cli("project", "create", "team", "--gpu", "2")
        s.cli("training", "pytorch", "submit", "dist", "-p", "team", "--workers", "2",
              "-g", "0.5", "--", "sleep", "600")
        s.cli("submit", "single", "-p", "team", "-g", "0.25", "--", "sleep", "600")
        s.cli("wait", "dist", "single", "-p", "team", "--timeout", "30")
        yield s
    finally:
        s.cleanup()


def test_workload_page_shows_type_and_members(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    doc = server.cli_json("describe", "dist", "-p", "team")
    go(browser, server, f"workload/trainings/{doc['workloadId']}")
    until("Running", lambda: "Running" in browser.find_element(By.ID, "w-phase").text, timeout=30)
    assert browser.find_element(By.ID, "w-type").text == (
        "Training (preemptible) — distributed pytorch: gang of 2, started together")

    def rows() -> list[list[str]] | None:
        got = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
               for tr in browser.find_elements(By.CSS_SELECTOR, "#w-members tbody tr")]
        return got if len(got) == 2 and all(len(r) == 7 for r in got) else None

    got = until("two member rows", rows)
    assert [r[:3] for r in got] == [["0", "dist-0", "rank 0 (master)"],
                                    ["1", "dist-1", "rank 1"]]
    for r in got:
        assert r[3] == "Running" and r[4] != "—" and "GPU 0" in r[5], r
    shoot(browser, artifacts, "workload-members")
    # A single-pod workload: no roles to show.
    single = server.cli_json("describe", "single", "-p", "team")
    go(browser, server, f"workload/trainings/{single['workloadId']}")
    until("the single workload", lambda: browser.find_element(By.ID, "w-name").text == "single")
    assert browser.find_element(By.ID, "w-type").text == "Training (preemptible)"
    one = until("one member row", lambda: [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#w-members tbody tr")] or None)
    assert one[0][1:3] == ["single-0", "—"]
