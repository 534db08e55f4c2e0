"""One binding: wait for the victims to go, run the bind steps, bind; back off on failure.

The steps (tessera.kube.bind.bind_steps) gather what the pod needs; the binding itself is one
request (``Writer.bind``: the binding plus ``tessera.io/placement`` and the steps'
annotations). A failure drops the placement if it is still the one assumed, rolls back the
steps that ran, backs off (0.5 s doubling to 60 s while the error stays the same) and tells
the pod once per distinct error.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lightkube import ApiError

from tessera.core.state import Placement
from tessera.kube import metrics
from tessera.kube.bind.base import Abandon, BindContext, BindStep
from tessera.kube.bind.gang import GangAborted, GangBarrier
from tessera.kube.objects import PodKey
from tessera.kube.parts import Parts

log = logging.getLogger("tessera.kube")


class Binder:
    def __init__(self, parts: Parts, steps: list[BindStep]) -> None:
        self.parts = parts
        self.steps = steps
        self.bound = 0
        """Pods bound by this process."""

    async def wait_gone(self, keys: list[PodKey], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while any(k in self.parts.pods for k in keys):
            if time.monotonic() > deadline:
                raise TimeoutError("evicted pods did not go away")
            await asyncio.sleep(0.05)

    async def bind(self, key: PodKey, placement: Placement, victims: list[PodKey],
                   gang: GangBarrier | None = None) -> None:
        """Bind one pod; with ``gang``, only once every member of its gang has run its steps
        (tessera.kube.bind.gang): a member that fails or is called off before that stops all."""
        parts, inflight = self.parts, self.parts.inflight
        done: list[BindStep] = []
        ctx: BindContext | None = None
        try:
            if victims:
                await self.wait_gone(victims)
            pod = parts.pods.get(key)
            if pod is None or pod.node:
                raise Abandon
            ctx = BindContext(key, placement, pod)
            for step in self.steps:
                if step.applies(ctx):
                    done.append(step)
                    await step.pre_bind(ctx)
            if gang is not None:
                await gang.arrive()
            await parts.writer.bind(ctx.pod, placement, ctx.annotations)
            self.bound += 1
            metrics.BINDINGS.inc()
            inflight.failures.pop(key, None)
            parts.spawn(parts.writer.notice(
                ctx.pod, "Scheduled", f"Successfully assigned {ctx.pod.namespace}/"
                f"{ctx.pod.name} to {placement.node}{ctx.how}"))
        except Abandon:
            self._stop_gang(gang, key, "a member went away or was bound meanwhile")
            inflight.assumed.pop(key, None)
        except GangAborted as exc:
            self._aborted(key, placement, exc, done, ctx)
        except asyncio.CancelledError:
            self._stop_gang(gang, key, "a member's binding was called off")
            raise
        except Exception as exc:
            self._stop_gang(gang, key, f"binding {key[0]}/{key[1]} failed: {exc}")
            self._failed(key, placement, exc, done, ctx)
        finally:
            if inflight.tasks.get(key) is asyncio.current_task():
                del inflight.tasks[key]

    @staticmethod
    def _stop_gang(gang: GangBarrier | None, key: PodKey, why: str) -> None:
        if gang is not None:
            gang.fail(f"{why} ({key[0]}/{key[1]})" if key[1] not in why else why)

    def _aborted(self, key: PodKey, placement: Placement, exc: GangAborted,
                 done: list[BindStep], ctx: BindContext | None) -> None:
        """Another member failed first: undo this one's steps and give its room back, with no
        back-off of its own (the failed member's keeps the gang from being retried at once)."""
        inflight = self.parts.inflight
        if inflight.assumed.get(key) is placement:
            inflight.unassume(key)
        if ctx is not None:
            for step in reversed(done):
                step.rollback(ctx)
        log.info("binding %s/%s called off: %s", key[0], key[1], exc)
        metrics.GANG_ABORTS.inc()
        self.parts.wake.set()

    def _failed(self, key: PodKey, placement: Placement, exc: Exception,
                done: list[BindStep], ctx: BindContext | None) -> None:
        parts = self.parts
        backoff = parts.inflight.bind_failed(key, placement, str(exc))
        if ctx is not None:
            for step in reversed(done):
                step.rollback(ctx)
        log.warning("binding %s/%s to %s failed: %r", key[0], key[1], placement.node, exc)
        metrics.BINDING_FAILURES.inc()
        pod = parts.pods.get(key)
        if pod is not None and backoff.count == 1 and not (
                isinstance(exc, ApiError) and exc.status.code == 404):
            parts.spawn(parts.writer.event(
                pod, "FailedBinding", f"binding to {placement.node} failed: {exc} (retried "
                "with back-off; this Event is not repeated while the error stays the same)",
                "Warning"))
        parts.wake.set()
