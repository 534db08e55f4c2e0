"""/redoc in a real browser (Debian's Chromium, headless) makes no request off the machine: the
page renders the API from the server's own assets, and the one outside asset ReDoc's bundle asks
for (its vendor's logo on cdn.redoc.ly) is refused by the page's Content-Security-Policy before
any request is made."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from tests.console.browsing import until

WATCH = """window.__blocked = [];
document.addEventListener('securitypolicyviolation', (e) => window.__blocked.push(e.blockedURI));"""


def test_redoc_renders_offline(browser, server) -> None:  # type: ignore[no-untyped-def]
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
    browser.get(f"{server.url}/redoc")
    until("the API rendered", lambda: "tessera API" in browser.find_element(By.TAG_NAME, "body").text,
          timeout=30)
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map((r) => r.name)")
    blocked = browser.execute_script("return window.__blocked")
    # Chromium lists the refused image among the resources too; every other one is this server's
    outside = [r for r in resources if not r.startswith((server.url, "blob:", "data:"))]
    assert outside == blocked, (resources, blocked)
    assert blocked == ["https://cdn.redoc.ly/redoc/logo-mini.svg"], blocked  # refused, not fetched
