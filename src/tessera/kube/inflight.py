"""What the scheduler has decided and not yet seen come back: one ledger, one ``forget``.

Everything here is rebuilt from nothing after a restart (the API server holds the truth); it
only keeps the next cycle from giving the same room away twice, and from retrying what just
failed. A pod that goes away is forgotten in one call (``forget``), which also tells the units
that keep per-pod state of their own (``on_forget``: the hooks, the reporter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.core.state import Placement
from tessera.kube.mig import MigHold
from tessera.kube.objects import PodKey

UNMOVABLE_SECONDS = 300.0
"""How long a pod whose eviction was refused (a PodDisruptionBudget) is not moved again."""


@dataclass(frozen=True, slots=True)
class BindBackoff:
    """A pod whose binding failed: the error, failures in a row, no retry before ``until``
    (monotonic). A binding refused for a wiring reason (webhook, RBAC) would otherwise be
    retried and reported every cycle."""

    error: str
    count: int
    until: float

    def after(self, error: str, now: float) -> BindBackoff:
        """The back-off after one more failure: 0.5 s doubling to 60 s while the error stays
        the same; a new error starts again."""
        count = self.count + 1 if error == self.error else 1
        return BindBackoff(error, count, now + min(60.0, 0.5 * 2 ** (count - 1)))


NO_FAILURE = BindBackoff("", 0, 0.0)


@dataclass(frozen=True, slots=True)
class MigAssumed:
    """The MIG partition chosen for a pod being bound, on ``node``."""

    node: str
    hold: MigHold


@dataclass
class InFlight:
    assumed: dict[PodKey, Placement] = field(default_factory=dict)
    """Placements decided, not yet seen bound (the snapshot counts them as bound)."""
    mig: dict[PodKey, MigAssumed] = field(default_factory=dict)
    """MIG pods being bound: the partition chosen, held until the pod is seen bound with it
    (a MIG claim's until its claim's allocation shows it; tessera.kube.mig)."""
    evicting: set[PodKey] = field(default_factory=set)
    unmovable: dict[PodKey, float] = field(default_factory=dict)
    """Pods consolidation must not move before the given time (their eviction was refused)."""
    tasks: dict[PodKey, asyncio.Task[None]] = field(default_factory=dict)
    """Bindings running."""
    failures: dict[PodKey, BindBackoff] = field(default_factory=dict)
    on_forget: list[Callable[[PodKey], None]] = field(default_factory=list)
    """What else keeps per-pod state (hooks, the reporter): told when a pod is gone."""

    def forget(self, key: PodKey) -> None:
        """The pod is gone: nothing about it is kept, here or in the units that asked."""
        self.assumed.pop(key, None)
        self.mig.pop(key, None)
        self.evicting.discard(key)
        self.failures.pop(key, None)
        for forget in self.on_forget:
            forget(key)

    def call_off(self, key: PodKey) -> None:
        """A binding is not to happen (the pod is evicted, or the room it waited for is not
        made): its task is cancelled and its choices dropped."""
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()
        self.unassume(key)

    def unassume(self, key: PodKey) -> None:
        self.assumed.pop(key, None)
        self.mig.pop(key, None)

    def seen_bound(self, key: PodKey, keeps_mig: bool) -> bool:
        """The pod is seen bound: its placement is the API server's now. A MIG claim's
        choice (``keeps_mig``) is kept until its claim's allocation shows it."""
        if key not in self.assumed:
            return False
        del self.assumed[key]
        if not keeps_mig:
            self.mig.pop(key, None)
        return True

    def backing_off(self, key: PodKey, now: float) -> bool:
        failed = self.failures.get(key)
        return failed is not None and now < failed.until

    def bind_failed(self, key: PodKey, placement: Placement, error: str) -> BindBackoff:
        """Records a failure; the placement is dropped if it is still the one assumed."""
        if self.assumed.get(key) is placement:
            self.unassume(key)
        backoff = self.failures.get(key, NO_FAILURE).after(error, time.monotonic())
        self.failures[key] = backoff
        return backoff

    def prune(self, exists: Callable[[PodKey], bool]) -> list[PodKey]:
        """Drops evictions of pods that are gone (a pod deleted while the cycle ran, then
        evicted by its plan, would otherwise keep every later cycle from evicting anything)."""
        gone = [k for k in self.evicting if not exists(k)]
        for key in gone:
            self.evicting.discard(key)
        return gone

    def refused_move(self, key: PodKey) -> None:
        self.evicting.discard(key)
        self.unmovable[key] = time.monotonic() + UNMOVABLE_SECONDS

    def unmovable_now(self) -> set[PodKey]:
        now = time.monotonic()
        for key in [k for k, until in self.unmovable.items() if until <= now]:
            del self.unmovable[key]
        return set(self.unmovable)
