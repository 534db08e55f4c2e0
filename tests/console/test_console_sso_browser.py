"""The console's single sign-on in a real browser (Chromium) against a real OIDC provider (Dex):
the login page's button runs the authorization code flow with PKCE and lands on the Overview
signed in as the provider's user, whose group's rule decides what it sees."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from tessera.testing.dex import GROUP, USER, sso_server
from tessera.testing.embedded import EmbeddedServer
from tests.console.browsing import go, shoot, until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    with sso_server(tmp_path_factory.mktemp("console-sso"), "viewer") as (s, _):
        yield s


def test_sso_button_signs_in_through_the_provider(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{server.url}/")
    browser.execute_script("localStorage.clear()")
    browser.get(f"{server.url}/#/login")
    until("the single sign-on button", lambda: browser.find_element(By.ID, "sso-login"))
    shoot(browser, artifacts, "login-sso")
    browser.find_element(By.ID, "sso-login").click()
    until("the overview", lambda: browser.find_element(By.ID, "card-allocated"), timeout=30)
    assert "#/overview" in browser.current_url and "/sso/" not in browser.current_url
    go(browser, server, "access")
    until("who I am", lambda: USER in browser.find_element(By.ID, "me").text)
    assert GROUP in browser.find_element(By.ID, "me").text
    go(browser, server, "projects")
    until("writers", lambda: "writers" in browser.find_element(By.ID, "main").text)
    assert "others" not in browser.find_element(By.ID, "main").text
    shoot(browser, artifacts, "sso-projects")
