"""A daemon thread that does one step of work every ``interval`` seconds until stopped.

The API server keeps two such loops (the metrics history, tessera.api.history, and GPU-hours
metering, tessera.api.tenancy.metering). A step that raises is logged and the next one runs on
time: a backend that does not answer for a while must not end either loop for the server's life.
"""

from __future__ import annotations

import logging
import threading
from typing import Self

log = logging.getLogger(__name__)


class Periodic:
    """Subclasses set ``interval`` and implement :meth:`step`; ``start`` is idempotent."""

    thread_name = "tessera-periodic"
    failure_level = logging.WARNING
    """How loudly a failed step is logged."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        raise NotImplementedError

    def next_wait(self) -> float:
        """Seconds until the next step: ``interval`` (a subclass may step sooner)."""
        return self.interval

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:
                log.log(self.failure_level, "%s: a step failed: %r", self.thread_name, exc)
            self._stop.wait(self.next_wait())
