"""The GPUs page at scale in a real browser (Debian's Chromium, headless): 33 shares of 0.03 on
one simulated A100 beside a GPU holding two large shares. The GPU rows keep the container's width
(no horizontal scrolling, the numbers stay on screen), the bar stays proportional, the slivers
merge into one "+N shares" segment whose details show on keyboard focus, and every label's text
contrasts with its colour (WCAG 4.5:1). Measured at 1280 px and at a 390 px phone width."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.console.browsing import go, login, shoot, until

SMALL = 33


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("console-scale"), simulate=["2xA100-40GB"])
    with s.serving("sweep", gpu="2"):
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token()}"},
                          timeout=30) as c:
            for body in [submit_body("big-a", "sweep", gpuPortionRequest=0.6, gpuRequestType="portion"),
                         submit_body("big-b", "sweep", gpuPortionRequest=0.3, gpuRequestType="portion"),
                         *[submit_body(f"sweep-{i:02d}", "sweep", gpuPortionRequest=0.03,
                                       gpuRequestType="portion") for i in range(SMALL)]]:
                r = c.post("/api/v1/workloads/trainings", json=body)
                assert r.status_code == 202, r.text
        s.cli("wait", "big-a", "big-b", *[f"sweep-{i:02d}" for i in range(SMALL)], "-p", "sweep",
              "--timeout", "120")
        yield s


LAYOUT = """
const rows = [...document.querySelectorAll('.gpu')].map((g) => {
  const panel = g.closest('.panel');
  const cs = getComputedStyle(panel);
  const inner = panel.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const bar = g.querySelector('.bar');
  const segs = [...bar.children].filter((s) => !s.classList.contains('headroom'));
  const num = g.querySelector('.num').getBoundingClientRect();
  return {row: g.getBoundingClientRect().width, inner, scroll: panel.scrollWidth - panel.clientWidth,
          bar: bar.getBoundingClientRect().width, numRight: num.right,
          viewport: document.documentElement.clientWidth,
          segs: segs.map((s) => ({w: s.getBoundingClientRect().width, pct: parseFloat(s.style.width),
                                  cls: s.className, label: s.textContent}))};
});
return rows;
"""

CONTRAST = """
function lum(c) {
  const v = c.match(/[0-9.]+/g).slice(0, 3).map(Number).map((x) => { x /= 255;
    return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2];
}
return [...document.querySelectorAll('.seg.share')].map((s) => {
  const a = lum(getComputedStyle(s).color), b = lum(getComputedStyle(s).backgroundColor);
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
});
"""


def _check_layout(browser) -> list[dict]:  # type: ignore[no-untyped-def]
    rows = until("the GPU rows", lambda: browser.execute_script(LAYOUT))
    assert len(rows) == 2
    for r in rows:
        assert abs(r["row"] - r["inner"]) <= 1, r  # the row is exactly the container's width
        assert r["scroll"] <= 0, r  # nothing to scroll sideways
        assert r["numRight"] <= r["viewport"], r  # the numbers are on screen
        for s in r["segs"]:  # proportional: each segment is its share of the bar, not its label
            assert abs(s["w"] - r["bar"] * s["pct"] / 100) <= 1.5, (s, r["bar"])
    return rows


def test_many_small_shares_keep_the_row_and_merge(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    go(browser, server, "gpus")
    until("the merged segment", lambda: browser.find_elements(By.CSS_SELECTOR, ".seg.more"))
    rows = _check_layout(browser)
    crowded = next(r for r in rows if any("more" in s["cls"] for s in r["segs"]))
    [more] = [s for s in crowded["segs"] if "more" in s["cls"]]
    placed_small = int(browser.find_element(By.CSS_SELECTOR, ".seg.more").get_attribute("data-merged"))
    assert more["label"] == f"+{placed_small} shares" and placed_small >= 10
    shoot(browser, artifacts, "gpus-many-small-shares")

    # the merged segment is reachable from the keyboard, and focus shows what it holds
    seg = browser.find_element(By.CSS_SELECTOR, ".seg.more")
    browser.execute_script("""const all = [...document.querySelectorAll('.seg[tabindex="0"]')];
      all[all.indexOf(arguments[0]) - 1].focus();""", seg)  # the segment before it, then Tab
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert browser.switch_to.active_element == seg
    detail = seg.find_element(By.XPATH, "ancestor::div[contains(@class,'track')]//div[contains(@class,'segdetail')]")
    text = until("the details", lambda: detail.text)
    assert text.startswith(f"{placed_small} small shares") and "sweep-" in text and "(sweep)" in text
    shoot(browser, artifacts, "gpus-merged-focused")

    ratios = browser.execute_script(CONTRAST)
    assert ratios and min(ratios) >= 4.5, ratios


def test_the_phone_width_keeps_rows_too(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.set_window_size(390, 844)
    try:
        go(browser, server, "gpus")
        until("the merged segment", lambda: browser.find_elements(By.CSS_SELECTOR, ".seg.more"))
        rows = until("the GPU rows", lambda: browser.execute_script(LAYOUT))
        for r in rows:
            assert r["scroll"] <= 0 and r["numRight"] <= r["viewport"], r
        shoot(browser, artifacts, "gpus-many-small-shares-phone")
    finally:
        browser.set_window_size(1280, 900)


def test_a_refresh_redraws_a_changed_node_and_keeps_focus(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    """Every 5 s the page draws again only the nodes whose data changed; the segment that had
    keyboard focus has it again in the new drawing (not lost to <body>)."""
    go(browser, server, "gpus")
    seg = until("big-a's segment", lambda: browser.find_element(By.CSS_SELECTOR, '.seg.share[data-workload="big-a"]'))
    browser.execute_script("arguments[0].focus(); arguments[0].__old = true;", seg)
    server.cli("submit", "late", "-p", "sweep", "-g", "0.03", "--", "sleep", "600")

    def redrawn() -> bool:  # a new element for big-a (the node drawn again), and it has focus
        return bool(browser.execute_script(
            "const a = document.activeElement;"
            " return !!a && a.dataset.workload === 'big-a' && !a.__old"
            " && [...document.querySelectorAll('.seg')].some((s) => (s.getAttribute('aria-label') || '').includes('late'));"))
    until("the node drawn again with late, focus kept on big-a", redrawn, timeout=30)
    active = browser.switch_to.active_element
    assert active.get_attribute("data-workload") == "big-a"
    server.cli("delete", "late", "-p", "sweep")
