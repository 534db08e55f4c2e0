"""A real embedded-mode server for tests: its own port, data directory and CLI settings.

The server is the real ``python -m tessera.local.server`` process; the CLI is the real
``tessera`` entry point run as a subprocess; HTTP goes over the loopback. Only the GPUs are
simulated, since none exist here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

import httpx

from tessera.testing.processes import free_ports


def free_port() -> int:
    return free_ports(1)[0]


class EmbeddedServer:
    def __init__(
        self,
        root: Path,
        simulate: Sequence[str] = ("1xV100-16GB",),
        grace: float = 1.0,
        interval: float = 0.05,
        port: int | None = None,
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.config = root / "config.json"
        self.simulate = list(simulate)
        self.grace = grace
        self.interval = interval
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._token: str | None = None

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "TESSERA_DATA_DIR": str(self.data),
            "TESSERA_CONFIG": str(self.config),
            "TESSERA_URL": self.url,
        })
        env.pop("TESSERA_TOKEN", None)
        env.pop("TESSERA_PROJECT", None)
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a crash in C code leaves its threads' stacks in the log
        return env

    def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
        argv = [sys.executable, "-m", "tessera.local.server", "--port", str(self.port),
                "--data-dir", str(self.data), "--grace", str(self.grace),
                "--interval", str(self.interval)]
        for s in self.simulate if simulate is None else simulate:
            argv += ["--simulate", s]
        return argv

    def start(self, simulate: Sequence[str] | None = None) -> Self:
        argv = self.server_argv(simulate)
        self.data.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.root / 'server.log').read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=0.5).status_code == 200:
                    self._token = None
                    return self
            time.sleep(0.05)
        raise RuntimeError("server did not start in 30 s")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self, stop_workloads: bool = True) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if stop_workloads:
            (self.data / "stop-workloads").touch()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @contextlib.contextmanager
    def serving(self, *projects: str, gpu: str = "1") -> Iterator[Self]:
        """Started, logged in, with ``projects`` created (each deserving ``gpu``); cleaned up
        after: the body of most test fixtures."""
        self.start()
        try:
            self.cli("login")
            for name in projects:
                self.cli("project", "create", name, "--gpu", gpu)
            yield self
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        """Stop the server and any workload process it left (e.g. after a SIGKILL)."""
        self.stop()
        db = self.data / "tessera.db"
        if not db.exists():
            return
        con = sqlite3.connect(str(db))
        try:
            for (pods,) in con.execute("SELECT pods FROM workloads").fetchall():
                for pod in json.loads(pods):
                    if pod.get("pid"):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pod["pid"], signal.SIGKILL)
        finally:
            con.close()

    # -- clients ---------------------------------------------------------------------------------

    def credentials(self) -> dict[str, str]:
        creds: dict[str, str] = json.loads((self.data / "credentials.json").read_text())
        return creds

    def token(self) -> str:
        if self._token is None:
            creds = self.credentials()
            r = httpx.post(f"{self.url}/api/v1/token", json={
                "grantType": "client_credentials", **creds})
            r.raise_for_status()
            self._token = str(r.json()["accessToken"])
        return self._token

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token()}"},
                            timeout=30)

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real ``tessera`` command line against this server."""
        proc = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", *args],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"tessera {' '.join(args)} exited {proc.returncode}: {proc.stderr}{proc.stdout}"
            )
        return proc

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "-o", "json").stdout)

    def wait_phase(self, client: httpx.Client, kind: str, wid: str, phase: str,
                   timeout: float = 15) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            w: dict[str, Any] = client.get(f"/api/v1/workloads/{kind}/{wid}").json()
            if w.get("phase") == phase:
                return w
            if time.monotonic() > deadline:
                raise AssertionError(f"{w.get('name')} is {w.get('phase')}, not {phase}: {w}")
            time.sleep(0.05)


def submit_body(name: str, project: str, command: str = "sleep", args: str = "600",
                **compute: Any) -> dict[str, Any]:
    return {"name": name, "projectId": project,
            "spec": {"command": command, "args": args, "compute": compute}}
