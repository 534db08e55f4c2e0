"""The REST API with its Kubernetes backend, for tests: the real ``python -m
tessera.kube.api_server`` process against a test cluster, driven by the real CLI and HTTP, with
the same helpers as the embedded server (``cli``, ``cli_json``, ``http``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from tessera.testing.embedded import EmbeddedServer


class KubeApiServer(EmbeddedServer):
    def __init__(self, root: Path, kubeconfig: Path, interval: float = 0.2,
                 port: int | None = None) -> None:
        super().__init__(root, simulate=(), interval=interval, port=port)
        self.kubeconfig = kubeconfig

    def start(self, simulate: Sequence[str] | None = None) -> KubeApiServer:
        argv = [sys.executable, "-m", "tessera.kube.api_server", "--port", str(self.port),
                "--data-dir", str(self.data), "--kubeconfig", str(self.kubeconfig),
                "--reconcile-interval", str(self.interval)]
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

    def stop(self, stop_workloads: bool = False) -> None:
        super().stop(stop_workloads=False)

    def cleanup(self) -> None:
        self.stop()
