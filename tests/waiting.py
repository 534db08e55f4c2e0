"""Waiting in tests for something another process does (a server, a scheduler, an agent).

The one poll loop of the suite: test modules import it (with their own default timeout where
they need a longer one) instead of keeping copies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0,
               interval: float = 0.1, *, ignore: tuple[type[BaseException], ...] = (),
               alive: Callable[[], None] | None = None) -> Any:
    """``check()``'s first truthy result; AssertionError naming ``what`` after ``timeout`` s.

    ``ignore``: exceptions ``check`` may raise while the thing is not there yet (the last one
    is named on timeout); ``alive``: called before each try, to fail at once when a process
    the wait depends on has died."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if alive is not None:
            alive()
        try:
            result = check()
            if result:
                return result
        except ignore as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}"
                                 + (f" ({last})" if last is not None else ""))
        time.sleep(interval)

