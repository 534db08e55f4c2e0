"""A binding refused for a wiring reason (webhook, RBAC) is retried with back-off and reported
with one FailedBinding Event per distinct error, not one per cycle (issue 13 item 6)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tessera.core.state import Placement
from tessera.kube.objects import PodInfo
from tessera.kube.scheduler import KubeScheduler


class FakeWriter:
    def __init__(self, error: str) -> None:
        self.error = error
        self.events: list[tuple[str, str]] = []
        self.binds = 0

    async def bind(self, pod: PodInfo, placement: Placement, annotations: dict[str, str]) -> None:
        self.binds += 1
        raise RuntimeError(self.error)

    async def event(self, pod: PodInfo, reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((reason, message))


def pod() -> PodInfo:
    return PodInfo("ns", "p", "uid", None, "Pending", False, 0.0, None, {}, {}, None)


def test_failed_binding_backs_off_and_reports_once_per_error() -> None:
    async def run() -> tuple[KubeScheduler, FakeWriter]:
        sched = KubeScheduler(client=object())  # type: ignore[arg-type]
        fake = FakeWriter('admission webhook denied the request: only tessera-scheduler may write')
        sched.writer = fake  # type: ignore[assignment]
        p = pod()
        sched.pods.items[p.key] = p
        place = Placement("n1", cpu_milli=100)
        for _ in range(5):
            sched.assumed[p.key] = place
            await sched._bind(p.key, place, [])
            await asyncio.sleep(0)
        fake.error = "another error"
        sched.assumed[p.key] = place
        await sched._bind(p.key, place, [])
        await asyncio.gather(*list(sched.background))
        return sched, fake

    sched, fake = asyncio.run(run())
    assert fake.binds == 6
    reasons = [r for r, _ in fake.events]
    assert reasons == ["FailedBinding", "FailedBinding"], fake.events
    assert "admission webhook denied" in fake.events[0][1] and "not repeated" in fake.events[0][1]
    error, count, until = sched.bind_failures[("ns", "p")]
    assert error == "another error" and count == 1 and until > time.monotonic()
    assert ("ns", "p") not in sched.assumed


def test_back_off_grows_while_the_error_stays() -> None:
    async def run() -> list[float]:
        sched = KubeScheduler(client=object())  # type: ignore[arg-type]
        sched.writer = FakeWriter("denied")  # type: ignore[assignment]
        p = pod()
        sched.pods.items[p.key] = p
        waits: list[float] = []
        for _ in range(4):
            place = Placement("n1", cpu_milli=100)
            sched.assumed[p.key] = place
            t = time.monotonic()
            await sched._bind(p.key, place, [])
            waits.append(sched.bind_failures[p.key][2] - t)
        await asyncio.gather(*list(sched.background))
        return waits

    waits: Any = asyncio.run(run())
    assert waits == sorted(waits) and waits[-1] > 3 * waits[0]
