"""Helpers of the console's browser tests (Debian's Chromium, headless, driven by Selenium
through chromium-driver; the ``browser`` and ``artifacts`` fixtures are in conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tessera.testing.embedded import EmbeddedServer

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):  # scripts/setup.d installs them; say so instead of passing
    pytest.fail("Debian's chromium and chromium-driver are needed (./dev setup installs them)",
                pytrace=False)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from tests import waiting  # noqa: E402


def until(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Polls while the page is still drawing (an exception counts as not yet)."""
    return waiting.wait_until(what, check, timeout, ignore=(Exception,))


def shoot(browser: webdriver.Chrome, artifacts: Path, name: str) -> None:
    browser.save_screenshot(str(artifacts / f"{name}.png"))


def go(browser: webdriver.Chrome, server: EmbeddedServer, page: str) -> None:
    browser.get(f"{server.url}/#/{page}")


def login(browser: webdriver.Chrome, server: EmbeddedServer) -> None:
    browser.get(f"{server.url}/")
    until("the login page", lambda: browser.find_element(By.ID, "login-button"))
    creds = server.credentials()
    browser.find_element(By.ID, "client-id").send_keys(creds["clientId"])
    browser.find_element(By.ID, "client-secret").send_keys(creds["clientSecret"])
    browser.find_element(By.ID, "login-button").click()
    until("the overview", lambda: browser.find_element(By.ID, "card-allocated"))
