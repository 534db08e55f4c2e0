"""Debian's Prometheus (installed by ./dev setup) started for a test, scraping given targets
every second."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tessera.testing.cluster import free_ports


def start_prometheus(root: Path, job: str, targets: list[str],
                     port: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A Prometheus process scraping ``targets`` (``host:port``) as ``job``, and its port; the
    caller stops it. Fails the test (never skips) where Prometheus is not installed."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("Debian's prometheus is needed (./dev setup installs it)", pytrace=False)
    if port is None:
        (port,) = free_ports(1)
    listed = ", ".join(f"'{t}'" for t in targets)
    (root / "prometheus.yml").write_text(
        f"global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: {job}\n"
        f"    static_configs: [{{targets: [{listed}]}}]\n")
    proc = subprocess.Popen([binary, f"--config.file={root / 'prometheus.yml'}",
                             f"--storage.tsdb.path={root / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port
