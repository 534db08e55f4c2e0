"""The console's usage views in a real browser (Debian's Chromium, headless, Selenium) against
an embedded server on the fake driver's NVML: workloads are real processes allocating through the
fake CUDA driver with a known SM utilisation. The GPUs page draws memory used against allocated
and marks the loan of a dynamic fraction; the Metrics page's utilisation charts draw data.
Screenshots (``gpus-usage``, ``metrics-usage``, ``phone-gpus-usage``) go to
``TESSERA_ARTIFACTS``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from tests.console.browsing import go, login, shoot, until
from tests.console.fakegpu import FakeGpuServer, GiB
from tests.isolation.conftest import CTX_V100


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGpuServer]:
    s = FakeGpuServer(tmp_path_factory.mktemp("console-usage"))
    s.start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        s.cli("project", "create", "team-b", "--gpu", "1")
        s.submit_gpu("train", "team-a", 40, 5 * GiB, "-g", "0.5")
        s.submit_gpu("notebook", "team-a", 15, 4 * GiB, "--gpu-memory-request", "1Gi",
                     "--gpu-memory-limit", "8Gi")
        s.submit_gpu("infer", "team-b", 25, 2 * GiB, "-g", "0.25")
        s.cli("wait", "train", "notebook", "-p", "team-a", "--timeout", "30")
        s.cli("wait", "infer", "-p", "team-b", "--timeout", "30")
        yield s
    finally:
        s.cleanup()


def test_overview_shows_memory_in_use_and_on_loan(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    used = until("the usage card", lambda: (c := browser.find_element(By.ID, "card-used")) and
                 c.text.startswith("11.9 GiB") and c)  # 11 GiB and three 320 MiB contexts
    assert "0.8 GPUs' worth busy" in used.text  # 40% + 15% + 25%
    assert "GiB" in browser.find_element(By.ID, "card-loaned").text
    shoot(browser, artifacts, "overview-usage")


def test_gpus_page_draws_memory_used_and_marks_the_loan(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "gpus")
    seg = until("the notebook's share with its usage", lambda: [
        s for s in browser.find_elements(By.CSS_SELECTOR, '.seg.share[data-workload="notebook"]')
        if s.get_attribute("data-used")])
    # NVML's figure: its 4 GiB and its CUDA context (320 MiB on the fake V100, as on a real one)
    assert int(seg[0].get_attribute("data-used")) == 4 * GiB + CTX_V100
    assert "using 4.3 GiB, 15% busy" in seg[0].get_attribute("title")
    loan = until("the loan", lambda: browser.find_element(By.CSS_SELECTOR, '.seg.loan[data-loan="notebook"]'))
    assert int(loan.get_attribute("data-bytes")) > 3 * GiB  # 4 GiB + its context, less 1 GiB
    assert "above its request" in loan.get_attribute("title") and loan.size["width"] > 0
    gpu = loan.find_element(By.XPATH, "./ancestor::div[contains(@class, 'gpu')]")
    assert gpu.find_element(By.CSS_SELECTOR, ".usedbar i").size["width"] > 0
    assert "used" in gpu.find_element(By.CSS_SELECTOR, ".use").text
    assert "on loan" in gpu.find_element(By.CSS_SELECTOR, ".loaned").text
    used = sum(int(g.get_attribute("data-used") or 0)
               for g in browser.find_elements(By.CSS_SELECTOR, ".gpu"))
    assert used == 11 * GiB + 3 * CTX_V100  # 5 + 4 + 2 GiB and contexts, as NVML reports them
    agent = browser.find_element(By.CSS_SELECTOR, ".node .agent")
    assert agent.get_attribute("data-agent-state") == "ok"
    assert not browser.find_element(By.ID, "sim").is_displayed()  # NVML GPUs, not simulated
    shoot(browser, artifacts, "gpus-usage")


def test_metrics_page_charts_utilisation_per_project_and_workload(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    def drawn(chart_id: str) -> int:
        el = browser.find_element(By.ID, chart_id)
        return int(el.get_attribute("data-values") or 0) if el.find_elements(By.TAG_NAME, "canvas") else 0

    go(browser, server, "metrics")
    # samples come every 0.5 s; the page redraws every 10 s: reload until two are in
    for _ in range(30):
        until("the charts", lambda: browser.find_element(By.CSS_SELECTOR, "#chart-util-projects canvas"))
        points = int(browser.find_element(By.ID, "chart-util-projects").get_attribute("data-points") or 0)
        if drawn("chart-util-projects") >= 4 and drawn("chart-util-workloads") >= 6 and points >= 6:
            break
        time.sleep(0.5)
        browser.refresh()
    assert drawn("chart-util-projects") >= 4  # all + team-a + team-b, two samples at least
    assert drawn("chart-util-workloads") >= 6  # three workloads, two samples at least
    legend = browser.find_element(By.ID, "chart-util-workloads").text
    assert "team-a/train" in legend and "team-b/infer" in legend
    assert "team-a" in browser.find_element(By.ID, "chart-util-projects").text
    assert browser.find_element(By.ID, "util-note").text == ""  # usage was reported
    panel = browser.find_element(By.ID, "chart-util-projects")
    browser.execute_script("arguments[0].parentElement.scrollIntoView()", panel)
    shoot(browser, artifacts, "metrics-usage")


def test_usage_at_phone_width(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.set_window_size(390, 844)
    try:
        go(browser, server, "gpus")
        until("the loan", lambda: browser.find_element(By.CSS_SELECTOR, ".seg.loan"))
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400, f"the GPUs page scrolls sideways at 390 px ({width} px)"
        shoot(browser, artifacts, "phone-gpus-usage")
    finally:
        browser.set_window_size(1280, 900)
