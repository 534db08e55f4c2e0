"""Waiting in tests for something another process does (a server, a scheduler, an agent)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0,
               interval: float = 0.1) -> Any:
    """``check()``'s first truthy result; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
