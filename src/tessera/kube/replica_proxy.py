"""The proxy in front of each replica of an inference that scales on Kubernetes (a container of
the replica's pod, as Knative's queue-proxy): ``python -m tessera.kube.replica_proxy --port 8013
--target 8080 --metrics-port 9464``.

It listens on ``$POD_IP`` (all addresses when unset) at ``--port``, where the inference's Service
sends traffic, and hands each connection to the model server at ``127.0.0.1:--target`` (the
``--port`` the user gave). It counts what the autoscaler (tessera.kube.autoscaling) reads at
``http://POD_IP:--metrics-port/metrics``::

    tessera_replica_open_connections 3
    tessera_replica_connections_total 17

Connections, not HTTP requests, as embedded mode's proxy counts them.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tessera.api.tcp_pipe import relay

PORT = 8013
"""Where the proxy listens in the pod (the Service's targetPort)."""
METRICS_PORT = 9464
"""Where it serves its counters."""


class Counters:
    def __init__(self) -> None:
        self.open = 0
        self.total = 0
        self.lock = threading.Lock()

    def text(self) -> str:
        with self.lock:
            return (f"tessera_replica_open_connections {self.open}\n"
                    f"tessera_replica_connections_total {self.total}\n")


def parse(text: str) -> tuple[int, int]:
    """(open connections, connections opened in all) from a proxy's ``/metrics``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("tessera_replica_") and value.strip().isdigit():
            values[name] = int(value)
    return (values["tessera_replica_open_connections"],
            values["tessera_replica_connections_total"])


def serve(host: str, port: int, target: int, counters: Counters) -> None:
    listener = socket.create_server((host, port), reuse_port=False)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_one, args=(conn, target, counters), daemon=True).start()


def _one(conn: socket.socket, target: int, counters: Counters) -> None:
    with counters.lock:
        counters.open += 1
        counters.total += 1
    try:
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=30)
        except OSError:
            return
        relay(conn, upstream)
        upstream.close()
    finally:
        conn.close()
        with counters.lock:
            counters.open -= 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera-replica-proxy")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, default=METRICS_PORT)
    args = parser.parse_args(argv)
    host = os.environ.get("POD_IP") or "0.0.0.0"
    counters = Counters()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = counters.text().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    metrics = ThreadingHTTPServer((host, args.metrics_port), Metrics)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    serve(host, args.port, args.target, counters)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
