"""The first hour in embedded mode (issue 34 item 8), through the real CLI against a real server
on simulated GPUs: a busy port is named with the way out; a missing --working-dir is refused;
Run:ai's RUNAI_GPU_MEMORY_LIMIT is honoured and cGPU's ALIYUN_COM_GPU_MEM_* are set, as on
Kubernetes; the `runai` command is the same CLI."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.testing.embedded import EmbeddedServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("first-hour"), simulate=["2xV100-16GB"])
    with s.serving("team-a", gpu="2"):
        yield s


def _err(server: EmbeddedServer, *args: str) -> str:
    r = server.cli(*args, check=False)
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_a_busy_port_says_which_and_how_to_choose(server: EmbeddedServer, tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _err(server, "up", "--detach", "--port", str(port), "--data-dir", str(tmp_path))
    assert line == f"error: port {port} is in use; use --port or TESSERA_PORT"
    # the port of a running tessera with another data directory: the same answer
    line = _err(server, "up", "--detach", "--port", str(server.port), "--data-dir", str(tmp_path))
    assert line == f"error: port {server.port} is in use; use --port or TESSERA_PORT"


def test_a_missing_working_dir_is_refused(server: EmbeddedServer, tmp_path: Path) -> None:
    line = _err(server, "submit", "wd", "-p", "team-a", "-g", "0.1", "--working-dir",
                str(tmp_path / "nope"), "--", "pwd")
    assert line.startswith("error: --working-dir: must be an existing directory on this machine")
    assert str(tmp_path / "nope") in line
    server.cli("submit", "wd", "-p", "team-a", "-g", "0.1", "--working-dir", str(tmp_path),
               "--", "sleep", "600")
    doc = server.cli_json("describe", "wd", "-p", "team-a")
    assert doc["spec"]["workingDir"] == str(tmp_path)
    server.cli("delete", "wd", "-p", "team-a")


def _env(server: EmbeddedServer, name: str) -> dict[str, str]:
    server.cli("wait", name, "-p", "team-a", "--timeout", "30")
    out = server.cli("exec", name, "-p", "team-a", "--", sys.executable, "-c",
                     "import json, os; print(json.dumps(dict(os.environ)))").stdout
    env: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return env


def test_runai_and_cgpu_variables_as_on_kubernetes(server: EmbeddedServer) -> None:
    server.cli("submit", "rl", "-p", "team-a", "-g", "0.25", "-e", "RUNAI_GPU_MEMORY_LIMIT=0.8",
               "--", "sleep", "600")
    doc = server.cli_json("describe", "rl", "-p", "team-a")
    assert doc["gpus"]["request"] == "0.25 GPU, bursting to 0.8"
    [dev] = doc["pods"][0]["gpuDevices"] if doc["pods"] else server.cli_json(
        "describe", "rl", "-p", "team-a")["pods"][0]["gpuDevices"]
    assert dev["limitBytes"] > dev["requestBytes"]
    line = _err(server, "submit", "rl2", "-p", "team-a", "-g", "1", "-e",
                "RUNAI_GPU_MEMORY_LIMIT=0.8", "--", "true")
    assert "RUNAI_GPU_MEMORY_LIMIT" in line and "burst limit of a GPU share" in line

    server.cli("submit", "cg", "-p", "team-a", "--gpu-devices", "2", "--gpu-memory", "2Gi",
               "--", "sleep", "600")
    env = _env(server, "cg")
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == "16"  # a 16 GiB V100, whole GiB
    assert "ALIYUN_COM_GPU_MEM_CONTAINER" in _env(server, "rl")
    for name in ("rl", "cg"):
        server.cli("delete", name, "-p", "team-a")


def test_the_runai_command_is_the_same_cli(server: EmbeddedServer) -> None:
    runai = Path(sys.executable).parent / "runai"
    r = subprocess.run([str(runai), "list", "-p", "team-a"], env=server.env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Showing workloads for project team-a")
    r = subprocess.run([str(runai), "--help"], env=server.env, capture_output=True, text=True,
                       timeout=60)
    assert "Usage: runai" in r.stdout


@pytest.mark.parametrize(("args", "want"), [
    (["submit", "w0", "--workers", "0", "--", "true"], "error: --workers: must be at least 1"),
    (["submit", "-g", "99999999999", "--", "true"], "error: -g: must be at most 1024"),
    (["submit", "x" * 64, "-g", "0.1", "--", "true"], "error: NAME: must be at most 63 characters"),
    (["submit", "", "-g", "0.1", "--", "true"], "error: NAME: must not be empty"),
    (["project", "create", "neg", "--gpu", "-1"], "error: --gpu: must be at least 0"),
    (["project", "create", "abc", "--gpu", "abc"], "error: --gpu: must be a number"),
    (["submit", "w1", "--workers", "abc", "--", "true"], "error: --workers: must be a whole number"),
])
def test_errors_in_tessera_words(server: EmbeddedServer, args: list[str], want: str) -> None:
    if args[0] == "submit":
        args = ["submit", "-p", "team-a", *args[1:]]
    line = _err(server, *args)
    assert line.startswith(want), line
    assert "should" not in line and "gpu_portion" not in line, line


def test_the_api_says_what_is_wrong_with_a_body(server: EmbeddedServer) -> None:
    import httpx
    r = httpx.post(f"{server.url}/api/v1/workloads/trainings", content=b"not json",
                   headers={"Authorization": f"Bearer {server.token()}",
                            "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 422
    assert r.json()["message"].startswith("body: must be valid JSON"), r.json()
