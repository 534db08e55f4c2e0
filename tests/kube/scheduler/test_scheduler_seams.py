"""The scheduler's extension points, each alone, without a cluster: the pod view and its
overlays, the in-flight ledger, the binder with its steps (back-off, rollback, Abandon), and
the claims and MIG hooks. (The same units against a real API server: test_scheduler.py,
test_dra*.py, test_mig*.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from tessera.core.model import GpuRequest, ResourceRequest
from tessera.core.state import Placement
from tessera.kube.bind import Abandon, BindContext, BindStep
from tessera.kube.bind.binder import Binder
from tessera.kube.inflight import InFlight, MigAssumed
from tessera.kube.mig import MigHold
from tessera.kube.objects import PodInfo
from tessera.kube.podview import PodView
from tessera.kube.scheduler import KubeScheduler


class FakeWriter:
    """Records what the scheduler would write; ``bind`` fails with ``error`` when set."""

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.events: list[tuple[str, str]] = []
        self.binds: list[dict[str, str]] = []
        self.configmaps: list[dict[str, str]] = []
        self.calls = 0

    async def bind(self, pod: PodInfo, placement: Placement, annotations: dict[str, str]) -> None:
        self.binds.append(dict(annotations))
        if self.error is not None:
            raise RuntimeError(self.error)

    async def write_configmap(self, pod: PodInfo, data: dict[str, str]) -> str:
        self.configmaps.append(dict(data))
        return f"{pod.name}-tessera-gpu"

    async def event(self, pod: PodInfo, reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((reason, message))

    async def notice(self, pod: PodInfo, reason: str, message: str) -> None:
        self.events.append((reason, message))


def pod(name: str = "p", **kw: Any) -> PodInfo:
    return PodInfo("ns", name, f"uid-{name}", None, "Pending", False, 0.0, None, {}, {}, None,
                   **kw)


def scheduler(writer: FakeWriter) -> KubeScheduler:
    sched = KubeScheduler(client=object())  # type: ignore[arg-type]
    sched.parts.writer = writer  # type: ignore[assignment]
    return sched


# ---- the pod view ------------------------------------------------------------------------------
def test_an_overlay_is_seen_through_the_view_and_never_written_into_the_cache() -> None:
    cache = {("ns", "a"): pod("a"), ("ns", "b"): pod("b")}
    view = PodView(cache)
    parsed = cache[("ns", "a")]
    view.lay("claims", {("ns", "a"): {"error": "no claim"}})
    assert view[("ns", "a")].error == "no claim" and cache[("ns", "a")] is parsed
    assert parsed.error is None
    assert {p.name: p.error for p in view.values()} == {"a": "no claim", "b": None}
    derived = view[("ns", "a")]
    view.lay("claims", {("ns", "a"): {"error": "no claim"}})  # the same next cycle
    assert view[("ns", "a")] is derived, "an unchanged derivation keeps its object and version"
    view.lay("claims", {("ns", "a"): {"error": "other"}})
    assert view[("ns", "a")].version != derived.version
    # An event replaces the parsed pod: it shows as parsed until the next cycle derives again.
    cache[("ns", "a")] = pod("a")
    assert view[("ns", "a")].error is None
    # A change equal to what lies below makes no entry.
    view.lay("claims", {("ns", "b"): {"error": None}})
    assert view.layers["claims"] == {}


def test_layers_apply_in_order_each_over_what_lies_below() -> None:
    cache = {("ns", "a"): pod("a")}
    view = PodView(cache)
    view.lay("first", {("ns", "a"): {"error": "x"}})
    view.lay("second", {("ns", "a"): {"mig_profile": "1g.5gb"}})
    got = view[("ns", "a")]
    assert (got.error, got.mig_profile) == ("x", "1g.5gb")
    assert view.below("second", ("ns", "a")).mig_profile is None  # type: ignore[union-attr]
    view.lay("first", {("ns", "a"): {"error": "y"}})  # what the second was laid on changed
    assert (view[("ns", "a")].error, view[("ns", "a")].mig_profile) == ("y", None)


# ---- the in-flight ledger ----------------------------------------------------------------------
def test_forget_drops_everything_about_a_pod_and_tells_the_listeners() -> None:
    told: list[Any] = []
    ledger = InFlight(on_forget=[told.append])
    key = ("ns", "p")
    ledger.assumed[key] = Placement("n1")
    ledger.mig[key] = MigAssumed("n1", MigHold("GPU-1", "1g.5gb", 0))
    ledger.evicting.add(key)
    ledger.bind_failed(key, Placement("n2"), "boom")
    ledger.forget(key)
    assert (ledger.assumed, ledger.mig, ledger.evicting, ledger.failures) == ({}, {}, set(), {})
    assert told == [key]


def test_seen_bound_keeps_a_claims_partition_until_its_allocation_shows_it() -> None:
    ledger = InFlight()
    hold = MigAssumed("n1", MigHold("GPU-1", "1g.5gb", 0))
    for keeps in (True, False):
        ledger.assumed[("ns", "p")], ledger.mig[("ns", "p")] = Placement("n1"), hold
        assert ledger.seen_bound(("ns", "p"), keeps_mig=keeps)
        assert (("ns", "p") in ledger.mig) is keeps
    assert not ledger.seen_bound(("ns", "other"), keeps_mig=False)


def test_a_failure_drops_the_placement_only_if_it_is_still_the_one_assumed() -> None:
    ledger = InFlight()
    old, new = Placement("n1"), Placement("n2")
    ledger.assumed[("ns", "p")] = new  # a newer decision replaced the failed one
    ledger.bind_failed(("ns", "p"), old, "boom")
    assert ledger.assumed[("ns", "p")] is new
    backoff = ledger.bind_failed(("ns", "p"), new, "boom")
    assert ("ns", "p") not in ledger.assumed and backoff.count == 2
    assert ledger.backing_off(("ns", "p"), time.monotonic())


# ---- the binder and its steps ------------------------------------------------------------------
def test_failed_binding_backs_off_and_reports_once_per_error() -> None:
    fake = FakeWriter("admission webhook denied the request: only tessera-scheduler may write")

    async def run() -> KubeScheduler:
        sched = scheduler(fake)
        p = pod()
        sched.caches.pods.items[p.key] = p
        place = Placement("n1", cpu_milli=100)
        for _ in range(5):
            sched.inflight.assumed[p.key] = place
            await sched.binder.bind(p.key, place, [])
            await asyncio.sleep(0)
        fake.error = "another error"
        sched.inflight.assumed[p.key] = place
        await sched.binder.bind(p.key, place, [])
        await asyncio.gather(*list(sched.background))
        return sched

    sched = asyncio.run(run())
    assert len(fake.binds) == 6
    assert [r for r, _ in fake.events] == ["FailedBinding", "FailedBinding"], fake.events
    assert "admission webhook denied" in fake.events[0][1] and "not repeated" in fake.events[0][1]
    failed = sched.inflight.failures[("ns", "p")]
    assert failed.error == "another error" and failed.count == 1
    assert failed.until > time.monotonic()
    assert ("ns", "p") not in sched.inflight.assumed


def test_back_off_grows_while_the_error_stays() -> None:
    async def run() -> list[float]:
        sched = scheduler(FakeWriter("denied"))
        p = pod()
        sched.caches.pods.items[p.key] = p
        waits: list[float] = []
        for _ in range(4):
            place = Placement("n1", cpu_milli=100)
            sched.inflight.assumed[p.key] = place
            t = time.monotonic()
            await sched.binder.bind(p.key, place, [])
            waits.append(sched.inflight.failures[p.key].until - t)
        await asyncio.gather(*list(sched.background))
        return waits

    waits = asyncio.run(run())
    assert waits == sorted(waits) and waits[-1] > 3 * waits[0]


class Recording(BindStep):
    def __init__(self, name: str, log: list[str], fail: bool = False,
                 abandon: bool = False) -> None:
        self.name, self.log, self.fail, self.abandon = name, log, fail, abandon

    async def pre_bind(self, ctx: BindContext) -> None:
        self.log.append(f"pre {self.name}")
        ctx.annotations[f"step/{self.name}"] = "yes"
        if self.abandon:
            raise Abandon
        if self.fail:
            raise RuntimeError(f"{self.name} failed")

    def rollback(self, ctx: BindContext) -> None:
        self.log.append(f"rollback {self.name}")


@pytest.mark.parametrize("fail_at, bound", [(None, True), ("b", False)])
def test_steps_run_in_order_and_those_that_ran_roll_back_in_reverse(
        fail_at: str | None, bound: bool) -> None:
    fake, log = FakeWriter(), []

    async def run() -> KubeScheduler:
        sched = scheduler(fake)
        steps: list[BindStep] = [Recording(n, log, fail=n == fail_at) for n in "abc"]
        sched.binder = Binder(sched.parts, steps)
        p = pod()
        sched.caches.pods.items[p.key] = p
        sched.inflight.assumed[p.key] = place = Placement("n1", cpu_milli=100)
        await sched.binder.bind(p.key, place, [])
        await asyncio.gather(*list(sched.background))
        return sched

    sched = asyncio.run(run())
    if bound:
        assert log == ["pre a", "pre b", "pre c"]
        assert fake.binds == [{"step/a": "yes", "step/b": "yes", "step/c": "yes"}]
        assert sched.binder.bound == 1 and fake.events[0][0] == "Scheduled"
    else:
        assert log == ["pre a", "pre b", "rollback b", "rollback a"]
        assert fake.binds == [] and ("ns", "p") in sched.inflight.failures


def test_a_step_that_finds_the_pod_gone_abandons_quietly() -> None:
    fake, log = FakeWriter(), []

    async def run() -> KubeScheduler:
        sched = scheduler(fake)
        sched.binder = Binder(sched.parts, [Recording("a", log, abandon=True)])
        p = pod()
        sched.caches.pods.items[p.key] = p
        sched.inflight.assumed[p.key] = place = Placement("n1", cpu_milli=100)
        await sched.binder.bind(p.key, place, [])
        return sched

    sched = asyncio.run(run())
    assert fake.binds == [] and fake.events == [] and log == ["pre a"]
    assert ("ns", "p") not in sched.inflight.assumed and not sched.inflight.failures


def test_a_mig_pod_without_a_chosen_partition_fails_with_the_reason() -> None:
    """The MIG partition step refuses to bind a pod whose partition was not chosen on the
    binding's node (the registered steps, as the scheduler runs them)."""
    fake = FakeWriter()

    async def run() -> KubeScheduler:
        sched = scheduler(fake)
        p = pod(mig_profile="1g.5gb", request=ResourceRequest(GpuRequest.none()))
        sched.caches.pods.items[p.key] = p
        sched.inflight.mig[p.key] = MigAssumed("elsewhere", MigHold("GPU-1", "1g.5gb", 0))
        sched.inflight.assumed[p.key] = place = Placement("n1")
        await sched.binder.bind(p.key, place, [])
        await asyncio.gather(*list(sched.background))
        return sched

    sched = asyncio.run(run())
    assert fake.binds == [] and fake.configmaps == []
    assert "no MIG partition was chosen" in sched.inflight.failures[("ns", "p")].error
    assert ("ns", "p") not in sched.inflight.mig  # dropped with the assumption


