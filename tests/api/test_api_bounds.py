"""The embedded API's bounds (issue 27): exec sessions cannot starve the API's workers, a
project named with digits is that project (never another's id), and a 128 KiB quoted command
splits in linear time exactly as shlex does."""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.exec_slots import EXEC_SESSIONS
from tessera.api.models import shell_words
from tessera.testing.embedded import EmbeddedServer, submit_body


def test_exec_sessions_cannot_starve_the_api(server: EmbeddedServer, tmp_path: Path) -> None:
    """45 exec sessions that each wait until the test lets them end (more than the 40 request
    workers FastAPI runs synchronous routes on): those beyond the exec bound are refused at once
    with 429 naming it, and the API keeps answering while the others hold their slots."""
    release = tmp_path / "release"
    with server.http() as c:
        c.post("/api/v1/org-unit/projects", json={
            "name": "p-starve", "resources": {"gpu": {"deserved": 1}}}).raise_for_status()
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "execs", "p-starve", gpuRequestType="portion", gpuPortionRequest=0.25))
        wid = r.json()["workloadId"]
        server.wait_phase(c, "trainings", wid, "Running")
    codes: list[int] = []
    lock = threading.Lock()
    wait = f"while [ ! -e {release} ]; do sleep 0.1; done"

    def one() -> None:
        with httpx.Client(base_url=server.url, timeout=120, headers={
                "Authorization": f"Bearer {server.token()}"}) as c:
            r = c.post(f"/api/v1/workloads/trainings/{wid}/exec",
                       json={"command": ["sh", "-c", wait], "timeoutSeconds": 100})
            with lock:
                codes.append(r.status_code)
            if r.status_code == 429:
                assert f"{EXEC_SESSIONS} exec sessions are already running" in r.json()[
                    "message"]

    threads = [threading.Thread(target=one) for _ in range(45)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(codes) < 45 - EXEC_SESSIONS:  # the refusals come back at once
            assert time.monotonic() < deadline, codes
            time.sleep(0.1)
        with httpx.Client(base_url=server.url, timeout=10, headers={
                "Authorization": f"Bearer {server.token()}"}) as c:
            r = c.get("/api/v1/org-unit/projects")
            assert r.status_code == 200, r.text
            assert c.get("/healthz").status_code == 200
        assert codes.count(429) == 45 - EXEC_SESSIONS and 200 not in codes, codes
    finally:
        release.touch()
        for t in threads:
            t.join()
    assert codes.count(200) == EXEC_SESSIONS, codes
    with server.http() as c:
        c.delete(f"/api/v1/workloads/trainings/{wid}")


def test_a_project_named_with_digits_is_that_project(server: EmbeddedServer) -> None:
    with server.http() as c:
        ids = {}
        for name in ("p-digits-a", "p-digits-b"):
            r = c.post("/api/v1/org-unit/projects", json={
                "name": name, "resources": {"gpu": {"deserved": 0, "limit": 2}}})
            ids[name] = r.json()["id"]
        victim = str(ids["p-digits-a"])
        # a project whose name is the digits of another project's id
        r = c.post("/api/v1/org-unit/projects", json={
            "name": victim, "resources": {"gpu": {"deserved": 0, "limit": 0.25}}})
        assert r.status_code == 201, r.text
        named = r.json()
        assert named["name"] == victim and str(named["id"]) != victim
        got = c.get(f"/api/v1/org-unit/projects/{victim}").json()
        assert got["name"] == victim and got["id"] == named["id"]
        # a submit for project "<digits>" is bound by that project's limit (0.25)
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "over", victim, gpuRequestType="portion", gpuPortionRequest=0.5))
        wid = r.json().get("workloadId") if r.status_code < 300 else None
        if wid is not None:
            w = c.get(f"/api/v1/workloads/trainings/{wid}").json()
            assert w["projectName"] == victim, w
            time.sleep(0.5)
            w = c.get(f"/api/v1/workloads/trainings/{wid}").json()
            assert w["phase"] == "Pending" and "limit" in w["phaseMessage"], w
            c.delete(f"/api/v1/workloads/trainings/{wid}")
            deadline = time.monotonic() + 15
            while c.get(f"/api/v1/workloads/trainings/{wid}").status_code != 404:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        else:
            assert "limit" in r.json()["message"], r.text
        # DELETE /projects/<digits> removes the project of that name, not the one of that id
        assert c.delete(f"/api/v1/org-unit/projects/{victim}").status_code == 204
        names = {p["name"] for p in c.get("/api/v1/org-unit/projects").json()["projects"]}
        assert "p-digits-a" in names and victim not in names, names
        # with no project of that name left, the digits are an id again
        assert c.get(f"/api/v1/org-unit/projects/{victim}").json()["name"] == "p-digits-a"


def test_a_128_kib_quoted_command_splits_fast_and_like_shlex() -> None:
    line = '"' + 'a\\" ' * (128 * 1024 // 4) + '"'
    words = shell_words(line)
    assert words == shlex.split(line)
    assert len(words) == 1 and len(words[0]) == 3 * 128 * 1024 // 4


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=["a", "b", " ", "\t", "\n", "\r", "'", '"', "\\", "$", "#", "\x0b"],
               max_size=14))
def test_shell_words_agree_with_shlex(line: str) -> None:
    try:
        want: object = shlex.split(line)
    except ValueError as exc:
        want = ("error", str(exc))
    try:
        got: object = shell_words(line)
    except ValueError as exc:
        got = ("error", str(exc))
    assert got == want
