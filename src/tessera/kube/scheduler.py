"""tessera's Kubernetes scheduler: watch, snapshot, run the core cycle, apply the plan.

    python -m tessera.kube.scheduler --kubeconfig PATH      (console script: tessera-scheduler)

State lives in the API server, never only here: a pod's placement is written onto it (the
``tessera.io/placement`` annotation, in the same request as the binding), a shared GPU is held
by a reservation pod whose name is derived from (node, device) so it can never be created twice,
and everything else is rebuilt from watches after a restart. What this process keeps in memory
is only what it has decided and not yet seen come back (the in-flight ledger,
tessera.kube.inflight), so the next cycle does not give the same room away twice. See
docs/kubernetes.md and docs/architecture.md.

This file is the loop only. Its extension points:

- cycle hooks (tessera.kube.hooks): derive what the cycle sees as an overlay on the informers'
  cache (tessera.kube.podview), reserve before a binding, collect leftovers;
- bind steps (tessera.kube.bind): what a pod gets at bind, run by one binder.

Its other units: ``caches`` (the informers), ``snapshot`` (caches -> the core's Snapshot),
``apply`` (plan -> writes), ``janitor`` (cleanup), ``binder.Writer`` (API writes),
``reservations``, ``reporting``, ``predicates``; the process is ``scheduler_main``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from typing import Any

from lightkube import AsyncClient

from tessera.core.cycle import Plan, WarmCycle
from tessera.core.errors import InvalidRequest
from tessera.core.usage_history import UsageHistory
from tessera.kube import metrics, scheduler_main
from tessera.kube.apply import PlanApplier
from tessera.kube.bind import bind_steps
from tessera.kube.bind.binder import Binder
from tessera.kube.binder import Writer
from tessera.kube.caches import ClusterCaches
from tessera.kube.conflicts import LastingConflicts
from tessera.kube.hooks import MigHook, cycle_hooks
from tessera.kube.inflight import InFlight
from tessera.kube.janitor import Janitor
from tessera.kube.namespace import ensure_namespace
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.pacing import wait_for_backlog
from tessera.kube.parts import Options, Parts
from tessera.kube.podview import PodView
from tessera.kube.rawapi import RawApi
from tessera.kube.reporting import Reporter
from tessera.kube.reservations import Reservations
from tessera.kube.snapshot import SnapshotBuilder, find_conflicts
from tessera.kube.usage_history_store import HistoryConfigMap

log = logging.getLogger("tessera.kube")

GC_SECONDS = 2.0
"""How often the janitor runs between cycles."""


class KubeScheduler:
    def __init__(self, client: AsyncClient, options: Options | None = None,
                 raw: RawApi | None = None) -> None:
        opts = options or Options()
        self.wake = asyncio.Event()
        self.background: set[asyncio.Task[Any]] = set()
        writer = Writer(client, concurrency=opts.concurrency,
                        system_namespace=opts.system_namespace,
                        reservation_image=opts.reservation_image, raw=raw)
        self.caches = ClusterCaches(client, self.wake, self._on_pod, raw)
        self.inflight = InFlight()
        view = PodView(self.caches.pods.items, self.caches.pods.by)
        self.parts = Parts(client, opts, writer, self.caches, view,
                           self.inflight, Reservations(writer, opts.uuid_timeout),
                           Reporter(writer, self._spawn, self.wake), self._spawn, self.wake)
        self.hooks = cycle_hooks(self.parts)
        self.mig = next(h for h in self.hooks if isinstance(h, MigHook))
        self.binder = Binder(self.parts, bind_steps(self.parts, self.mig))
        self.applier = PlanApplier(self.parts, self.hooks, self.binder)
        self.janitor = Janitor(self.parts, self.hooks)
        self.inflight.on_forget += [self.parts.report.forget, *(h.forget for h in self.hooks)]
        self.snapshots = SnapshotBuilder()
        self.conflicts = LastingConflicts()
        self.history = UsageHistory(opts.fair_share_history, dict(opts.fair_share_history_for),
                                    opts.fair_share_history_save_every)
        self.history_store = HistoryConfigMap(client, opts.system_namespace, self.history)
        self.cycles = 0
        self.warm = WarmCycle()
        """The session kept between cycles (tessera.core.cycle.warm): same plans as run_cycle."""
        self.last_cycle_seconds = 0.0

    @property
    def pods(self) -> PodView:
        """The pods as the cycle sees them (the informer's cache under the hooks' overlays)."""
        return self.parts.pods

    def _on_pod(self, key: PodKey, old: PodInfo | None, new: PodInfo | None) -> None:
        info = new or old
        assert info is not None
        if info.reservation is not None:
            if self.parts.reservations.seen(old, new):
                self.wake.set()
            return
        if new is None:
            self.inflight.forget(key)
            self.wake.set()
            return
        if new.node and (old is None or not old.node) and self.inflight.seen_bound(
                key, keeps_mig=bool(new.claim_names)):
            return
        if (old is None or old.node != new.node or old.deleting != new.deleting
                or old.finished != new.finished or old.annotations != new.annotations):
            self.wake.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def run(self) -> None:
        await ensure_namespace(self.parts.client, self.parts.opts.system_namespace)
        informers = self.caches.informers
        watchers = [asyncio.create_task(i.run(), name=f"watch-{i.name}") for i in informers]
        opts = self.parts.opts
        try:
            await asyncio.gather(*(i.synced.wait() for i in informers))
            log.info("caches synced: %d nodes, %d pods, %d projects",
                     len(self.caches.nodes.items), len(self.caches.pods.items),
                     len(self.caches.projects.items))
            await self.history_store.load()  # usage history kept across restarts
            await self.janitor.run()
            last_gc = time.monotonic()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), opts.period)
                # Let events gather: the busier the cycles, the more each one should take in.
                await asyncio.sleep(max(opts.debounce, min(1.0, 2 * self.last_cycle_seconds)))
                await wait_for_backlog(self.inflight.tasks, opts.concurrency)  # kube/pacing.py
                self.wake.clear()
                await self.cycle()
                if time.monotonic() - last_gc > GC_SECONDS:
                    await self.janitor.run()
                    last_gc = time.monotonic()
                    self._log_in_flight()
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.history_store.after_cycle(time.time(), force=True), 5)
            for t in watchers:
                t.cancel()
            for t in list(self.inflight.tasks.values()) + list(self.background):
                t.cancel()

    def _log_in_flight(self) -> None:
        if self.inflight.tasks:
            log.info("in flight: %d bindings (%d waiting for a GPU UUID), %d evictions, %d "
                     "bound so far, %d API writes", len(self.inflight.tasks),
                     self.parts.reservations.waiting(), len(self.inflight.evicting),
                     self.binder.bound, self.parts.writer.calls)

    def derive(self) -> None:
        """Every hook's overlay for this cycle, laid in order, then what each does after."""
        for hook in self.hooks:
            self.pods.lay(hook.name, hook.derive())
        for hook in self.hooks:
            hook.after_derive()

    async def cycle(self) -> Plan | None:
        t0 = time.perf_counter()
        self.derive()
        c, inflight = self.caches, self.inflight
        snapshot, ctx = self.snapshots.build(
            c.nodes.items, self.pods, c.projects.items, c.pod_groups.items, inflight.assumed,
            inflight.evicting, time.time(), c.foreign_held(), c.foreign_pods.items.values(),
            c.namespaces.items, c.volume_claims.items, inflight.unmovable_now(), self.mig.view)
        snapshot = self.history.apply(snapshot)  # time-based fair share (core.usage_history)
        if self.history.policy is not None:  # written every save-every seconds
            self._spawn(self.history_store.after_cycle(snapshot.now))
        config = self.parts.opts.cycle_config(bool(inflight.evicting))
        try:
            plan = await asyncio.to_thread(self.warm.run, snapshot, config)
        except InvalidRequest as exc:
            log.error("cycle refused the snapshot: %s", exc)
            ctx.conflicts = self.conflicts.lasting(find_conflicts(snapshot, ctx, self.pods))
            self.applier.evict_lost(ctx)
            return None
        self.cycles += 1
        self.applier.apply(plan, ctx)
        self.last_cycle_seconds = time.perf_counter() - t0
        metrics.CYCLE_SECONDS.observe(self.last_cycle_seconds)
        if plan.bindings or plan.evictions:
            log.info("cycle %d: %d workloads, %d bindings, %d evictions, %d waiting in %.3fs "
                     "(core %.3fs)", self.cycles, len(snapshot.workloads), len(plan.bindings),
                     len(plan.evictions), len(plan.waiting), self.last_cycle_seconds,
                     plan.timings.get("total", 0.0))
        return plan


def main(argv: list[str] | None = None) -> int:
    """The process (flags, leader election: tessera.kube.scheduler_main) running this loop."""
    return scheduler_main.main(KubeScheduler, argv)


if __name__ == "__main__":
    sys.exit(main())
