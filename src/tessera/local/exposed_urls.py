"""External URLs in embedded mode: ``tessera workspace submit NAME --port 8888 --external-url``
(REST ``spec.ports[i].externalUrl: true``; Run:ai's ``--external-url``).

A workload's ``--port`` is reached on this machine at ``http://127.0.0.1:PORT`` (its process
listens there itself). With ``--external-url`` tessera also listens on the machine's external
address, ``$TESSERA_EXTERNAL_HOST`` of the server (an address or host name others reach this
machine by; required, refused naming the flag when unset), at the port's host port (``--port
HOST:CONTAINER``, default the container port), and hands each connection to
``127.0.0.1:CONTAINER``. Its URL, ``http://HOST:PORT``, is printed at submit and shown by
``tessera list`` and ``tessera describe``. The listener opens at submit (a port already taken on
that address is refused before anything is made) and closes once the workload is deleted or has
finished (docs/workloads.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.api.backend import WorkloadSubmission
from tessera.api.tcp_pipe import relay
from tessera.core.errors import InvalidRequest

HOST_ENV = "TESSERA_EXTERNAL_HOST"
EXTERNAL_URLS = "externalUrls"
"""Spec key set by this module only (REST refuses it: not a field of WorkloadSpec): the
external URLs the plain submit (tessera.local.control, which takes the key out of the stored
spec) adds to the workload's service URLs."""
DONE = ("Deleted", "Failed", "Completed")


@dataclass
class Exposed:
    url: str
    target: int
    listener: socket.socket
    workload_id: str | None = None

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            conn.close()  # the workload is not listening (yet): the client sees a reset
            return
        relay(conn, upstream)
        conn.close()
        upstream.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()


class ExposedUrls:
    def __init__(self, host: str | None = None) -> None:
        self.host = host if host is not None else (os.environ.get(HOST_ENV) or None)
        self.open: list[Exposed] = []
        self._lock = threading.Lock()

    @staticmethod
    def wanted(s: WorkloadSubmission) -> bool:
        return any(p.get("externalUrl") for p in s.spec.get("ports") or [])

    def submit(self, s: WorkloadSubmission,
               plain: Callable[[WorkloadSubmission], dict[str, Any]]) -> dict[str, Any]:
        """Listen on the external address for each port asking for a URL, then submit the
        workload (``plain``) with those URLs; nothing stays open if either fails."""
        ports = list(s.spec.get("ports") or [])
        made: list[Exposed] = []
        inner: list[dict[str, Any]] = []
        try:
            for i, p in enumerate(ports):
                inner.append({"container": int(p["container"])} if p.get("externalUrl") else p)
                if not p.get("externalUrl"):
                    continue
                field = f"spec.ports[{i}].externalUrl"
                if self.host is None:
                    raise InvalidRequest(field, f"this server has no external address: start it "
                                         f"with {HOST_ENV} set to the address or host name "
                                         "others reach this machine by")
                port = int(p.get("external") or p["container"])
                try:
                    listener = socket.create_server((self.host, port))
                except OSError as exc:
                    raise InvalidRequest(field, f"cannot listen on {self.host}:{port} "
                                         f"({exc.strerror or exc})", port) from None
                made.append(Exposed(f"http://{self._url_host()}:{port}", int(p["container"]),
                                    listener))
            answer = plain(dataclasses.replace(
                s, spec={**s.spec, "ports": inner,
                         EXTERNAL_URLS: [e.url for e in made]}))
        except BaseException:
            for e in made:
                e.close()
            raise
        for e in made:
            e.workload_id = str(answer["workloadId"])
            threading.Thread(target=e.serve, daemon=True, name=f"url-{e.url}").start()
        with self._lock:
            self.open.extend(made)
        return answer

    def _url_host(self) -> str:
        assert self.host is not None
        return f"[{self.host}]" if ":" in self.host else self.host

    def tick(self, phase_of: Callable[[str], tuple[str, str] | None]) -> None:
        """Close the listeners of workloads deleted or finished."""
        with self._lock:
            gone = [e for e in self.open if e.workload_id is not None
                    and (phase_of(e.workload_id) or ("Deleted",))[0] in DONE]
            self.open = [e for e in self.open if e not in gone]
        for e in gone:
            e.close()

    def stop(self) -> None:
        with self._lock:
            for e in self.open:
                e.close()
            self.open = []
