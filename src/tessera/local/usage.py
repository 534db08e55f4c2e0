"""The node agent's usage reading inside ``tessera up``: GPU memory used, loans and utilisation
of this machine, for the console and the history (:mod:`tessera.api.usage`).

A daemon thread keeps one NVML session open (:class:`tessera.node.nvml.Nvml`, the agent's code,
used from this thread only) and every ``TESSERA_USAGE_INTERVAL`` seconds (default 2) reads
usage and joins it to the running pods with the agent's :func:`tessera.node.usage.snapshot`:
a GPU process belongs to a pod whose isolation region lists it, or else whose session it runs
in (each pod is started in a session of its own), so workloads are counted with or without the
isolation library. The result is the document a node agent serves at ``/usage``
(:mod:`tessera.node.report`); a request only reads the last one.

Simulated GPUs have nothing to read: the report says so (``simulated``) rather than zeros.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tessera.api.usage import NodeReport, report_of
from tessera.node import procfs
from tessera.node.containers import Share
from tessera.node.nvml import Nvml, NvmlUnavailable
from tessera.node.report import usage_document
from tessera.node.usage import snapshot

SharesFn = Callable[[], tuple[list[Share], dict[int, str]]]
"""The running pods as shares, and each pod's session id (its first process) -> share key."""


def session_of(pid: int) -> int | None:
    fields = procfs.stat_fields(pid)
    try:
        return int(fields[3]) if fields else None  # state, ppid, pgrp, session
    except (IndexError, ValueError):
        return None


class LocalUsage:
    def __init__(self, node: str, simulated: bool, shares: SharesFn,
                 region_of: Callable[[Share], Path], interval: float | None = None) -> None:
        self.node = node
        self.simulated = simulated
        self.shares = shares
        self.region_of = region_of
        self.interval = interval or float(os.environ.get("TESSERA_USAGE_INTERVAL", "2"))
        self._report = NodeReport(node, "simulated" if simulated else "waiting",
                                  "simulated GPUs: there is no driver to read memory used or "
                                  "utilisation from" if simulated else "usage not read yet",
                                  time.time())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reports(self) -> dict[str, NodeReport]:
        return {self.node: self._report}

    def start(self) -> LocalUsage:
        if not self.simulated and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tessera-usage", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        nvml: Nvml | None = None
        try:
            while not self._stop.is_set():
                try:
                    if nvml is None:
                        nvml = Nvml().open()
                    self._report = self.read(nvml)
                except NvmlUnavailable as exc:
                    self._report = NodeReport(self.node, "not-ready", str(exc), time.time())
                    if nvml is not None:
                        nvml.close()
                    nvml = None
                except Exception as exc:  # a failed read must not end the thread
                    self._report = NodeReport(self.node, "not-ready",
                                              f"reading GPU usage failed: {exc!r}", time.time())
                self._stop.wait(self.interval)
        finally:
            if nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.close()

    def read(self, nvml: Nvml) -> NodeReport:
        shares, sessions = self.shares()
        gpus = nvml.usage()

        def owner_of(pid: int) -> str | None:
            sid = session_of(pid)
            return sessions.get(sid) if sid is not None else None

        usage = snapshot(gpus, {}, shares, self.region_of, owner_of=owner_of)
        return report_of(self.node, usage_document(self.node, usage, True))
