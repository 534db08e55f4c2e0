"""The REST API with its Kubernetes backend, for tests: the real ``python -m
tessera.kube.api_server`` process against a test cluster, driven by the real CLI and HTTP, with
the same helpers as the embedded server (``cli``, ``cli_json``, ``http``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tessera.testing.embedded import EmbeddedServer


class KubeApiServer(EmbeddedServer):
    def __init__(self, root: Path, kubeconfig: Path, interval: float = 0.2,
                 port: int | None = None) -> None:
        super().__init__(root, simulate=(), interval=interval, port=port)
        self.kubeconfig = kubeconfig

    def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
        return [sys.executable, "-m", "tessera.kube.api_server", "--port", str(self.port),
                "--data-dir", str(self.data), "--kubeconfig", str(self.kubeconfig),
                "--reconcile-interval", str(self.interval)]

    def stop(self, stop_workloads: bool = False) -> None:
        super().stop(stop_workloads=False)

    def cleanup(self) -> None:
        self.stop()
