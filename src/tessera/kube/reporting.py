"""What the scheduler tells people, written only when it changed: why a pod waits (its
PodScheduled=False condition), each project's status (allocated, requested, fair share) and
Events. A failed write is forgotten, so the next cycle writes it again."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from tessera.api.fair_share_doc import fair_share_status
from tessera.core.cycle import Plan
from tessera.kube.binder import Writer
from tessera.kube.objects import PodInfo, PodKey, amounts

log = logging.getLogger("tessera.kube")

Spawn = Callable[[Coroutine[Any, Any, None]], None]

NUMBERS_REFRESH = 10.0
"""Seconds before a reason that changed only in its numbers is written again (``gang g needs 64
pods; 12 exist`` -> ``; 13 exist``): while a gang's pods are being created every member's reason
changed every cycle, two writes per pod per cycle, O(pods²) for one gang."""
_NUMBER = re.compile(r"\d+(\.\d+)?")


def _shape(message: str) -> str:
    return _NUMBER.sub("#", message)


class Reporter:
    def __init__(self, writer: Writer, spawn: Spawn, wake: asyncio.Event) -> None:
        self.writer = writer
        self._spawn = spawn
        self._wake = wake
        self._waits: dict[PodKey, str] = {}
        """The waiting reason last written on each pod."""
        self._written_at: dict[PodKey, float] = {}
        self._status: dict[str, dict[str, Any]] = {}
        """The status last written on each project."""

    def forget(self, key: PodKey) -> None:
        """The pod is bound or gone: nothing written on it is current any more."""
        self._waits.pop(key, None)
        self._written_at.pop(key, None)

    def waiting(self, pod: PodInfo, message: str) -> None:
        """Say on the pod why it waits (unless that is what it says already)."""
        last = self._waits.get(pod.key)
        if last == message:
            return
        now = time.monotonic()
        if last is not None and _shape(last) == _shape(message) and \
                now - self._written_at.get(pod.key, 0.0) < NUMBERS_REFRESH:
            return  # only a count moved: written again after NUMBERS_REFRESH
        self._waits[pod.key] = message
        self._written_at[pod.key] = now
        if pod.scheduled_message != message:
            self._spawn(self._write_unschedulable(pod, message))

    def projects(self, plan: Plan, known: Mapping[str, object]) -> None:
        """Each known project's status after the plan."""
        for name, ps in plan.projects.items():
            if name not in known:
                continue
            status = {
                "allocated": amounts(ps.allocated_after),
                "requested": amounts(ps.requested),
                **fair_share_status(ps),
                "fairShare": amounts(ps.fair_share),
            }
            if self._status.get(name) == status:
                continue
            self._status[name] = status
            self._spawn(self._write_project_status(name, status))

    async def event(self, pod: PodInfo, reason: str, message: str, type_: str = "Normal") -> None:
        try:
            await self.writer.event(pod, reason, message, type_)
        except Exception as exc:
            log.warning("event %s on %s/%s: %r", reason, pod.namespace, pod.name, exc)

    async def _write_unschedulable(self, pod: PodInfo, message: str) -> None:
        try:
            await self.writer.set_unschedulable(pod, message)
        except Exception as exc:
            log.warning("condition on %s/%s: %r", pod.namespace, pod.name, exc)
            if self._waits.get(pod.key) == message:
                del self._waits[pod.key]

    async def _write_project_status(self, name: str, status: dict[str, Any]) -> None:
        try:
            await self.writer.project_status(name, status)
        except Exception as exc:
            log.warning("status of project %s: %r", name, exc)
            if self._status.get(name) is status:
                del self._status[name]
            self._wake.set()
