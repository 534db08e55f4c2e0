"""The proxy in front of each replica of an inference that scales on Kubernetes (a container of
the replica's pod, as Knative's queue-proxy): ``python -m tessera.kube.replica_proxy --port 8013
--target 8080 --metrics-port 9464``.

It listens on ``$POD_IP`` (all addresses when unset) at ``--port``, where the inference's Service
sends traffic, and hands each connection to the model server at ``127.0.0.1:--target`` (the
``--port`` the user gave). It counts what the autoscaler (tessera.kube.autoscaling) reads at
``http://POD_IP:--metrics-port/metrics``::

    tessera_replica_open_connections 3
    tessera_replica_connections_total 17
    tessera_replica_idle_seconds 0

(``idle_seconds``: since the last connection closed, 0 while one is open), and, for the
autoscaler, when the connections opened and closed at ``/activity`` (JSON): the changes of the
last ``KEEP`` seconds in buckets of ``BUCKET`` seconds, each
``[id, age of its first change, age of its last, most open in it, open after it, opened in it]``
(ages in seconds before the answer, so the reader needs no clock in common with the pod), with
``open``, ``total``, ``next`` (the id the next bucket will get, so a reader sees what it
missed) and ``boot`` (new at each start of the proxy). The autoscaler thus counts the
scale-down delay from the moment the load really ended, not from when it looked.
Connections, not HTTP requests, as embedded mode's proxy counts them.

On SIGTERM (the pod deleted: scaled down) the proxy keeps serving until no connection has been
open for ``--drain-quiet`` seconds (0.5), then exits: an idle replica's pod goes at once, a busy
one finishes its requests first (within the pod's termination grace period).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tessera.api.tcp_pipe import relay

PORT = 8013
"""Where the proxy listens in the pod (the Service's targetPort)."""
METRICS_PORT = 9464
"""Where it serves its counters."""
BUCKET = 0.05
"""Changes closer than this share a bucket (the most open in it counts for all of it)."""
KEEP = 10.0
"""Seconds of buckets kept for ``/activity`` (the autoscaler reads it every second)."""


class Counters:
    def __init__(self) -> None:
        self.open = 0
        self.total = 0
        self.lock = threading.Lock()
        self.buckets: deque[list[float]] = deque()
        """[id, first change, last change, most open, open after, opened] (monotonic times)."""
        self.next_id = 1
        self.last_change = time.monotonic()
        self.boot = uuid.uuid4().hex
        """Changes when the proxy restarts (its bucket ids begin again)."""

    def change(self, by: int) -> None:
        """A connection opened (+1) or closed (-1)."""
        with self.lock:
            now = time.monotonic()
            self.open += by
            if by > 0:
                self.total += 1
            b = self.buckets[-1] if self.buckets else None
            if b is None or now - b[1] >= BUCKET:
                b = [self.next_id, now, now, self.open, self.open, 0]
                self.next_id += 1
                self.buckets.append(b)
            b[2], b[3], b[4] = now, max(b[3], self.open), self.open
            b[5] += by > 0
            while self.buckets and self.buckets[0][2] < now - KEEP:
                self.buckets.popleft()
            self.last_change = now

    def idle_seconds(self) -> float:
        return 0.0 if self.open else time.monotonic() - self.last_change

    def text(self) -> str:
        with self.lock:
            return (f"tessera_replica_open_connections {self.open}\n"
                    f"tessera_replica_connections_total {self.total}\n"
                    f"tessera_replica_idle_seconds {self.idle_seconds():.3f}\n")

    def activity(self) -> str:
        with self.lock:
            now = time.monotonic()
            return json.dumps({"open": self.open, "total": self.total, "next": self.next_id,
                               "boot": self.boot,
                               "buckets": [[int(i), round(now - a, 4), round(now - z, 4),
                                            int(top), int(end), int(n)]
                                           for i, a, z, top, end, n in self.buckets]})


def parse(text: str) -> tuple[int, int]:
    """(open connections, connections opened in all) from a proxy's ``/metrics``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("tessera_replica_") and value.strip().isdigit():
            values[name] = int(value)
    return (values["tessera_replica_open_connections"],
            values["tessera_replica_connections_total"])


def serve(listener: socket.socket, target: int, counters: Counters) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_one, args=(conn, target, counters), daemon=True).start()


def drain(counters: Counters, quiet: float) -> None:
    """Return once no connection has been open for ``quiet`` seconds."""
    while True:
        with counters.lock:
            idle = counters.idle_seconds()
        if counters.open == 0 and idle >= quiet:
            return
        time.sleep(max(0.01, min(0.05, quiet - idle)))


def _one(conn: socket.socket, target: int, counters: Counters) -> None:
    counters.change(+1)
    try:
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=30)
        except OSError:
            return
        relay(conn, upstream)
        upstream.close()
    finally:
        conn.close()
        counters.change(-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera-replica-proxy")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, default=METRICS_PORT)
    parser.add_argument("--drain-quiet", type=float, default=0.5,
                        help="on SIGTERM, exit once no connection has been open this long")
    args = parser.parse_args(argv)
    host = os.environ.get("POD_IP") or "0.0.0.0"
    counters = Counters()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            json_doc = self.path == "/activity"
            body = (counters.activity() if json_doc else counters.text()).encode()
            self.send_response(200 if self.path in ("/metrics", "/activity") else 404)
            self.send_header("Content-Type", "application/json" if json_doc
                             else "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    metrics = ThreadingHTTPServer((host, args.metrics_port), Metrics)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # PID 1 in its container: say so
    listener = socket.create_server((host, args.port), reuse_port=False)
    threading.Thread(target=serve, args=(listener, args.target, counters), daemon=True).start()
    stop.wait()
    drain(counters, args.drain_quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
