"""The web console in a real browser: Debian's Chromium, headless, driven by Selenium through
chromium-driver, against a real embedded-mode server (simulated GPUs). Screenshots of every page
are saved (at 1280 px and at a 390 px phone width) under ``TESSERA_ARTIFACTS`` (default: the
test's temporary directory, printed) so they can be looked at."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tessera.testing.embedded import EmbeddedServer
from tests.console.browsing import go, login, shoot, until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    os.environ["TESSERA_HISTORY_INTERVAL"] = "0.5"  # the server inherits it: samples come fast
    s = EmbeddedServer(tmp_path_factory.mktemp("console"), simulate=["2xV100-16GB"])
    s.start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        s.cli("project", "create", "team-b", "--gpu", "1", "--limit", "2")
        s.cli("submit", "frac05", "-p", "team-a", "-g", "0.5", "--", "sleep", "600")
        s.cli("submit", "frac03", "-p", "team-a", "-g", "0.3", "--", "sleep", "600")
        s.cli("wait", "frac05", "frac03", "-p", "team-a", "--timeout", "30")
        yield s
    finally:
        os.environ.pop("TESSERA_HISTORY_INTERVAL", None)
        s.cleanup()


def test_1_login_refuses_wrong_credentials_then_logs_in(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{server.url}/")
    until("the login page", lambda: browser.find_element(By.ID, "login-button"))
    browser.find_element(By.ID, "client-id").send_keys("nobody")
    browser.find_element(By.ID, "client-secret").send_keys("wrong")
    browser.find_element(By.ID, "login-button").click()
    until("the refusal", lambda: "Wrong" in browser.find_element(By.ID, "login-error").text)
    shoot(browser, artifacts, "login")
    browser.find_element(By.ID, "client-id").clear()
    browser.find_element(By.ID, "client-secret").clear()
    login(browser, server)
    text = browser.find_element(By.ID, "main").text
    assert "0.8" in browser.find_element(By.ID, "card-allocated").text  # frac05 + frac03
    assert "team-a" in text and browser.find_element(By.ID, "sim").is_displayed()
    shoot(browser, artifacts, "overview")


def test_2_frac05_and_frac03_are_two_segments_of_one_gpu(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "gpus")
    gpus = until("the GPU bars", lambda: browser.find_elements(By.CSS_SELECTOR, ".gpu"))
    assert len(gpus) == 2
    holding = [g for g in gpus if g.find_elements(By.CSS_SELECTOR, ".seg.share")]
    assert len(holding) == 1, "both shares must be on one GPU"
    segs = holding[0].find_elements(By.CSS_SELECTOR, ".seg.share")
    assert sorted(s.get_attribute("data-workload") for s in segs) == ["frac03", "frac05"]
    titles = {s.get_attribute("data-workload"): s.get_attribute("title") for s in segs}
    assert "team-a" in titles["frac05"] and "GiB" in titles["frac05"]
    widths = {s.get_attribute("data-workload"): s.size["width"] for s in segs}
    assert widths["frac05"] > widths["frac03"] > 0
    assert "simulated" in browser.find_element(By.ID, "main").text
    shoot(browser, artifacts, "gpus")


def test_3_submit_through_the_form_and_see_it_running(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "submit")
    until("the form", lambda: browser.find_element(By.ID, "submit-button"))
    browser.find_element(By.ID, "s-name").send_keys("from-console")
    Select(browser.find_element(By.ID, "s-project")).select_by_value("team-b")
    portion = browser.find_element(By.ID, "s-portion")
    portion.clear()
    portion.send_keys("0.25")
    browser.find_element(By.ID, "s-command").send_keys("sleep")
    browser.find_element(By.ID, "s-args").send_keys("600")
    shoot(browser, artifacts, "submit")
    browser.find_element(By.ID, "submit-button").click()
    until("the workload page", lambda: browser.find_element(By.ID, "w-suspend"))
    until("Running", lambda: "Running" in browser.find_element(By.ID, "main").text, timeout=30)
    assert "0.25" in browser.find_element(By.ID, "w-request").text
    shoot(browser, artifacts, "workload")
    assert server.cli_json("describe", "from-console", "-p", "team-b")["phase"] == "Running"


def test_4_a_bad_portion_shows_the_fields_error(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "submit")
    until("the form", lambda: browser.find_element(By.ID, "submit-button"))
    browser.find_element(By.ID, "s-name").send_keys("too-big")
    portion = browser.find_element(By.ID, "s-portion")
    portion.clear()
    portion.send_keys("1.5")
    browser.find_element(By.ID, "s-command").send_keys("sleep")
    browser.find_element(By.ID, "submit-button").click()
    slot = browser.find_element(By.CSS_SELECTOR, '.err[data-for="s-portion"]')
    message = until("the field's error", lambda: slot.text)
    assert "gpuPortionRequest" in message or "portion" in message.lower()
    assert "invalid" in (portion.get_attribute("class") or "")
    shoot(browser, artifacts, "submit-error")
    assert server.cli("describe", "too-big", "-p", "team-a", check=False).returncode != 0


def test_5_a_project_edit_changes_only_the_field_edited(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "projects")
    until("the projects", lambda: browser.find_element(By.CSS_SELECTOR, '[data-edit="team-b"]')).click()
    weight = until("the editor", lambda: browser.find_element(By.ID, "p-weight"))
    weight.clear()
    weight.send_keys("3")
    shoot(browser, artifacts, "project-edit")
    browser.find_element(By.ID, "save-project").click()
    until("the update", lambda: "updated" in browser.find_element(By.ID, "toast").text)
    with server.http() as c:
        p = c.get("/api/v1/org-unit/projects/team-b").json()
    gpu = p["resources"]["gpu"]
    assert (gpu["overQuotaWeight"], gpu["deserved"], gpu["limit"]) == (3, 1, 2)
    shoot(browser, artifacts, "projects")


def test_6_suspend_and_resume(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "workloads?search=from-console")
    until("the row", lambda: browser.find_element(By.CSS_SELECTOR, '[data-workload="from-console"]')).click()
    until("Suspend shown (the page drawn for Running)", lambda: browser.find_element(
        By.ID, "w-suspend").is_displayed())
    browser.find_element(By.ID, "w-suspend").click()
    until("Stopped", lambda: server.cli_json("describe", "from-console", "-p", "team-b")["phase"]
          == "Stopped", timeout=30)
    # the page updates in place and shows Resume once the workload is Stopped (phase-aware)
    until("Resume shown", lambda: browser.find_element(By.ID, "w-resume").is_displayed(), timeout=15)
    assert not browser.find_element(By.ID, "w-suspend").is_displayed()
    browser.find_element(By.ID, "w-resume").click()
    until("Running again", lambda: server.cli_json("describe", "from-console", "-p", "team-b")[
        "phase"] == "Running", timeout=30)
    until("the events", lambda: "resumed" in browser.find_element(By.ID, "events").text.lower(),
          timeout=10)


def test_7_workloads_list_filters(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "workloads")
    until("the table", lambda: browser.find_elements(By.CSS_SELECTOR, "#workloads tbody tr[data-workload]"))
    Select(browser.find_element(By.ID, "w-project")).select_by_value("team-b")
    until("the filtered table", lambda: [r.get_attribute("data-workload") for r in browser.find_elements(
        By.CSS_SELECTOR, "#workloads tbody tr[data-workload]")] == ["from-console"])
    shoot(browser, artifacts, "workloads")


def test_8_metrics_page_draws_charts_with_data(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "metrics")
    chart = until("the chart", lambda: browser.find_element(By.CSS_SELECTOR, "#chart-projects canvas"))
    assert chart.size["width"] > 200
    points = int(browser.find_element(By.ID, "chart-projects").get_attribute("data-points") or 0)
    assert points >= 2
    legend = browser.find_element(By.ID, "chart-projects").text
    assert "team-a" in legend
    shoot(browser, artifacts, "metrics")


def test_9_phone_width_and_keyboard(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.set_window_size(390, 844)
    try:
        for page in ("overview", "gpus", "workloads", "projects"):
            go(browser, server, page)
            until(page, lambda: "Loading" not in browser.find_element(By.ID, "main").text)
            width = browser.execute_script("return document.documentElement.scrollWidth")
            assert width <= 400, f"{page} scrolls sideways at 390 px ({width} px)"
            shoot(browser, artifacts, f"phone-{page}")
    finally:
        browser.set_window_size(1280, 900)
    go(browser, server, "workloads")
    row = until("a row", lambda: browser.find_element(By.CSS_SELECTOR, "#workloads tbody tr[data-workload]"))
    assert row.get_attribute("tabindex") == "0"
    from selenium.webdriver.common.keys import Keys

    row.send_keys(Keys.ENTER)
    until("the detail page by keyboard", lambda: browser.find_element(By.ID, "w-suspend"))
