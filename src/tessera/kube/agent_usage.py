"""The Kubernetes API server's view of GPU usage: each node's tessera-node, polled.

Every agent publishes where it serves ``/usage`` on its Node, once
(``tessera.io/node-agent-url``, :mod:`tessera.node.publish`; no Node write per interval, which
would wake every Node informer in the cluster). A daemon thread here reads those addresses from
the watch-fed Node cache and asks every agent for ``/usage`` every ``TESSERA_USAGE_INTERVAL``
seconds (default 5; the asks spread over the interval), with bounded concurrency (``TESSERA_USAGE_WORKERS``, default 16), a
timeout per agent (``TESSERA_USAGE_TIMEOUT``, default 2 s) and a cap on the answer's size. A
request reads the last reports and never waits for an agent: a slow or dead agent only makes
its own node's report ``unreachable`` (the console says so instead of showing zeros) once its
last answer is older than three intervals (one missed answer shows the last one, with its age).

The thread starts on first use (the console, ``/metrics`` or the history), so an API server
nobody looks at polls nothing.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from urllib.parse import urlsplit

from tessera.api.usage import NodeReport, report_of

log = logging.getLogger(__name__)

MAX_ANSWER = 4 * 2**20
"""Bytes read of one agent's answer at most (8 GPUs and a hundred shares are ~30 KB)."""
_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")


class AgentPoller:
    def __init__(self, urls: Callable[[], dict[str, str]], interval: float | None = None,
                 timeout: float | None = None, workers: int | None = None) -> None:
        """``urls``: node -> the address its agent published ('' when none)."""
        self.urls = urls
        self.interval = interval or float(os.environ.get("TESSERA_USAGE_INTERVAL", "5"))
        self.timeout = timeout or float(os.environ.get("TESSERA_USAGE_TIMEOUT", "2"))
        self.workers = workers or int(os.environ.get("TESSERA_USAGE_WORKERS", "16"))
        self.stale_after = 3 * self.interval
        """A node's last good report stands this long after a failed poll, then it is
        ``unreachable``."""
        self._reports: dict[str, NodeReport] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.last_round_seconds = 0.0

    def reports(self) -> dict[str, NodeReport]:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="tessera-agent-usage",
                                                    daemon=True)
                    self._thread.start()
        with self._lock:
            return dict(self._reports)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        with ThreadPoolExecutor(self.workers, thread_name_prefix="tessera-agent-usage") as pool:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    self.poll(pool)
                except Exception as exc:  # the Node cache not loaded yet, ...: try again
                    log.warning("polling the node agents failed: %r", exc)
                self.last_round_seconds = time.monotonic() - t0
                self.rounds += 1
                self._stop.wait(max(0.5, self.interval - self.last_round_seconds))

    def poll(self, pool: ThreadPoolExecutor) -> None:
        """One round: every node's report, each stored as soon as its agent answers."""
        urls = self.urls()
        now = time.time()
        fresh: dict[str, NodeReport] = {}
        for node, url in urls.items():
            if not url:
                fresh[node] = NodeReport(node, "no-agent", "no tessera-node has published its "
                                         "address on this Node (tessera.io/node-agent-url)", now)
            elif not _URL.match(url):
                fresh[node] = NodeReport(node, "unreachable", f"the Node's tessera.io/node-agent-"
                                         f"url is not http(s)://HOST:PORT[/PATH]: {url[:100]!r}", now)
        with self._lock:
            self._reports = {**{n: r for n, r in self._reports.items() if n in urls}, **fresh}
        todo = [(node, url) for node, url in urls.items() if node not in fresh]
        # Spread over the interval, not all at once: the asks run in the API server's process,
        # and a burst of 16 busy threads would take the interpreter from its requests for a
        # second every round; one ask every few milliseconds costs them almost nothing.
        gap = 0.8 * self.interval / len(todo) if todo else 0.0
        asks = []
        for node, url in todo:
            ask = pool.submit(self.ask, node, url)
            ask.add_done_callback(self._store)
            asks.append(ask)
            if self._stop.wait(gap):
                break
        wait(asks)

    def _store(self, ask: Future[NodeReport]) -> None:
        report = ask.result()
        with self._lock:
            self._reports[report.node] = self._keep_recent(self._reports.get(report.node), report)

    def _keep_recent(self, last: NodeReport | None, new: NodeReport) -> NodeReport:
        """One missed answer (a busy node, a busy API server) does not blank a node: its last
        report stands, with its age, until it is older than ``stale_after``."""
        if new.state == "ok" or last is None or last.state != "ok" or last.document is None:
            return new
        if new.time - last.time > self.stale_after:
            return new
        return dataclasses.replace(last, message=f"the last poll failed ({new.message}); showing "
                                   f"the report of {new.time - last.time:.0f} s ago")

    def ask(self, node: str, url: str) -> NodeReport:
        """GET ``url/usage`` within ``timeout`` in all (connect, each read and the whole answer).
        http.client rather than an HTTP library: a round of 500 agents every few seconds runs in
        the API server's process, beside its requests, and should cost it little."""
        parts = urlsplit(url)
        deadline = time.monotonic() + self.timeout
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname or "", parts.port, timeout=min(1.0, self.timeout))
        try:
            conn.request("GET", f"{parts.path.rstrip('/')}/usage", headers={"Accept": "application/json"})
            if conn.sock is not None:
                conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
            r = conn.getresponse()
            if r.status != 200:
                return NodeReport(node, "unreachable", f"the agent at {url} answered HTTP {r.status}",
                                  time.time())
            body = bytearray()
            while chunk := r.read1(65536):
                body += chunk
                if len(body) > MAX_ANSWER:
                    return NodeReport(node, "unreachable", f"the agent at {url} answered more "
                                      f"than {MAX_ANSWER} bytes", time.time())
                if time.monotonic() > deadline:
                    raise TimeoutError
                if conn.sock is not None:
                    conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
            return report_of(node, json.loads(body))
        except TimeoutError:
            return NodeReport(node, "unreachable", f"the agent at {url} did not answer within "
                              f"{self.timeout:g} s", time.time())
        except (OSError, http.client.HTTPException) as exc:
            return NodeReport(node, "unreachable", f"the agent at {url} cannot be reached: "
                              f"{exc}", time.time())
        except ValueError:
            return NodeReport(node, "unreachable", f"the agent at {url} did not answer JSON",
                              time.time())
        finally:
            conn.close()
