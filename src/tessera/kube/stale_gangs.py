"""Stale gangs: a gang left with some members bound but fewer than its minimum is evicted whole
after a grace period (KAI's stale gang eviction).

The gang barrier (tessera.kube.bind.gang) keeps a gang from being bound by halves, but past it
a binding request can still fail, a scheduler can stop between two bindings, and a member can
fail or be deleted after the gang started. The cycle then tries to place the missing members
(the core's ``required``: the minimum less what runs); while it cannot, the bound members hold
GPUs a whole gang would need and do no useful work. After ``grace`` seconds below the minimum,
every member still bound is evicted (Event ``StaleGang`` on each, naming the count and the
minimum); their controller recreates them and the gang is placed again together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from tessera.kube import metrics
from tessera.kube.objects import PodGroupInfo, PodInfo, PodKey
from tessera.kube.podgrouper import inferred_group

log = logging.getLogger("tessera.kube")

DEFAULT_GRACE = 60.0
"""Seconds a gang may stay below its minimum with some members bound (KAI: 60 s)."""

Group = tuple[str, str]


def below_minimum(pods: Iterable[PodInfo], pod_groups: Mapping[PodKey, PodGroupInfo],
                  placed: Callable[[PodInfo], bool]) -> dict[Group, tuple[int, int, list[PodInfo]]]:
    """Gangs with at least one member placed and fewer placed than their minimum:
    group -> (placed, minimum, the members bound). Pure."""
    groups: dict[Group, list[PodInfo]] = {}
    for pod in pods:
        if pod.group and pod.reservation is None:
            groups.setdefault((pod.namespace, pod.group), []).append(pod)
    out: dict[Group, tuple[int, int, list[PodInfo]]] = {}
    for key, members in groups.items():
        pg = pod_groups.get(key) or inferred_group(key[0], key[1], members)
        if pg is None or pg.min_member <= 1:
            continue
        live = [p for p in members if not p.deleting]
        count = sum(1 for p in live if placed(p))
        if 0 < count < pg.min_member:
            out[key] = (count, pg.min_member, [p for p in live if p.node and not p.finished])
    return out


class StaleGangs:
    """Run by the janitor: tracks since when each gang is below its minimum and evicts it once
    that lasts ``grace`` seconds (0: never)."""

    def __init__(self, grace: float = DEFAULT_GRACE) -> None:
        self.grace = grace
        self.since: dict[Group, float] = {}

    def due(self, below: Mapping[Group, tuple[int, int, list[PodInfo]]],
            now: float | None = None) -> list[tuple[Group, int, int, list[PodInfo]]]:
        """The gangs whose time is up (forgotten here: a new grace starts if they stay below)."""
        now = time.monotonic() if now is None else now
        for key in [k for k in self.since if k not in below]:
            del self.since[key]
        if self.grace <= 0:
            return []
        out = []
        for key, (count, minimum, bound) in below.items():
            start = self.since.setdefault(key, now)
            if now - start >= self.grace and bound:
                del self.since[key]
                out.append((key, count, minimum, bound))
        return out

    @staticmethod
    def message(key: Group, count: int, minimum: int, grace: float) -> str:
        return (f"gang {key[1]} stayed below its minimum for {grace:g}s ({count} of {minimum} "
                "members placed): every bound member is evicted so that the gang starts again "
                "together (tessera.io/gang-min-member; the scheduler's --stale-gang-seconds)")

    def evictions(self, pods: Iterable[PodInfo], pod_groups: Mapping[PodKey, PodGroupInfo],
                  placed: Callable[[PodInfo], bool]) -> list[tuple[PodInfo, str]]:
        """(pod, why) for every member of a gang whose grace is over."""
        out = []
        for key, count, minimum, bound in self.due(below_minimum(pods, pod_groups, placed)):
            why = self.message(key, count, minimum, self.grace)
            log.warning("%s/%s: %s", key[0], key[1], why)
            metrics.EVICTIONS.labels("StaleGang").inc(len(bound))
            out += [(p, why) for p in bound]
        return out
