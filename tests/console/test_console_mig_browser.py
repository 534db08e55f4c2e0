"""MIG in the web console (Debian's Chromium, headless): a real embedded server on the fake NVML
with an A100-40GB in MIG mode and a whole V100 (tests/local/test_mig_embedded.py). A MIG
workload submitted through the form's "a MIG partition" choice; the GPUs page draws the MIG
GPU's eight memory slots with the partition where it sits, named by its workload, and after the
workload is deleted the same partition as idle."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tessera.isolation.build import ensure_built
from tests.console.browsing import go, login, shoot, until
from tests.local.mig_server import MigServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigServer]:
    s = MigServer(tmp_path_factory.mktemp("console-mig"), ensure_built())
    with s.serving("team-a"):
        yield s


def _parts(browser):  # type: ignore[no-untyped-def]
    return browser.find_elements(By.CSS_SELECTOR, ".gpu.mig .seg.part")


def test_a_mig_workload_from_the_form_is_drawn_in_its_slots(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    go(browser, server, "submit")
    until("the form", lambda: browser.find_element(By.ID, "submit-form"))
    Select(browser.find_element(By.ID, "s-mode")).select_by_value("mig")
    assert not browser.find_element(By.ID, "s-devices").is_displayed()
    browser.find_element(By.ID, "s-name").send_keys("migform")
    browser.find_element(By.ID, "s-mig-profile").send_keys("3g.20gb")
    browser.find_element(By.ID, "s-command").send_keys("sleep")
    browser.find_element(By.ID, "s-args").send_keys("600")
    browser.find_element(By.ID, "submit-button").click()
    until("the workload page", lambda: "migform" in browser.find_element(By.ID, "main").text)
    assert until("running", lambda: "Running" in browser.find_element(By.ID, "main").text)
    assert "MIG 3g.20gb" in browser.find_element(By.ID, "w-request").text

    go(browser, server, "gpus")
    [part] = until("the partition", lambda: _parts(browser))
    assert part.get_attribute("data-profile") == "3g.20gb"
    assert part.get_attribute("data-workload") == "migform"
    assert "team-a" in part.get_attribute("title")
    bar = browser.find_element(By.CSS_SELECTOR, ".gpu.mig .bar.slots")
    assert abs(part.size["width"] / bar.size["width"] - 0.5) < 0.02  # 4 of 8 memory slots
    assert len(browser.find_elements(By.CSS_SELECTOR, ".gpu:not(.mig)")) == 1  # the V100
    shoot(browser, artifacts, "gpus-mig")

    server.cli("delete", "migform", "-p", "team-a")
    idle = until("the partition idle", lambda: [
        p for p in _parts(browser) if "idle" in (p.get_attribute("class") or "")])
    assert idle[0].get_attribute("data-profile") == "3g.20gb"
    assert "kept for reuse" in idle[0].get_attribute("title")


def test_a_bad_profile_shows_the_fields_error(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    go(browser, server, "submit")
    until("the form", lambda: browser.find_element(By.ID, "submit-form"))
    Select(browser.find_element(By.ID, "s-mode")).select_by_value("mig")
    browser.find_element(By.ID, "s-name").send_keys("migbad")
    browser.find_element(By.ID, "s-mig-profile").send_keys("5g.99gb")
    browser.find_element(By.ID, "s-command").send_keys("true")
    browser.find_element(By.ID, "submit-button").click()
    slot = browser.find_element(By.CSS_SELECTOR, '.err[data-for="s-mig-profile"]')
    err = until("the field's error", lambda: slot.text)
    assert "not a MIG profile of any GPU tessera knows" in err, err
    shoot(browser, artifacts, "submit-mig-error")
