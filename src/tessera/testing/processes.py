"""The harness's processes and what the modules below the test cluster see of it.

``ManagedProcess`` (a child that dies with its parent, its output in a log file),
``free_ports`` and ``_wait_for`` are used by the test cluster (:mod:`tessera.testing.cluster`)
and by what it starts (the stack, the node agents, the webhook). Those modules take the cluster
as a :class:`ClusterHandle`, so they do not import ``cluster`` and the cluster may start them
(no import loop).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tessera.testing import pki


class ClusterHandle(Protocol):
    """What the harness's lower modules use of a ``TestCluster``."""

    server: str
    kubeconfig: Path
    pki: pki.ClusterPKI | None
    processes: list[ManagedProcess]
    node_agents: list[Any]

    @property
    def workdir(self) -> Path | None: ...

    @property
    def kubectl_path(self) -> Path: ...

    def kubectl(self, *args: str, check: bool = True, kubeconfig: Path | None = None
                ) -> subprocess.CompletedProcess[str]: ...

    def client(self, kubeconfig: Path | None = None, **kwargs: Any) -> Any: ...

    def service_account_kubeconfig(self, namespace: str, name: str, *, path: Path | None = None,
                                   create: bool = True, expiration_seconds: int = 3600
                                   ) -> Path: ...

    def issue_serving_cert(self, name: str, hosts: list[str] | None = None
                           ) -> tuple[Path, Path, bytes]: ...


class ClusterError(RuntimeError):
    """The test cluster could not be started or used; the message names the component."""


_HANDED_OUT: set[int] = set()
"""Every port ``free_ports`` has returned in this process. A port is only a number until its
user binds it (a fixture may choose a Helm value minutes before the component listens), and the
kernel may offer the same free port to the next caller meanwhile: the tests' node agents once got
the API's port that way and the API then failed with 'address already in use'."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while choosing),
    none returned before by this process."""
    socks = []
    chosen: list[int] = []
    try:
        for _ in range(count * 50 + 100):
            if len(chosen) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)  # held: the kernel offers another port next time
            port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                chosen.append(port)
        if len(chosen) < count:
            raise RuntimeError(f"no {count} free TCP ports not handed out before")
        _HANDED_OUT.update(chosen)
        return chosen
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the process that started us dies (no orphans after kill -9).

    SIGKILL, not SIGTERM: everything is throw-away, and kube-apiserver's graceful shutdown can
    wait a long time once etcd is gone."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ManagedProcess:
    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        if not self.alive():
            code = self.popen.returncode if self.popen else None
            raise ClusterError(
                f"{self.name} exited (code {code}); last lines of {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def _wait_for(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float,
    processes: Sequence[ManagedProcess] = (),
    interval: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        for proc in processes:
            proc.check_alive()
        try:
            if check():
                return
        except Exception as exc:  # retried until the deadline; reported if it never succeeds
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            logs = "".join(f"\n--- {p.name}:\n{p.log_tail(15)}" for p in processes)
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{detail}{logs}")
        time.sleep(interval)


def stop_processes(procs: Iterable[subprocess.Popen[Any]], grace: float = 30.0) -> None:
    """SIGTERM every process first (so they shut down in parallel), then wait up to ``grace``
    seconds for each and SIGKILL the ones still running."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
