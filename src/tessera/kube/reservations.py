"""Reservation pods: one per shared GPU device (node, device index), so the kubelet's device
plugin hands that device to tessera's pods and reports its UUID.

This unit keeps what the scheduler knows of them (from the pod informer), creates one when a
shared pod is bound to a device that has none and waits for its UUID, and deletes those that
no pod uses any more. A device being reserved right now is ``busy``: neither deleted nor
counted as lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from tessera.core.state import Placement
from tessera.kube.binder import Writer
from tessera.kube.objects import DeviceKey, PodInfo, PodKey

log = logging.getLogger("tessera.kube")


class Reservations:
    def __init__(self, writer: Writer, uuid_timeout: float) -> None:
        self.writer = writer
        self.uuid_timeout = uuid_timeout
        self.pods: dict[DeviceKey, PodInfo] = {}
        """The reservation pod of each device, as the informer last saw it."""
        self._locks: dict[DeviceKey, asyncio.Lock] = {}
        self._uuid_waiters: dict[DeviceKey, list[asyncio.Future[str]]] = {}

    def seen(self, old: PodInfo | None, new: PodInfo | None) -> bool:
        """A reservation pod's event; True when it went away (the scheduler should look again)."""
        info = new or old
        assert info is not None and info.reservation is not None
        rk = info.reservation
        if new is None:
            if self.pods.get(rk) is old:
                del self.pods[rk]
            return True
        self.pods[rk] = new
        if new.gpu_uuid:
            for fut in self._uuid_waiters.pop(rk, []):
                if not fut.done():
                    fut.set_result(new.gpu_uuid)
        return False

    def busy(self, rk: DeviceKey) -> bool:
        """Being reserved right now (a binding waits for it)."""
        lock = self._locks.get(rk)
        return lock is not None and lock.locked()

    def waiting(self) -> int:
        """Bindings waiting for a GPU UUID."""
        return sum(len(v) for v in self._uuid_waiters.values())

    def missing(self, node: str, devices: Iterable[int]) -> list[int]:
        """Devices of ``node`` that have no reservation pod and are not being reserved."""
        return [d for d in devices if (node, d) not in self.pods and not self.busy((node, d))]

    async def reserve(self, node: str, device: int) -> str:
        """The UUID of the GPU held for shared device ``device`` of ``node``, creating its
        reservation pod if there is none (its name is fixed, so never twice)."""
        rk = (node, device)
        lock = self._locks.setdefault(rk, asyncio.Lock())
        async with lock:
            deadline = time.monotonic() + self.uuid_timeout
            while True:
                res = self.pods.get(rk)
                if res is not None and res.deleting:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"reservation pod {res.name} is still terminating")
                    await asyncio.sleep(0.05)
                    continue
                if res is not None and res.gpu_uuid:
                    return res.gpu_uuid
                if res is None:
                    await self.writer.create_reservation(node, device)
                break
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._uuid_waiters.setdefault(rk, []).append(fut)
            res = self.pods.get(rk)
            if res is not None and res.gpu_uuid:
                return res.gpu_uuid
            try:
                return await asyncio.wait_for(fut, max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise TimeoutError(
                    f"the GPU UUID of reservation pod for {node} device {device} was not "
                    f"reported within {self.uuid_timeout:.0f}s") from None

    @staticmethod
    def tenants(pods: Iterable[PodInfo], assumed: Mapping[PodKey, Placement]) -> set[DeviceKey]:
        """Shared devices some pod uses: bound, or assumed (decided, not yet seen bound)."""
        used: set[DeviceKey] = set()
        for pod in pods:
            if pod.reservation is not None or pod.finished or pod.claim_names:
                continue  # a claim's allocation holds its GPU (no reservation pod)
            pl = pod.placement if pod.node else assumed.get(pod.key)
            if pl is not None and not pl.exclusive:
                used.update((pl.node, d) for d in pl.devices)
        for pl in assumed.values():
            if not pl.exclusive:
                used.update((pl.node, d) for d in pl.devices)
        return used

    def release_unused(self, used: set[DeviceKey],
                       spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Delete (in the background, through ``spawn``) every reservation pod no pod uses."""
        for rk, res in list(self.pods.items()):
            if res.deleting or rk in used or self.busy(rk):
                continue
            res.deleting = True
            spawn(self._delete(res))

    async def _delete(self, res: PodInfo) -> None:
        try:
            await self.writer.delete_reservation(res, "no tenants left")
        except Exception as exc:
            log.warning("deleting reservation pod %s: %r", res.name, exc)
            res.deleting = False
