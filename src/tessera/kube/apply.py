"""Applying a plan: moves, evictions (with the pods a hook says go along), bindings (started as
tasks once every hook reserves), and the reasons the waiting pods are told.

Nothing here waits on the API server: every write is spawned, every binding is a task
(tessera.kube.bind.binder), and what was decided is recorded in the in-flight ledger first.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lightkube import ApiError

from tessera.core.cycle import Plan
from tessera.core.model import GpuKind
from tessera.kube import metrics
from tessera.kube.bind.binder import Binder
from tessera.kube.bind.gang import GangBarrier
from tessera.kube.hooks import CycleHook
from tessera.kube.inflight import UNMOVABLE_SECONDS
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.parts import Parts
from tessera.kube.snapshot import Context, agents_not_ready_text

log = logging.getLogger("tessera.kube")

EVICTION_REASONS = {"reclaim": "Reclaimed", "preempt": "Preempted", "shrink": "Shrunk"}


def evicted_keys(plan: Plan, ctx: Context, workload_id: str) -> list[PodKey]:
    """The pods an eviction of ``workload_id`` in ``plan`` takes: all of them, or only the
    elastic pods it names when it was shrunk (``Eviction.pods``, actions/shrink.py)."""
    keys = ctx.pods_of.get(workload_id, [])
    pods = next((e.pods for e in plan.evictions if e.workload_id == workload_id), ())
    return [keys[i] for i in pods if i < len(keys)] if pods else list(keys)


class PlanApplier:
    def __init__(self, parts: Parts, hooks: list[CycleHook], binder: Binder) -> None:
        self.parts = parts
        self.hooks = hooks
        self.binder = binder

    def apply(self, plan: Plan, ctx: Context) -> None:
        moved = self._apply_moves(plan, ctx)
        self._apply_evictions(plan, ctx)
        self._apply_bindings(plan, ctx, moved)
        self._tell_waiting(plan, ctx)
        self.evict_lost(ctx)
        self.parts.report.projects(plan, self.parts.caches.projects.items)

    def _partners(self, key: PodKey) -> list[PodKey]:
        return [o for h in self.hooks for o in h.partners(key)]

    def _apply_moves(self, plan: Plan, ctx: Context) -> list[PodKey]:
        """Evict the pods consolidation moves (their controllers recreate them, and the next
        cycles place the new pods); returns them, for the bindings that need their room."""
        parts, moved = self.parts, []
        waiting_for = [b for b in plan.bindings if b.action == "consolidate"]
        for m in plan.moves:
            key = ctx.pods_of[m.workload_id][m.pod]
            pod = parts.pods.get(key)
            if pod is None or key in parts.inflight.evicting or not pod.node:
                continue
            parts.inflight.evicting.add(key)
            moved.append(key)
            message = (f"{m.reason} (from {m.source.node} to {m.target.node}): evicted through "
                       f"the Eviction API; its {pod.owner or 'controller'} recreates it")
            parts.spawn(self._move(pod, message, [ctx.pods_of[b.workload_id][pb.pod]
                                                  for b in waiting_for for pb in b.pods]))
        return moved

    async def _move(self, pod: PodInfo, message: str, dependents: list[PodKey]) -> None:
        parts = self.parts
        try:
            await parts.writer.evict_api(pod, "Moved", message)
        except Exception as exc:
            # A PodDisruptionBudget (429) or anything else: the room is not made, so the
            # bindings waiting for it are called off; the pod is not moved again for a while.
            log.info("moving %s/%s refused: %r", pod.namespace, pod.name, exc)
            parts.inflight.refused_move(pod.key)
            why = exc.status.message if isinstance(exc, ApiError) and exc.status else str(exc)
            parts.spawn(parts.writer.event(
                pod, "NotMoved", f"consolidation wanted to move it but the eviction was "
                f"refused: {why}; not tried again for {UNMOVABLE_SECONDS:.0f}s", "Warning"))
            for key in dependents:
                parts.inflight.call_off(key)
            parts.wake.set()

    def _apply_evictions(self, plan: Plan, ctx: Context) -> None:
        parts, inflight = self.parts, self.parts.inflight
        for e in plan.evictions:
            for key in evicted_keys(plan, ctx, e.workload_id):
                pod = parts.pods.get(key)
                if pod is None or key in inflight.evicting:
                    continue
                if not pod.node and key not in inflight.assumed:
                    continue
                inflight.call_off(key)
                inflight.evicting.add(key)
                reason = EVICTION_REASONS.get(e.action, "Evicted")
                metrics.EVICTIONS.labels(reason).inc()
                parts.spawn(parts.writer.evict(pod, reason, e.reason))
                for other in self._partners(key):
                    # E.g. a shared claim's GPU is freed only when all its pods are gone.
                    partner = parts.pods.get(other)
                    if partner is None or other in inflight.evicting:
                        continue
                    inflight.evicting.add(other)
                    metrics.EVICTIONS.labels(reason).inc()
                    parts.spawn(parts.writer.evict(
                        partner, reason, f"{e.reason} (it shares a ResourceClaim with "
                        f"{pod.namespace}/{pod.name}, which was evicted)"))

    def _apply_bindings(self, plan: Plan, ctx: Context, moved: list[PodKey]) -> None:
        parts, inflight = self.parts, self.parts.inflight
        for b in plan.bindings:
            keys = ctx.pods_of[b.workload_id]
            victims = [k for wid in b.after_evictions for k in evicted_keys(plan, ctx, wid)]
            victims += [o for v in victims for o in self._partners(v)]
            if b.action == "consolidate":
                victims += moved
            members = [(keys[pb.pod], pb) for pb in b.pods]
            pods = {key: parts.pods.get(key) for key, _ in members}
            todo = [(key, pb) for key, pb in members if (p := pods[key]) is not None
                    and not p.node and key not in inflight.assumed]
            # Pods of one binding start together or none (a gang, tessera.kube.bind.gang):
            # a member backing off from a failed binding holds the others back too.
            now = time.monotonic()
            held = next((key for key, _ in todo if inflight.backing_off(key, now)), None)
            if held is not None:
                if len(todo) > 1:
                    self._held_back(b.workload_id, [k for k, _ in todo if k != held], held)
                continue
            reserved: list[PodKey] = []
            for key, pb in todo:
                pod = pods[key]
                assert pod is not None
                if not all(h.reserve(pod, pb, victims) for h in self.hooks):
                    break  # e.g. a MIG slot taken by another pod of this cycle
                reserved.append(key)
                inflight.assumed[key] = pb.placement
            if len(reserved) < len(todo):
                for key in reserved:  # the next cycle looks again, for all of them
                    inflight.unassume(key)
                continue
            gang = GangBarrier(b.workload_id, len(todo)) if len(todo) > 1 else None
            for key, pb in todo:
                parts.report.forget(key)
                inflight.tasks[key] = asyncio.create_task(
                    self.binder.bind(key, pb.placement, victims, gang))

    def _held_back(self, workload_id: str, keys: list[PodKey], held: PodKey) -> None:
        failure = self.parts.inflight.failures[held]
        for key in keys:
            pod = self.parts.pods.get(key)
            if pod is not None:
                self.parts.report.waiting(pod, (
                    f"gang {workload_id} waits: the binding of its member {held[0]}/{held[1]} "
                    f"failed ({failure.error}); no member is bound until it can be"))

    def _tell_waiting(self, plan: Plan, ctx: Context) -> None:
        parts, inflight = self.parts, self.parts.inflight
        waits = dict(ctx.waits)
        for w in plan.waiting:
            for key in ctx.pods_of.get(w.workload_id, []):
                pod = parts.pods.get(key)
                if pod is not None and not pod.node and key not in inflight.assumed:
                    waits[key] = w.reason
                    for h in self.hooks:
                        h.waiting(key, pod, w.kind)
        for key, message in waits.items():
            pod = parts.pods.get(key)
            if pod is not None and ctx.agents_not_ready and pod.request is not None \
                    and pod.request.gpu.kind is not GpuKind.NONE:
                message = f"{message}; {agents_not_ready_text(ctx.agents_not_ready)}"
            if pod is not None and not any(h.silent(key) for h in self.hooks):
                parts.report.waiting(pod, message)
        metrics.set_pending(waits.values())

    def evict_lost(self, ctx: Context) -> None:
        parts = self.parts
        for pod in ctx.orphans + ctx.conflicts:
            if pod.key in parts.inflight.evicting or pod.key not in parts.pods:
                continue  # being evicted, or gone while the cycle ran
            parts.inflight.evicting.add(pod.key)
            lost = pod in ctx.orphans
            metrics.EVICTIONS.labels("NodeLost" if lost else "Conflict").inc()
            why = (f"node {pod.node} was deleted while the pod was bound to it" if lost
                   else "its recorded GPU placement collides with another pod")
            parts.spawn(parts.writer.evict(pod, "NodeLost" if lost else "Conflict", why))
