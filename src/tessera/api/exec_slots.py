"""Exec sessions on their own bounded pool, never on the API's request workers.

``POST .../exec`` waits for its command (up to ``timeoutSeconds``, at most an hour). Run on the
threads that serve every other request, 40 such sessions would leave none for anyone else (even
``/healthz`` would hang). Here they run on a pool of their own; one more than it holds is
refused at once (429, naming the bound), so sessions can neither starve the API nor queue up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.exceptions import HTTPException

EXEC_SESSIONS = 8
"""Exec sessions running at once on one API server."""
T = TypeVar("T")


class ExecSlots:
    def __init__(self, size: int = EXEC_SESSIONS) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="tessera-exec")

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the exec pool; 429 when every slot is taken."""
        if not self._free.acquire(blocking=False):
            raise HTTPException(429, f"exec: {self.size} exec sessions are already running, "
                                "the most this server runs at once; retry when one ends")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            self._free.release()