def test_a_mig_pod_gets_its_partition_in_its_configmap_and_annotation() -> None:
    fake = FakeWriter()
    hold = MigHold("GPU-1", "1g.5gb", 2)

    async def run() -> None:
        sched = scheduler(fake)
        p = pod(mig_profile="1g.5gb", request=ResourceRequest(GpuRequest.none()))
        sched.caches.pods.items[p.key] = p
        sched.inflight.mig[p.key] = MigAssumed("n1", hold)
        sched.inflight.assumed[p.key] = place = Placement("n1")
        await sched.binder.bind(p.key, place, [])

    asyncio.run(run())
    assert fake.configmaps == [{"TESSERA_MIG_PROFILE": "1g.5gb", "TESSERA_MIG_GPU": "GPU-1",
                                "TESSERA_NODE": "n1"}]
    (annotations,) = fake.binds
    assert annotations["tessera.io/mig-partition"] == hold.to_json()
    assert annotations["tessera.io/gpu-configmap"] == "p-tessera-gpu"


# ---- the hooks ---------------------------------------------------------------------------------
def test_the_claims_hook_derives_a_wait_and_retries_once_the_claim_appears() -> None:
    """A pod whose claim is not there waits with the reason (the cache keeps the pod as
    parsed); once the claim is there, the next cycle derives the claim's request."""
    sched = scheduler(FakeWriter())
    p = dataclasses.replace(pod(request=ResourceRequest(GpuRequest.none())),
                            claim_names=("c",), created=time.time() - 60)
    sched.caches.pods.items[p.key] = p
    sched.derive()
    seen = sched.pods[p.key]
    assert seen.request is None and "resourceclaim" in (seen.error or "").lower(), seen.error
    assert sched.caches.pods.items[p.key] is p and p.error is None
    sched.caches.resource_claims.items[("ns", "c")] = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "share.gpu.tessera.io",
            "capacity": {"requests": {"memory": "5Gi"}}}}]}}}
    sched.derive()
    seen = sched.pods[p.key]
    assert seen.error is None and seen.request is not None
    assert seen.request.gpu == GpuRequest.of_memory(5 * 2**30)


