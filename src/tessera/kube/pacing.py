"""When the next cycle starts: not while the bindings already decided are piling up.

The cycle runs in a worker thread of the same process as the event loop that sends the
bindings, so the two share one interpreter lock. When more bindings are in flight than the
writer sends in a moment (the API server is the slower side), another cycle adds only more to
the queue while it takes the lock from the loop that drains it: at 2,000 nodes and 16,000 pods on
a loaded machine, 7,000 bindings waited in flight while cycles of several seconds ran back to
back. The loop therefore waits, up to ``BACKLOG_WAIT`` seconds, for the backlog to fall under
``BACKLOG_PER_SLOT`` bindings per write slot; the next cycle then takes in everything that
arrived meanwhile in one go (its fixed cost, the nodes and the running pods, paid once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sized

BACKLOG_PER_SLOT = 4
"""Bindings in flight per concurrent API write beyond which a new cycle waits."""
BACKLOG_WAIT = 2.0
"""The longest a cycle waits for the backlog (seconds): decisions are never held back longer."""


async def wait_for_backlog(in_flight: Sized, slots: int, wait: float = BACKLOG_WAIT,
                           poll: float = 0.05) -> float:
    """Waits while ``in_flight`` holds more than ``BACKLOG_PER_SLOT × slots`` entries, at most
    ``wait`` seconds; returns the seconds waited."""
    limit = BACKLOG_PER_SLOT * max(1, slots)
    t0 = time.monotonic()
    while len(in_flight) > limit and time.monotonic() - t0 < wait:
        await asyncio.sleep(poll)
    return time.monotonic() - t0
