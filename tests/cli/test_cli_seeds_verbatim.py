"""The seeds' commands as users type them (issue #21): generated names, `--` never eaten as a
name, `config project`, `list jobs`, `bash`, `--interactive` on training refused, an image
with no command refused in one line where no container runtime works, errors naming flags."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest

from tessera.testing.embedded import EmbeddedServer, free_port
from tests.shares import share


class NoRuntimeServer(EmbeddedServer):
    def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
        return [*super().server_argv(simulate), "--runtime", "none"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = NoRuntimeServer(tmp_path_factory.mktemp("seeds"), simulate=["1xV100-16GB"])
    with s.serving("team-a"):
        yield s


def _run(srv: EmbeddedServer, *args: str, stdin: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera.cli.main", *args],
                          env={**srv.env, **(env or {})}, input=stdin, capture_output=True,
                          text=True, timeout=60)


def _err(srv: EmbeddedServer, *args: str) -> str:
    r = srv.cli(*args, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_config_project_is_project_set(srv: EmbeddedServer) -> None:
    out = srv.cli("config", "project", "team-a").stdout
    assert "team-a is now the default" in out


def test_a_command_after_dashdash_is_never_read_as_the_name(srv: EmbeddedServer) -> None:
    srv.cli("config", "project", "team-a")
    out = srv.cli("submit", "-g", "0.1", "--", "sleep", "60").stdout
    assert "(name generated)" in out
    name = out.split()[1]
    assert name.startswith("job-") and name != "sleep"
    doc = srv.cli_json("describe", name)
    assert doc["spec"]["command"] == "sleep" and doc["spec"]["args"] == "60"
    srv.cli("delete", name)


def test_generated_name_with_a_prefix(srv: EmbeddedServer) -> None:
    srv.cli("config", "project", "team-a")
    out = srv.cli("submit", "--job-name-prefix", "exp", "-g", "0.1", "--", "sleep", "30").stdout
    name = out.split()[1]
    assert name.startswith("exp-")
    srv.cli("delete", name)


def test_list_jobs_bash_and_exec(srv: EmbeddedServer) -> None:
    srv.cli("config", "project", "team-a")
    srv.cli("submit", "frac05", "-g", "0.5", "--interactive", "--", "sleep", "100")
    srv.cli("wait", "frac05", "--timeout", "20")
    table = srv.cli("list", "jobs").stdout
    assert "frac05" in table and "Running" in table
    assert "unknown listing" in _err(srv, "list", "bogus")
    r = _run(srv, "bash", "frac05", stdin="echo share=$TESSERA_SHARE_REQUEST_BYTES; exit 3\n")
    assert r.returncode == 3 and f"share={share(0.5)}" in r.stdout
    srv.cli("delete", "frac05")


def test_interactive_training_is_refused_not_ignored(srv: EmbeddedServer) -> None:
    line = _err(srv, "training", "submit", "t1", "-p", "team-a", "--interactive", "-g", "0.1",
                "--", "sleep", "1")
    assert line.startswith("error: --interactive:") and "workspace" in line
    assert srv.cli_json("list", "-p", "team-a")["workloads"] == [] or all(
        w["name"] != "t1" for w in srv.cli_json("list", "-p", "team-a")["workloads"])


def test_seed_image_without_command_needs_a_runtime(srv: EmbeddedServer) -> None:
    line = _err(srv, "submit", "frac05", "-p", "team-a", "-i", "gcr.io/run-ai-demo/quickstart",
                "-g", "0.5", "--interactive")
    assert line.startswith("error: -i: ")
    assert "container runtime (podman or docker)" in line and "-- python train.py" in line
    line = _err(srv, "submit", "-p", "team-a", "-i", "runai.jfrog.io/demo/quickstart",
                "--gpu-memory", "5G")
    assert "container runtime" in line


def test_seed_rest_body_with_image_and_no_command(srv: EmbeddedServer) -> None:
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token()}"}) as c:
        body = {"name": "frac05", "projectId": "team-a", "clusterId": "x",
                "spec": {"image": "runai.jfrog.io/demo/quickstart",
                         "compute": {"gpuRequestType": "portion", "gpuPortionRequest": 0.5}}}
        r = c.post("/api/v1/workloads/trainings", json=body)
        assert r.status_code == 422
        msg = r.json()["message"]
        assert msg.startswith("spec.image: ") and "container runtime" in msg
        assert "spec.command: is required" not in msg
        body["spec"].pop("image")
        r = c.post("/api/v1/workloads/trainings", json=body)
        assert r.status_code == 422 and r.json()["message"].startswith("spec.command: is required")


def test_errors_name_the_flag_typed(srv: EmbeddedServer) -> None:
    assert _err(srv, "submit", "-p", "nope", "--", "true").startswith("error: -p: ")
    assert _err(srv, "submit", "--project", "nope", "--", "true").startswith("error: --project: ")
    assert _err(srv, "submit", "-p", "team-a", "-g", "3", "--", "true").startswith("error: -g: ")
    assert _err(srv, "submit", "-p", "team-a", "--workers", "0", "--", "true").startswith(
        "error: --workers: ")
    assert "spec." not in _err(srv, "submit", "-p", "team-a", "--workers", "0", "--", "true")


def test_token_hint_is_not_doubled(srv: EmbeddedServer) -> None:
    r = _run(srv, "list", "-p", "team-a", env={"TESSERA_TOKEN": "bogus"})
    assert r.returncode == 1
    assert r.stderr.count("tessera login") == 1, r.stderr


def test_project_update_changes_only_what_is_given(srv: EmbeddedServer) -> None:
    srv.cli("project", "create", "upd", "--gpu", "1", "--over-quota-weight", "3", "--priority", "70")
    out = srv.cli("project", "update", "upd", "--limit", "2").stdout
    assert out.strip() == "project upd updated: limit none -> 2"
    p = next(x for x in srv.cli_json("project", "list")["projects"] if x["name"] == "upd")
    assert p["resources"]["gpu"] == {"deserved": 1, "limit": 2, "overQuotaWeight": 3}
    assert p["priority"] == 70
    out = srv.cli("project", "update", "upd", "--no-limit", "--gpu", "0.5").stdout
    assert "deserved 1 -> 0.5" in out and "limit 2 -> none" in out
    assert _err(srv, "project", "update", "upd").startswith("error: project update: give")
    assert _err(srv, "project", "update", "upd", "--gpu", "-1").startswith("error: --gpu: ")
    assert _err(srv, "project", "update", "upd", "--deserved", "-1").startswith(
        "error: --deserved: ")
    srv.cli("project", "delete", "upd")


def test_api_patch_project_is_partial_and_refuses_unknown_fields(srv: EmbeddedServer) -> None:
    srv.cli("project", "create", "pat", "--gpu", "1", "--limit", "3")
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token()}"}) as c:
        r = c.patch("/api/v1/org-unit/projects/pat", json={"priority": 80})
        assert r.status_code == 200
        assert r.json()["resources"]["gpu"] == {"deserved": 1, "limit": 3, "overQuotaWeight": 1}
        assert r.json()["priority"] == 80
        r = c.patch("/api/v1/org-unit/projects/pat", json={"resources": {"gpu": {"limit": None}}})
        assert r.json()["resources"]["gpu"]["limit"] is None
        assert r.json()["resources"]["gpu"]["deserved"] == 1
        r = c.patch("/api/v1/org-unit/projects/pat", json={"resources": {"gpu": {"limitt": 2}}})
        assert r.status_code == 422 and "limitt" in r.json()["message"]
        r = c.patch("/api/v1/org-unit/projects/pat", json={"quota": 2})
        assert r.status_code == 422
    srv.cli("project", "delete", "pat")


def test_bare_memory_numbers_are_refused_with_a_hint_and_gb_spellings_accepted(
        srv: EmbeddedServer) -> None:
    line = _err(srv, "submit", "-p", "team-a", "--gpu-memory", "5000", "--", "true")
    assert line.startswith("error: --gpu-memory: needs a unit: 5000Mi")
    line = _err(srv, "submit", "-p", "team-a", "--gpu-memory", "5g", "--", "true")
    assert line.startswith("error: --gpu-memory: unit 'g' is ambiguous: write 5G or 5GB")
    out = srv.cli("submit", "gb5", "-p", "team-a", "--gpu-memory", "5GB", "--", "sleep", "60").stdout
    assert "5G (4.66 GiB) of GPU memory" in out  # as typed, next to binary (core.request_text)
    out = srv.cli("submit", "gi2", "-p", "team-a", "--gpu-memory", "2Gi", "--", "sleep", "60").stdout
    assert "2 GiB of GPU memory" in out and "2.1 GB" not in out
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token()}"}) as c:
        for bare in (5000, "5000"):
            r = c.post("/api/v1/workloads/trainings", json={
                "name": "bare", "projectId": "team-a", "spec": {"command": "true", "compute": {
                    "gpuRequestType": "memory", "gpuMemoryRequest": bare}}})
            assert r.status_code == 422
            assert r.json()["message"].startswith("spec.compute.gpuMemoryRequest: needs a unit")
    srv.cli("delete", "gb5", "gi2", "-p", "team-a")


def test_a_16gb_v100_is_16_gib_in_every_view(srv: EmbeddedServer) -> None:
    srv.cli("submit", "half", "-p", "team-a", "-g", "0.5", "--", "sleep", "100")
    srv.cli("wait", "half", "-p", "team-a", "--timeout", "20")
    top = srv.cli("top").stdout
    # The device is 16 GiB in every view; a half is half of what the driver leaves (7.8 GiB).
    assert " 16 GiB [" in top and "half (7.8 GiB)" in top and "17.2" not in top
    assert "7.8 GiB/15.7 GiB" in top and "headroom" in top
    described = srv.cli("describe", "half", "-p", "team-a").stdout
    assert "request 7.8 GiB, limit 7.8 GiB" in described and "8.6 GB" not in described
    smi = srv.cli("exec", "half", "-p", "team-a", "--", "nvidia-smi").stdout
    assert f"{share(0.5) // 2**20}MiB" in smi
    srv.cli("delete", "half", "-p", "team-a")


def test_status_is_validated(srv: EmbeddedServer) -> None:
    line = _err(srv, "list", "-p", "team-a", "--status", "Bogus")
    assert line.startswith("error: --status: must be one of Pending, Running")
    assert _err(srv, "list", "-p", "team-a", "--state", "x").startswith("error: --state: ")
    assert srv.cli("list", "-p", "team-a", "--status", "running").returncode == 0


def test_numbers_in_errors_are_echoed_as_typed(srv: EmbeddedServer) -> None:
    line = _err(srv, "submit", "x", "-p", "team-a", "--gpu-memory", "1e300G", "--", "true")
    assert line.endswith("(got '1e300G')") and "EiB" not in line and "GB" not in line
    line = _err(srv, "submit", "x", "-p", "team-a", "-g", "0.5", "--workers",
                "100000000000000000000", "--", "true")
    assert line.startswith("error: --workers: ") and line.endswith("(got 100000000000000000000)")


def test_the_server_places_with_fgd_by_default(srv: EmbeddedServer) -> None:
    assert srv.cli_json("top")["scheduler"].endswith("placement policy fgd")


def test_a_pending_gang_on_one_node_is_told_about_gpus(srv: EmbeddedServer) -> None:
    srv.cli("submit", "gang", "-p", "team-a", "-g", "0.5", "--workers", "3", "--", "sleep", "60")
    deadline = time.monotonic() + 20
    why = ""
    while time.monotonic() < deadline and "room" not in why:
        why = srv.cli_json("describe", "gang", "-p", "team-a")["phaseMessage"] or ""
        time.sleep(0.2)
    assert "the GPUs have room for only 2 pod(s) of 0.5 GPU now (on " in why, why
    assert "node(s)" not in why
    srv.cli("delete", "gang", "-p", "team-a")


def test_workspace_port_url_in_list_and_describe_and_image_column(srv: EmbeddedServer) -> None:
    port = free_port()
    out = srv.cli("workspace", "submit", "jupyter", "-p", "team-a", "-g", "0.2", "-i",
                  "jupyter/base-notebook", "--port", str(port), "--",
                  sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1").stdout
    url = f"http://127.0.0.1:{port}"
    assert out.strip().endswith(url)
    srv.cli("wait", "jupyter", "-p", "team-a", "--timeout", "20")
    table = srv.cli("list", "-p", "team-a").stdout
    header, row = table.splitlines()[1], next(
        ln for ln in table.splitlines() if ln.startswith("jupyter"))
    assert "IMAGE" in header and header.rstrip().endswith("SERVICE URL(S)")
    assert "jupyter/base-notebook" in row and row.rstrip().endswith(url)
    described = srv.cli("describe", "jupyter", "-p", "team-a").stdout
    assert f"Service URL: {url}" in described and "Image:       jupyter/base-notebook" in described
    env = srv.cli("exec", "jupyter", "-p", "team-a", "--", "env").stdout
    assert f"PORT={port}" in env.splitlines()
    deadline = time.monotonic() + 20
    while True:  # the workspace really serves there
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the workspace did not answer at its URL"
        time.sleep(0.2)
    srv.cli("delete", "jupyter", "-p", "team-a")
    line = _err(srv, "submit", "-p", "team-a", "-g", "0.1", "--port", "8080:80", "--", "true")
    assert line.startswith("error: --port: must equal the container port")
    assert _err(srv, "submit", "-p", "team-a", "--port", "x", "--", "true").startswith(
        "error: --port: must be PORT or HOST_PORT:CONTAINER_PORT")