def test_the_mig_hook_forgets_a_waiting_share_with_its_pod() -> None:
    sched = scheduler(FakeWriter())
    sched.mig.serving[("ns", "p")] = GpuRequest.of_memory(2**30)
    sched.inflight.forget(("ns", "p"))
    assert sched.mig.serving == {}


def test_stale_gang_clock_starts_when_below_and_resets_when_whole() -> None:
    """tessera.kube.stale_gangs: a gang is due only after ``grace`` seconds below its minimum
    in a row; back at its minimum (or gone) the clock is dropped."""
    from tessera.kube.objects import PodGroupInfo
    from tessera.kube.stale_gangs import StaleGangs, below_minimum

    def member(name: str, node: str | None) -> PodInfo:
        return PodInfo("ns", name, name, node, "Running" if node else "Pending", False, 0.0,
                       None, {}, {}, None, group="g")

    groups = {("ns", "g"): PodGroupInfo("ns", "g", 3, None, None)}
    half = [member("a", "n1"), member("b", None), member("c", None)]
    whole = [member("a", "n1"), member("b", "n1"), member("c", "n2")]
    below = below_minimum(half, groups, lambda p: bool(p.node))
    assert list(below) == [("ns", "g")] and below[("ns", "g")][:2] == (1, 3)
    assert below_minimum(whole, groups, lambda p: bool(p.node)) == {}
    assert below_minimum([member("b", None)], groups, lambda p: bool(p.node)) == {}
    stale = StaleGangs(grace=10)
    assert stale.due(below, now=100) == []
    assert stale.due(below, now=109) == []
    assert stale.due({}, now=110) == []           # whole again: the clock is dropped
    assert stale.due(below, now=111) == []        # below again: a new grace starts
    due = stale.due(below, now=121.5)
    assert [(k, n, m, [p.name for p in bound]) for k, n, m, bound in due] == [
        (("ns", "g"), 1, 3, ["a"])]
    assert StaleGangs(grace=0).due(below, now=1e9) == []


