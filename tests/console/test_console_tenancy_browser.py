"""The console's tenancy in a real browser (Debian's Chromium through Selenium) against a real
embedded server: a researcher of team-a signs in with a password and sees nothing of team-b on
any page; Log out revokes the token on the server; a generated first password must be changed;
an admin's Departments, Access, Audit and Reports pages."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.console.browsing import go, login, shoot, until

PASSWORD = "Correct-Horse-42"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("console-tenancy"), simulate=["2xV100-16GB"])
    s.start()
    try:
        with s.http() as admin:
            for p in ("team-a", "team-b"):
                admin.post("/api/v1/org-unit/projects", json={"name": p,
                                                              "resources": {"gpu": {"deserved": 1}}})
            admin.post("/api/v1/workloads/trainings", json=submit_body(
                "bsecretjob", "team-b", gpuRequestType="portion", gpuPortionRequest=0.5))
            admin.post("/api/v1/workloads/trainings", json=submit_body(
                "ajob", "team-a", gpuRequestType="portion", gpuPortionRequest=0.25))
            admin.post("/api/v1/users", json={"username": "rita", "password": PASSWORD})
            admin.post("/api/v1/authorization/access-rules", json={
                "subjectType": "user", "subjectId": "rita", "roleName": "researcher",
                "scopeType": "project", "scopeId": "team-a"})
        yield s
    finally:
        s.cleanup()


def _password_login(browser, server: EmbeddedServer, name: str, password: str) -> None:  # type: ignore[no-untyped-def]
    browser.execute_script("localStorage.clear()")
    browser.get(f"{server.url}/#/login")
    until("the login page", lambda: browser.find_element(By.ID, "username"))
    browser.find_element(By.ID, "username").send_keys(name)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "login-button").click()


def test_1_researcher_of_team_a_sees_nothing_of_team_b(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{server.url}/")
    _password_login(browser, server, "rita", PASSWORD)
    until("the overview", lambda: browser.find_element(By.ID, "card-allocated"))
    assert "team-b" not in browser.find_element(By.ID, "main").text
    for page, marker in (("projects", "team-a"), ("workloads", "ajob"), ("gpus", None),
                         ("reports", None), ("metrics", None)):
        go(browser, server, page)
        if marker:
            until(f"{page} shows {marker}",
                  lambda m=marker: m in browser.find_element(By.ID, "main").text)
        else:
            until(f"{page} drawn", lambda: "Loading" not in browser.find_element(By.ID, "main").text)
        text = browser.find_element(By.ID, "main").text
        assert "team-b" not in text and "bsecretjob" not in text, (page, text)
        shoot(browser, artifacts, f"researcher-{page}")
    # Log out revokes the token on the server, not only in the browser
    token = browser.execute_script("return localStorage.getItem('tessera.token')")
    assert httpx.get(f"{server.url}/api/v1/me",
                     headers={"Authorization": f"Bearer {token}"}).status_code == 200
    browser.find_element(By.ID, "logout").click()
    until("the login page", lambda: browser.find_element(By.ID, "username"))
    until("the token revoked", lambda: httpx.get(
        f"{server.url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}
    ).status_code == 401)


def test_2_generated_first_password_is_changed_at_first_login(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    with server.http() as admin:
        temp = admin.post("/api/v1/users", json={"username": "gene"}).json()["tempPassword"]
        admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "user", "subjectId": "gene", "roleName": "viewer",
            "scopeType": "project", "scopeId": "team-a"})
    _password_login(browser, server, "gene", temp)
    until("the password form", lambda: browser.find_element(By.ID, "new-password"))
    browser.find_element(By.ID, "new-password").send_keys("short")
    browser.find_element(By.ID, "password-button").click()
    until("the policy's refusal", lambda: "policy" in browser.find_element(By.ID, "password-error").text)
    shoot(browser, artifacts, "change-password")
    browser.find_element(By.ID, "new-password").clear()
    browser.find_element(By.ID, "new-password").send_keys("Gene-Chose-This-1")
    browser.find_element(By.ID, "password-button").click()
    until("the overview", lambda: browser.find_element(By.ID, "card-allocated"))


def test_3_admin_pages_departments_access_audit_reports(browser, server, artifacts) -> None:  # type: ignore[no-untyped-def]
    browser.execute_script("localStorage.clear()")
    login(browser, server)
    go(browser, server, "departments")
    until("the form", lambda: browser.find_element(By.ID, "d-name"))
    browser.find_element(By.ID, "d-name").send_keys("research")
    browser.find_element(By.ID, "create-department").submit()
    until("the department", lambda: browser.find_element(By.CSS_SELECTOR, "tr[data-department=research]"))
    shoot(browser, artifacts, "departments")
    go(browser, server, "access")
    until("rita's rule", lambda: "user rita" in browser.find_element(By.ID, "rules").text)
    shoot(browser, artifacts, "access")
    go(browser, server, "audit")
    until("the audit", lambda: "/api/v1/org-unit/departments" in browser.find_element(By.ID, "audit").text)
    shoot(browser, artifacts, "audit")
    # measured use of team-a's workload, as the meter writes it (simulated GPUs measure none):
    # the chart shows a used bar beside the allocated one, team-b's row none
    from tessera.api.tenancy.ledger import Ledger

    ledger = Ledger(server.data / "tessera.db")
    try:
        [(wid, (name, project, user, _))] = [
            kv for kv in ledger.open_allocations().items() if kv[1][1] == "team-a"]
        now = time.time()
        ledger.add_used([(wid, name, project, user, now - 600, now - 300, 360.0)])
    finally:
        ledger.close()
    go(browser, server, "reports")
    until("both projects", lambda: browser.find_element(By.CSS_SELECTOR, "tr[data-key=team-b]")
          and browser.find_element(By.CSS_SELECTOR, "tr[data-key=team-a]"))
    row_a = browser.find_element(By.CSS_SELECTOR, "tr[data-key=team-a]")
    assert row_a.find_elements(By.CSS_SELECTOR, ".bar.used") and "0.10" in row_a.text
    row_b = browser.find_element(By.CSS_SELECTOR, "tr[data-key=team-b]")
    assert not row_b.find_elements(By.CSS_SELECTOR, ".bar.used") and "—" in row_b.text
    assert browser.find_element(By.ID, "report-csv").get_attribute("download") == \
        "gpu-hours-by-project.csv"
    shoot(browser, artifacts, "reports")
