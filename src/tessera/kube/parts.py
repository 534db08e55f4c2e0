"""The scheduler's options and the parts its units share (built once by ``KubeScheduler``).

Every cycle hook (tessera.kube.hooks), bind step (tessera.kube.bind), the plan applier and the
janitor get one ``Parts``: the caches they read, the pod view they read through, the in-flight
ledger, the API writer and the loop's ``spawn`` / ``wake``. None of them holds state of another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient

from tessera.core.cycle import CycleConfig
from tessera.core.usage import UsagePolicy
from tessera.core.usage_history import SAVE_EVERY, Override
from tessera.kube import names
from tessera.kube.binder import Writer
from tessera.kube.caches import ClusterCaches
from tessera.kube.inflight import InFlight
from tessera.kube.podview import PodView
from tessera.kube.reporting import Reporter
from tessera.kube.reservations import Reservations

ACTIONS = ("allocate", "consolidate", "shrink", "reclaim", "preempt", "backfill")
"""Consolidation moves a pod by evicting it (Eviction API, so PodDisruptionBudgets hold) when
its controller recreates it (ReplicaSet, StatefulSet, Job); bare pods are never moved."""


@dataclass(frozen=True)
class Options:
    system_namespace: str = names.SYSTEM_NAMESPACE
    concurrency: int = 32
    debounce: float = 0.05
    period: float = 5.0
    uuid_timeout: float = 120.0
    reservation_image: str = "registry.k8s.io/pause:3.10"
    policy: str | None = None
    reclaim: bool = True
    """Run the reclaim action (GPUs lent over quota given back to a project below its share)."""
    min_runtime: float = 0.0
    """Seconds a pod runs before reclaim or preemption may evict it, unless its project (the
    Project's reclaimMinRuntimeSeconds / preemptMinRuntimeSeconds) says otherwise."""
    fair_share_history: UsagePolicy | None = None
    """Time-based fair share (--fair-share-history; tessera.core.usage_history); None: plain."""
    fair_share_history_for: tuple[tuple[str, Override], ...] = ()
    """Per department (or project) (window, half-life), below a Project's own settings."""
    fair_share_history_save_every: float = SAVE_EVERY
    """Seconds between writes of the usage history (tessera.kube.usage_history_store)."""
    stale_gang_seconds: float = 60.0
    """A gang with some members bound but fewer than its minimum for this long is evicted whole
    (tessera.kube.stale_gangs; 0: never)."""

    def cycle_config(self, evicting: bool) -> CycleConfig:
        """The core's configuration for one cycle; while evictions are in flight, only allocate
        and backfill (nothing is evicted twice)."""
        actions: tuple[str, ...] = ACTIONS if not evicting else ("allocate", "backfill")
        if not self.reclaim:
            actions = tuple(a for a in actions if a != "reclaim")
        kwargs: dict[str, Any] = {} if self.policy is None else {"policy": self.policy}
        return CycleConfig(actions=actions, preempt_min_runtime=self.min_runtime,
                           reclaim_min_runtime=self.min_runtime, usage=self.fair_share_history,
                           **kwargs)


Spawn = Callable[[Coroutine[Any, Any, Any]], None]


@dataclass
class Parts:
    client: AsyncClient
    opts: Options
    writer: Writer
    caches: ClusterCaches
    pods: PodView
    """The pods through the hooks' overlays: what every unit reads (never ``caches.pods``)."""
    inflight: InFlight
    reservations: Reservations
    report: Reporter
    spawn: Spawn
    wake: asyncio.Event
