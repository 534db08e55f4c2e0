"""Findings 1-3 and 6 of issue 14 (embedded mode, real server): input that once stopped every
scheduling cycle, froze the API or was stored half-created is refused with 4xx naming the field,
nothing is stored, and scheduling goes on."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tessera.testing.embedded import EmbeddedServer, submit_body

PROJECT = "rb"


@pytest.fixture(scope="module")
def client(server: EmbeddedServer) -> httpx.Client:
    c = server.http()
    c.post("/api/v1/org-unit/projects", json={"name": PROJECT, "resources": {"gpu": {
        "deserved": 2}}}).raise_for_status()
    return c


def _names(c: httpx.Client) -> set[str]:
    return {w["name"] for w in c.get("/api/v1/workloads", params={"limit": 1000}).json()[
        "workloads"]}


def post(c: httpx.Client, url: str, body: Any) -> httpx.Response:
    """POST JSON as a client may send it: ``\\ud800`` escapes for lone surrogates (httpx's own
    encoder cannot put them in UTF-8)."""
    return c.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"})


def _refused(c: httpx.Client, body: dict[str, Any], field: str) -> str:
    before = _names(c)
    r = post(c, "/api/v1/workloads/trainings", body)
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert field in message, message
    assert not _names(c) - before  # nothing half-created
    return str(message)


def _still_schedules(server: EmbeddedServer, c: httpx.Client, name: str,
                     then: Callable[[str], None] | None = None) -> None:
    """A workload still runs after the bad input; ``then(workload id)`` runs while it does."""
    r = c.post("/api/v1/workloads/trainings", json=submit_body(name, PROJECT,
                                                                gpuPortionRequest=0.1))
    assert r.status_code == 202, r.text
    wid = r.json()["workloadId"]
    server.wait_phase(c, "trainings", wid, "Running")
    if then is not None:
        then(wid)
    c.delete(f"/api/v1/workloads/trainings/{wid}")


BAD_TEXT = {
    "nul": "a\x00b",
    "surrogate": "a\ud800b",
}


@pytest.mark.parametrize("bad", sorted(BAD_TEXT))
def test_nul_and_lone_surrogates_are_refused_in_every_text_field(
        server: EmbeddedServer, client: httpx.Client, bad: str) -> None:
    value = BAD_TEXT[bad]

    def body(**spec: Any) -> dict[str, Any]:
        b = submit_body(f"t-{bad}", PROJECT, gpuPortionRequest=0.1)
        b["spec"].update(spec)
        return b

    _refused(client, body(environmentVariables=[{"name": "X", "value": value}]),
             "environmentVariables.0.value")
    _refused(client, body(command=f"echo {value}"), "spec.command")
    _refused(client, body(args=value), "spec.args")
    _refused(client, body(workingDir=f"/tmp/{value}"), "spec.workingDir")
    _refused(client, body(image=value, command=""), "spec.image")
    b = body()
    b["name"] = f"x{value}"
    _refused(client, b, "name")
    r = post(client, "/api/v1/org-unit/projects", {"name": f"p{value}"})
    assert r.status_code == 422 and "name" in r.json()["message"]

    def exec_refused(wid: str) -> None:  # exec into a running workload: the argv is refused too
        r = post(client, f"/api/v1/workloads/trainings/{wid}/exec", {"command": ["echo", value]})
        assert r.status_code == 422 and r.json()["message"].startswith("command.1"), r.text

    _still_schedules(server, client, f"after-{bad}", exec_refused)


def test_names_ending_in_a_newline_are_refused(client: httpx.Client) -> None:
    b = submit_body("ends\n", PROJECT, gpuPortionRequest=0.1)
    assert "lowercase" in _refused(client, b, "name")
    r = client.post("/api/v1/org-unit/projects", json={"name": "proj\n"})
    assert r.status_code == 422 and r.json()["message"].startswith("name:")


@pytest.mark.parametrize(("field", "value"), [
    ("gpuMemoryRequest", "1e999999G"), ("gpuMemoryRequest", "1e400Gi"), ("gpuMemoryRequest",
                                                                       "1e1000000Mi"),
    ("gpuMemoryRequest", "9" * 5000 + "G"), ("gpuPortionRequest", "1e999999"),
    ("gpuPortionRequest", "0." + "5" * 5000),
])
def test_huge_quantities_are_refused_not_computed(client: httpx.Client, field: str,
                                                   value: str) -> None:
    compute: dict[str, Any] = {field: value}
    if field == "gpuMemoryRequest":
        compute["gpuRequestType"] = "memory"
    message = _refused(client, {"name": "huge", "projectId": PROJECT, "spec": {
        "command": "sleep", "args": "1", "compute": compute}}, field)
    assert "out of range" in message or "at most" in message


def test_huge_memory_limit_is_refused(client: httpx.Client) -> None:
    _refused(client, {"name": "huge-limit", "projectId": PROJECT, "spec": {
        "command": "sleep", "args": "1", "compute": {
            "gpuRequestType": "memory", "gpuMemoryRequest": "1G", "gpuMemoryLimit": "1e5000"}}},
        "gpuMemoryLimit")


def test_a_body_over_the_limit_is_413_and_the_server_stays_responsive(
        server: EmbeddedServer, client: httpx.Client) -> None:
    body = submit_body("long-word", PROJECT, args="x" * 1_600_000, gpuPortionRequest=0.1)
    health: list[int] = []
    t = threading.Thread(target=lambda: health.append(
        httpx.get(f"{server.url}/healthz", timeout=30).status_code))
    t.start()
    r = client.post("/api/v1/workloads/trainings", json=body)
    t.join()
    assert r.status_code == 413, r.text
    assert r.json()["details"][0]["field"] == "body"
    assert health == [200]
    # within the body limit a word is bounded by the field (one argument <= 128 KiB)
    _refused(client, submit_body("long-arg", PROJECT, args="y" * 200_000,
                                 gpuPortionRequest=0.1), "spec.args")
    # a long quoted word below the bound works
    r = client.post("/api/v1/workloads/trainings", json=submit_body(
        "quoted", PROJECT, command="sh", args=f"-c 'exit 0' '{'z' * 100_000}'",
        gpuPortionRequest=0.1))
    assert r.status_code == 202, r.text
    server.wait_phase(client, "trainings", r.json()["workloadId"], "Completed")


def test_project_ids_past_sqlite_integers_are_names_not_errors(client: httpx.Client) -> None:
    """Found by the schema fuzzer: PATCH .../projects/9223372036854775808 was a 500 (SQLite
    cannot bind an integer past 2**63 - 1); a 5,000-digit id would pass int()'s limit too."""
    for ref in ("9223372036854775808", "9" * 5000):
        for method in ("GET", "PATCH", "PUT", "DELETE"):
            body = {} if method == "PATCH" else {"resources": {"gpu": {"deserved": 1}}}
            r = client.request(method, f"/api/v1/org-unit/projects/{ref}",
                               json=None if method in ("GET", "DELETE") else body)
            assert r.status_code == 404, (method, len(ref), r.status_code, r.text[:200])


