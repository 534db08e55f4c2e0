"""How long a collision between bound pods' recorded placements must last before it is acted on.

When the core refuses a snapshot because two bound pods' recorded placements collide, the
scheduler evicts the pod that collides (``PlanApplier.evict_lost``). But a collision can be a
moment in a legitimate change: tessera-node's device-truth step (``node/sync/whole_gpus.py``)
rewrites each pod's record to the GPUs the kubelet's device plugin really gave, one pod after
the other, so when the plugin swapped two pods' GPUs, the first rewrite collides with the
second pod's record until the second rewrite lands (about a second later). Evicting then would
evict a healthy pod (seen with a gang of four on a loaded machine). A collision is acted on only
once it has lasted ``grace`` seconds; meanwhile the cycle waits, as it does for any refused
snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tessera.kube.objects import PodInfo, PodKey

GRACE_SECONDS = 15.0


class LastingConflicts:
    def __init__(self, grace: float = GRACE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self.clock = clock
        self.since: dict[PodKey, float] = {}
        """Pod -> when its collision was first seen; only pods colliding in the last search."""

    def lasting(self, found: Sequence[PodInfo]) -> list[PodInfo]:
        """The pods of ``found`` whose collision has lasted ``grace`` seconds."""
        now = self.clock()
        self.since = {p.key: self.since.get(p.key, now) for p in found}
        return [p for p in found if now - self.since[p.key] >= self.grace]
