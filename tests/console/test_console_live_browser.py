"""The console while things change, in a real browser (Debian's Chromium, headless) against a
real embedded server: the workload page is updated in place (keyboard focus, a text selection and
the log's scroll position survive its refreshes), shows what the API knows (start time, duration,
exit code and failure, service URL as a link, one log per pod, buttons for the phase), and when
the server stops a banner says so with the time of the data shown, and goes once the server is
back, without the user navigating. Also: a title per page, the favicon, and the token kept for a
new tab."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By

from tessera.testing.embedded import EmbeddedServer, free_port
from tests.console.browsing import go, login, shoot, until

PRINTER = "import time\nfor i in range(100000):\n    print('line', i, flush=True); time.sleep(0.05)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("console-live"), simulate=["2xV100-16GB"])
    with s.serving("team-a", gpu="2"):
        port = free_port()
        s.cli("workspace", "submit", "talker", "-p", "team-a", "-g", "0.25", "--workers", "1",
              "--port", str(port), "--", "python3", "-c", PRINTER)
        s.cli("submit", "pair", "-p", "team-a", "-g", "0.1", "--workers", "2", "--", "sleep", "600")
        s.cli("submit", "crash", "-p", "team-a", "-g", "0.1", "--", "sh", "-c",
              "echo loading; echo 'RuntimeError: CUDA out of memory' >&2; exit 3")
        s.cli("wait", "talker", "pair", "-p", "team-a", "--timeout", "60")
        s.cli("submit", "hog", "-p", "team-a", "-g", "2", "--", "sleep", "600")  # waits
        yield s


def _open(browser, server, name: str) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, f"workloads?search={name}")
    until("the row", lambda: browser.find_element(By.CSS_SELECTOR, f'[data-workload="{name}"]')).click()
    until("the page", lambda: browser.find_element(By.ID, "w-name").text == name)


def test_the_workload_page_keeps_focus_selection_and_scroll(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    _open(browser, server, "talker")
    assert browser.title == "talker · tessera"
    until("Running", lambda: browser.find_element(By.ID, "w-phase").text == "Running")
    assert browser.find_element(By.ID, "w-suspend").is_displayed()
    assert not browser.find_element(By.ID, "w-resume").is_displayed()
    [link] = browser.find_elements(By.CSS_SELECTOR, "#w-urls a")
    assert link.get_attribute("href").startswith("http://127.0.0.1:")
    assert "so far" in browser.find_element(By.ID, "w-duration").text
    assert browser.find_element(By.ID, "w-started").text not in ("", "not started yet")
    log = browser.find_element(By.ID, "log")
    until("a log to scroll", lambda: browser.execute_script(
        "return arguments[0].scrollHeight > arguments[0].clientHeight + 200", log), timeout=30)

    browser.execute_script("document.getElementById('w-suspend').focus()")
    browser.execute_script("""const r = document.createRange();
      r.selectNodeContents(document.getElementById('w-request'));
      const s = getSelection(); s.removeAllRanges(); s.addRange(r);""")
    browser.execute_script("arguments[0].scrollTop = 0", log)
    lines = len(log.text.splitlines())
    time.sleep(9)  # two of the page's refreshes (every 4 s) and nine of the log's (every 1 s)
    assert browser.switch_to.active_element.get_attribute("id") == "w-suspend"
    assert browser.execute_script("return getSelection().toString()") == "0.25 GPU"
    assert browser.execute_script("return arguments[0].scrollTop", log) == 0
    assert len(log.text.splitlines()) > lines  # the log kept growing meanwhile
    shoot(browser, artifacts, "workload-live")


def test_logs_per_pod_and_a_failure(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    _open(browser, server, "pair")
    options = until("two pods", lambda: browser.find_elements(By.CSS_SELECTOR, "#log-pod option")
                    if len(browser.find_elements(By.CSS_SELECTOR, "#log-pod option")) == 2 else None)
    assert [o.text for o in options] == ["pod 0", "pod 1"]
    _open(browser, server, "crash")
    failure = until("the failure", lambda: browser.find_element(By.ID, "w-failure")
                    if browser.find_element(By.ID, "w-failure").is_displayed() else None)
    assert "exit code 3" in failure.text
    assert browser.find_element(By.ID, "w-exit").text == "3"
    assert not browser.find_element(By.ID, "w-suspend").is_displayed()
    assert not browser.find_element(By.ID, "w-resume").is_displayed()
    shoot(browser, artifacts, "workload-failed")


def test_titles_favicon_and_a_new_tab(browser, server) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "gpus")
    until("the GPUs title", lambda: browser.title == "GPUs · tessera")
    r = httpx.get(f"{server.url}/favicon.ico", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    try:
        go(browser, server, "overview")
        until("the overview, logged in", lambda: browser.find_element(By.ID, "card-allocated"))
    finally:
        browser.close()
        browser.switch_to.window(first)


def test_a_banner_while_the_server_is_down(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "overview")
    until("the overview", lambda: browser.find_element(By.ID, "card-allocated"))
    banner = browser.find_element(By.ID, "down")
    assert not banner.is_displayed()
    server.stop(stop_workloads=False)
    try:
        until("the banner", lambda: banner.is_displayed(), timeout=20)
        assert "cannot be reached" in banner.text and "showing data from" in banner.text
        assert browser.find_element(By.ID, "card-allocated")  # the last data stays on screen
        shoot(browser, artifacts, "server-down-banner")
    finally:
        server.start()
    until("the banner gone", lambda: not banner.is_displayed(), timeout=45)
    assert browser.current_url.endswith("#/overview")
    until("the overview again", lambda: browser.find_element(By.ID, "card-allocated"))


def test_the_list_for_operators(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "workloads")
    rows = until("the rows", lambda: browser.find_elements(By.CSS_SELECTOR, "#workloads tbody tr[data-workload]"))
    cells = {r.get_attribute("data-workload"): [c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows}
    assert "idle GPUs" in cells["hog"][4]  # the pending reason, visible in its column
    assert cells["pair"][4] == ""  # running: no reason
    assert cells["pair"][6] == "0.2 / 0.2" and cells["pair"][7] == "2 / 0"
    assert cells["hog"][7] == "0 / 1"
    link = browser.find_element(By.CSS_SELECTOR, '[data-workload="talker"] a.rowlink')
    assert "#/workload/workspaces/" in link.get_attribute("href")

    def names() -> list[str]:
        return [r.get_attribute("data-workload") for r in browser.find_elements(
            By.CSS_SELECTOR, "#workloads tbody tr[data-workload]")]
    browser.find_element(By.CSS_SELECTOR, 'button[data-sort="name"]').click()
    until("sorted by name", lambda: names() == sorted(names()) and len(names()) == 4)
    assert "sort=name" in browser.current_url and "order=asc" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, 'button[data-sort="name"]').click()
    until("sorted by name, descending", lambda: names() == sorted(names(), reverse=True) and len(names()) == 4)
    shoot(browser, artifacts, "workloads-operators")


def test_the_overview_for_operators(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "overview")
    waits = until("the pending list", lambda: browser.find_element(By.ID, "pending-waits"))
    quota = waits.find_element(By.CSS_SELECTOR, '[data-wait="quota"]')
    assert quota.text.startswith("1 waiting for quota") and "hog (team-a)" in quota.text
    rows = [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, "#capacity tbody tr")]
    assert [r[:2] for r in rows] == [["V100-16GB", "2"]]
    assert "on vm GPU" in rows[0][4]  # the largest free slot and where it is
    assert browser.find_element(By.CSS_SELECTOR, "#card-trend svg.spark")
    badges = [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".panel .row a.badge")]
    assert badges == sorted(badges, key=lambda t: ["Pending", "Running", "Stopping", "Stopped",
                                                   "Completed", "Failed"].index(t.split()[0]))
    shoot(browser, artifacts, "overview-operators")


def test_the_form_takes_workers_and_environment(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "submit")
    until("the form", lambda: browser.find_element(By.ID, "submit-button"))
    modes = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#s-mode option")]
    assert "mig" not in modes  # no GPU in MIG mode on this machine: the choice is not offered
    browser.find_element(By.ID, "s-name").send_keys("formpair")
    portion = browser.find_element(By.ID, "s-portion")
    portion.clear()
    portion.send_keys("0.1")
    workers = browser.find_element(By.ID, "s-workers")
    workers.clear()
    workers.send_keys("2")
    browser.find_element(By.ID, "s-env").send_keys("FOO=bar=baz")
    browser.find_element(By.ID, "s-command").send_keys("sleep")
    browser.find_element(By.ID, "s-args").send_keys("600")
    browser.find_element(By.ID, "submit-button").click()
    until("the workload page", lambda: browser.find_element(By.ID, "w-name").text == "formpair")
    assert until("the request", lambda: browser.find_element(By.ID, "w-request").text) == "2 × 0.1 GPU"
    doc = server.cli_json("describe", "formpair", "-p", "team-a")
    assert doc["workers"] == 2
    assert {"name": "FOO", "value": "bar=baz"} in doc["spec"]["environmentVariables"]