def test_unknown_fields_are_refused_everywhere(client: httpx.Client) -> None:
    r = client.post("/api/v1/org-unit/projects", json={"name": "extra", "colour": "red"})
    assert r.status_code == 422 and r.json()["message"].startswith("colour:")
    r = client.put(f"/api/v1/org-unit/projects/{PROJECT}", json={"resources": {"gpu": {
        "deserved": 2, "deservd": 3}}})
    assert r.status_code == 422 and "resources.gpu.deservd" in r.json()["message"]
    b = submit_body("extra", PROJECT, gpuPortionRequest=0.1)
    b["spec"]["enviromentVariables"] = []
    _refused(client, b, "spec.enviromentVariables")
    b = submit_body("extra", PROJECT, gpuPortionRequest=0.1)
    b["priority"] = 3
    _refused(client, b, "priority")
    r = client.post("/api/v1/token", json={"clientId": "a", "clientSecret": "b", "scope": "x"})
    assert r.status_code == 422 and r.json()["message"].startswith("scope:")


def test_exec_errors_are_4xx_output_is_capped_and_timeouts_kill_the_group(
        server: EmbeddedServer, client: httpx.Client, tmp_path: Any) -> None:
    r = client.post("/api/v1/workloads/trainings", json=submit_body(
        "exec-target", PROJECT, gpuPortionRequest=0.1))
    wid = r.json()["workloadId"]
    server.wait_phase(client, "trainings", wid, "Running")
    url = f"/api/v1/workloads/trainings/{wid}/exec"
    r = client.post(url, json={"command": ["/tmp"]})
    assert r.status_code == 422 and r.json()["message"].startswith("command:"), r.text
    r = client.post(url, json={"command": [""]})
    assert r.status_code == 422 and r.json()["message"].startswith("command"), r.text
    r = client.post(url, json={"command": ["echo", "a" * 131072]})  # MAX_ARG_STRLEN with its NUL
    assert r.status_code == 422 and "command" in r.json()["message"], r.text
    r = client.post(url, json={"command": ["sh", "-c", "head -c 5000000 /dev/zero"]})
    assert r.status_code == 200
    assert len(r.json()["stdout"]) == 1024 * 1024 and r.json()["truncated"] is True
    marker = tmp_path / "grandchild.pid"
    r = client.post(url, json={"command": [
        "sh", "-c", f"sleep 300 & echo $! > {marker}; wait"], "timeoutSeconds": 1})
    assert r.status_code == 409 and "did not finish" in r.json()["message"]
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            threading.Event().wait(0.05)
    client.delete(f"/api/v1/workloads/trainings/{wid}")


def test_data_dir_files_are_private(server: EmbeddedServer) -> None:
    assert stat.S_IMODE(os.stat(server.data).st_mode) == 0o700
    for name in ("tessera.db", "credentials.json"):
        assert stat.S_IMODE(os.stat(server.data / name).st_mode) == 0o600, name
    for name in ("logs", "run"):
        assert stat.S_IMODE(os.stat(server.data / name).st_mode) == 0o700, name


def test_token_revocation(server: EmbeddedServer) -> None:
    creds = server.credentials()
    token = httpx.post(f"{server.url}/api/v1/token", json=creds).json()["accessToken"]
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{server.url}/api/v1/cluster", headers=auth).status_code == 200
    assert httpx.delete(f"{server.url}/api/v1/token", headers=auth).status_code == 204
    assert httpx.get(f"{server.url}/api/v1/cluster", headers=auth).status_code == 401
    assert httpx.delete(f"{server.url}/api/v1/token", headers=auth).status_code == 401


def test_cli_logout_revokes_the_saved_token(server: EmbeddedServer) -> None:
    server.cli("login")
    token = json.loads(server.config.read_text())["token"]
    out = server.cli("logout").stdout
    assert "token revoked" in out
    assert "token" not in json.loads(server.config.read_text())
    r = httpx.get(f"{server.url}/api/v1/cluster", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401


def test_unicode_digits_are_not_ids(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """'²'.isdigit() is True but int('²') fails: a project id made of such digits is a name that
    does not exist (404), never a server error (found by the OpenAPI fuzzer)."""
    from tessera.local.store import Store

    store = Store(tmp_path / "t.db")
    try:
        assert store.project("²") is None and store.project("١٢") is None
    finally:
        store.close()
