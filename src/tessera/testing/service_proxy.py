"""A kube-proxy double for one Service: traffic to the Service's ClusterIP:port reaches a
process on 127.0.0.1:targetPort, so the API server can call a webhook through its in-cluster
Service (kube-apiserver resolves a webhook's ``service`` reference to the ClusterIP).

The ClusterIP is added to the loopback interface for as long as the proxy runs (needs root,
``ip``); bytes are copied both ways unchanged (TLS passes through, as with kube-proxy)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from dataclasses import dataclass, field


@dataclass
class ServiceProxy:
    cluster_ip: str
    port: int
    target_port: int
    _listener: socket.socket | None = field(init=False, default=None)
    _threads: list[threading.Thread] = field(init=False, default_factory=list)
    _added_ip: bool = field(init=False, default=False)

    def start(self) -> None:
        out = subprocess.run(["ip", "addr", "add", f"{self.cluster_ip}/32", "dev", "lo"],
                             capture_output=True, text=True)
        if out.returncode != 0 and "File exists" not in out.stderr:
            raise RuntimeError(f"ip addr add {self.cluster_ip}: {out.stderr.strip()}")
        self._added_ip = out.returncode == 0
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.cluster_ip, self.port))
        s.listen(64)
        self._listener = s
        t = threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.cluster_ip}")
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()  # nothing listens: the caller sees a refused/closed connection
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._added_ip:
            subprocess.run(["ip", "addr", "del", f"{self.cluster_ip}/32", "dev", "lo"],
                           capture_output=True)
            self._added_ip = False
