"""The Projects page in Chromium (issue 34, console review "Projects"): what each project
holds, asks for and has waiting; the bars on one scale for every row; a warning when the
deserved quotas add up to more GPUs than there are; Delete; and the table refreshed in place
(a workload submitted elsewhere shows without navigating)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.console.browsing import go, login, shoot, until

ROWS = """
return Object.fromEntries([...document.querySelectorAll('#projects tbody tr')].map((r) => [r.dataset.project, {
  cells: [...r.cells].map((c) => c.textContent),
  requested: r.querySelector('[data-col="requested"]').textContent,
  pending: r.querySelector('[data-col="pending"]').textContent,
  seg: parseFloat(r.querySelector('.bar .seg').style.width)}]));
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("console-projects"), simulate=["1xV100-16GB"])
    with s.serving("team-a", "team-b"):  # 1 + 1 deserved on one GPU
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token()}"},
                          timeout=30) as c:
            for body in [submit_body("half", "team-a", gpuPortionRequest=0.5, gpuRequestType="portion"),
                         submit_body("whole", "team-a", gpuDevicesRequest=1)]:  # waits: half is on the GPU
                r = c.post("/api/v1/workloads/trainings", json=body)
                assert r.status_code == 202, r.text
        s.cli("wait", "half", "-p", "team-a", "--timeout", "60")
        yield s


def test_requested_pending_one_scale_and_the_quota_warning(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    login(browser, server)
    go(browser, server, "projects")
    rows = until("team-a's row with its wait", lambda: (
        r if (r := browser.execute_script(ROWS)).get("team-a", {}).get("pending") == "1" else None))
    a, b = rows["team-a"], rows["team-b"]
    assert a["requested"] == "1.5" and b["requested"] == "0" and b["pending"] == "0"
    # one scale: the largest figure of any row (team-a's 1.5 requested) is the full bar
    assert abs(a["seg"] - 100 * 0.5 / 1.5) < 0.5 and b["seg"] == 0, (a, b)
    note = browser.find_element(By.ID, "quota-note")
    assert note.is_displayed() and "add up to 2 GPUs on 1" in note.text
    link = browser.find_element(By.CSS_SELECTOR, '[data-project="team-a"] [data-col="pending"] a')
    assert link.get_attribute("href").endswith("#/workloads?phase=Pending&project=team-a")
    shoot(browser, artifacts, "projects-requested-pending")

    # refreshed in place: a workload submitted elsewhere shows without navigating
    server.cli("submit", "b1", "-p", "team-b", "-g", "0.25", "--", "sleep", "600")
    until("team-b's request", lambda: browser.execute_script(ROWS)["team-b"]["requested"] == "0.25",
          timeout=30)


def test_delete_a_project(browser, server) -> None:  # type: ignore[no-untyped-def]
    server.cli("project", "create", "gone", "--gpu", "0")
    go(browser, server, "projects")
    until("its row", lambda: browser.find_element(By.CSS_SELECTOR, '[data-delete="gone"]')).click()
    alert = until("the confirmation", lambda: browser.switch_to.alert)
    assert "Delete project gone?" in alert.text
    alert.accept()
    until("the row gone", lambda: "gone" not in browser.execute_script(ROWS))
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token()}"}) as c:
        assert c.get("/api/v1/org-unit/projects/gone").status_code == 404
