"""A gang binds all together or not at all: the barrier its members' bindings meet at.

Kubernetes binds one pod per request; nothing makes several bindings one transaction. What a
scheduler can do is make the commit point as narrow as it can: every member of a gang first runs
its bind steps (a reservation pod and its GPU UUID, which can take seconds; the ConfigMap; a
claim's allocation), and only when *every* member has finished them do the binding requests go
out, all at once. A member whose steps fail (or whose binding is called off, or whose scheduler
stops) stops the whole gang before any member is bound: the others roll their steps back and
the gang is placed again by a later cycle. Before this barrier each member bound as soon as its
own steps were done, so a gang with one slow or failing member was left partly bound (the 64-pod
benchmark's "7 bound, 57 waiting").

Past the barrier a binding request can still fail (the API server refusing one pod); the stale
gang check (tessera.kube.stale_gangs) evicts a gang left below its minimum for longer than a
grace period, as KAI does.
"""

from __future__ import annotations

import asyncio


class GangAborted(Exception):
    """Another member of the gang could not be bound: this one is not bound either."""


class GangBarrier:
    """Where the ``members`` bindings of one gang wait for each other before binding."""

    def __init__(self, gang: str, members: int) -> None:
        self.gang = gang
        self.left = members
        self.failed: str | None = None
        self._open = asyncio.Event()

    @property
    def passed(self) -> bool:
        """Every member arrived: the bindings are going out (failures are per pod now)."""
        return self._open.is_set() and self.failed is None

    def fail(self, why: str) -> None:
        """A member will not arrive: the others are released with GangAborted (no effect once
        the barrier is passed)."""
        if not self._open.is_set():
            self.failed = why
            self._open.set()

    async def arrive(self) -> None:
        """Wait until every member has arrived; raises GangAborted if one failed."""
        self.left -= 1
        if self.left <= 0 and self.failed is None:
            self._open.set()
        await self._open.wait()
        if self.failed is not None:
            raise GangAborted(f"gang {self.gang} not bound: {self.failed}")