async def test_gang_barrier_releases_all_or_aborts_all() -> None:
    import asyncio

    from tessera.kube.bind.gang import GangAborted, GangBarrier

    ok = GangBarrier("g", 2)
    await asyncio.gather(ok.arrive(), ok.arrive())
    assert ok.passed
    bad = GangBarrier("g", 3)
    first = asyncio.create_task(bad.arrive())
    await asyncio.sleep(0)
    bad.fail("member x failed")
    with pytest.raises(GangAborted, match="member x failed"):
        await first
    with pytest.raises(GangAborted):
        await bad.arrive()
    assert not bad.passed
    ok.fail("too late")  # past the barrier: no effect
    assert ok.passed


def test_a_cycle_waits_for_a_binding_backlog_to_drain_but_never_long() -> None:
    """kube/pacing.py: with more bindings in flight than 4 per write slot the next cycle waits
    until they drain, and no longer than its bound when they do not."""
    from tessera.kube.pacing import wait_for_backlog

    async def go() -> tuple[float, float, float]:
        backlog = dict.fromkeys(range(10))
        quick = await wait_for_backlog(backlog, slots=4)  # 10 <= 16: no wait

        async def drain() -> None:
            await asyncio.sleep(0.3)
            backlog.clear()
        backlog.update(dict.fromkeys(range(100)))
        drained, _ = await asyncio.gather(wait_for_backlog(backlog, slots=4, wait=5.0), drain())
        backlog.update(dict.fromkeys(range(100)))
        capped = await wait_for_backlog(backlog, slots=4, wait=0.4)
        return quick, drained, capped
    quick, drained, capped = asyncio.run(go())
    assert quick < 0.05
    assert 0.3 <= drained < 2.0
    assert 0.4 <= capped < 2.0


def test_the_scheduler_process_raises_the_collector_thresholds() -> None:
    """kube/gc_tuning.py, called by the process's main before the loop starts: CPython's
    defaults made full collections most of a cycle at 16,000 pods."""
    import gc

    from tessera.kube import gc_tuning, scheduler_main

    before = gc.get_threshold()
    try:
        assert gc_tuning.tune() == before
        assert gc.get_threshold() == gc_tuning.THRESHOLDS == (50_000, 20, 100)
    finally:
        gc.set_threshold(*before)
    assert "gc_tuning.tune()" in __import__("inspect").getsource(scheduler_main.main)
