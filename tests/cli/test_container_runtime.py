"""Images in embedded mode (issue #21): ``submit -i IMAGE`` with no command runs the image's own
entrypoint through the container runtime, with the GPU share.

No container can run on these machines (podman fails on setrlimit, docker has no daemon), so the
runtime itself is the one stand-in here: a small ``podman`` on PATH that records every call and
plays the container with a process (its "entrypoint" prints what a container would see). What
this proves: tessera detects the runtime, builds the ``run`` command with the devices, the
isolation library and config mounted read-only, the share's environment and the published port;
logs come from the runtime's output; ``exec``/``bash`` go through ``RUNTIME exec``; deleting the
workload stops the container with ``RUNTIME stop``. What it does not prove: that a real podman or
docker honours those flags, or that the NVIDIA hook exposes the devices (unverified here).
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tessera.testing.embedded import EmbeddedServer, free_port
from tests.cli.fake_runtime import FAKE_RUNTIME


class RuntimeServer(EmbeddedServer):
    """An embedded server whose PATH has the stand-in ``podman`` first."""

    def __init__(self, root: Path, bindir: Path, state: Path) -> None:
        super().__init__(root, simulate=["1xV100-16GB"])
        self.bindir, self.state = bindir, state

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env["PATH"] = f"{self.bindir}:{env.get('PATH', '')}"
        env["FAKE_RUNTIME_STATE"] = str(self.state)
        return env

    def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
        return [*super().server_argv(simulate), "--runtime", "podman"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    root = tmp_path_factory.mktemp("runtime")
    bindir, state = root / "bin", root / "state"
    bindir.mkdir()
    state.mkdir()
    podman = bindir / "podman"
    podman.write_text(FAKE_RUNTIME)
    podman.chmod(podman.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    s = RuntimeServer(root, bindir, state)
    with s.serving("team-a"):
        yield s


def _calls(srv: RuntimeServer, verb: str) -> list[list[str]]:
    path = srv.state / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [c for c in map(json.loads, lines) if c and c[0] == verb]


def _wait(predicate: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_up_reports_the_runtime(srv: RuntimeServer) -> None:
    assert _calls(srv, "info"), "the server never asked the runtime for info"


def test_image_without_command_runs_its_entrypoint_with_the_share(srv: RuntimeServer) -> None:
    port = free_port()
    out = srv.cli("workspace", "submit", "nb", "-p", "team-a", "-g", "0.5",
                  "-i", "jupyter/base-notebook", "--port", f"{port}:{port}").stdout
    assert out.strip().endswith(f"http://127.0.0.1:{port}")
    srv.cli("wait", "nb", "-p", "team-a", "--timeout", "20")
    _wait(lambda: _calls(srv, "run"), "the runtime was never asked to run the image")
    run = _calls(srv, "run")[-1]
    assert run[-1] == "jupyter/base-notebook", run  # the image's own entrypoint: no command after it
    assert "--rm" in run and run[run.index("--name") + 1].startswith("tessera-")
    envs = dict(run[i + 1].split("=", 1) for i, a in enumerate(run) if a == "--env")
    assert envs.get("NVIDIA_VISIBLE_DEVICES"), envs
    assert envs["TESSERA_GPU_CONFIG"] and envs["LD_PRELOAD"].endswith(".so"), envs
    volumes = [run[i + 1] for i, a in enumerate(run) if a == "--volume"]
    for path in (envs["LD_PRELOAD"], envs["TESSERA_GPU_CONFIG"]):
        assert f"{path}:{path}:ro" in volumes, (path, volumes)
    assert f"127.0.0.1:{port}:{port}" in [run[i + 1] for i, a in enumerate(run) if a == "--publish"]
    # The host's own environment stays out of the container.
    assert "HOME" not in envs and "PATH" not in envs
    # The runtime's output is the pod's log.
    _wait(lambda: "entrypoint of jupyter/base-notebook" in srv.cli("logs", "nb", "-p", "team-a").stdout,
          "the container's output never reached the log")


def test_exec_goes_through_the_runtime(srv: RuntimeServer) -> None:
    r = srv.cli("exec", "nb", "-p", "team-a", "--", "env")
    execs = _calls(srv, "exec")
    assert execs and execs[-1][-1] == "env" and execs[-1][-2].startswith("tessera-")
    assert "TESSERA_GPU_CONFIG=" in r.stdout


def test_delete_stops_the_container(srv: RuntimeServer) -> None:
    srv.cli("delete", "nb", "-p", "team-a")
    _wait(lambda: _calls(srv, "stop"), "deleting the workload never stopped its container")
    stop = _calls(srv, "stop")[-1]
    assert stop[-1].startswith("tessera-")
    assert stop[:2] == ["stop", "--time"]
    logs = list((srv.data / "logs").glob("*.log"))
    _wait(lambda: any("container got SIGTERM" in p.read_text() for p in logs),
          "the container was never told to stop")
