"""Embedded mode's translation to the core's types, and the core's cycle run over it."""

from __future__ import annotations

from decimal import Decimal

from tessera.core.model import GpuDevice, GpuRequest, Node
from tessera.core.requests import estimate_gpus, gpu_request_to_dict
from tessera.core.state import Placement
from tessera.core.units import GiB
from tessera.local import store
from tessera.local.scheduling import LocalCycle, core_workload, pod_placement, refused

NODE = Node("n", tuple(GpuDevice(f"GPU-{i}", i, 16 * GiB, "V100-16GB") for i in range(2)))


def project(name: str, deserved: float, limit: float | None = None) -> store.Project:
    return store.Project(1, name, deserved, limit, 1.0, 50, 0.0)


def stored(wid: str, project: str, gpu: GpuRequest, *, phase: str = "Pending", seq: int = 1,
           workers: int = 1, preemptible: bool = True, priority_class: str = "train",
           priority: int = 50) -> store.Workload:
    return store.Workload(
        seq, wid, wid, 1, project, "Training", phase, "", {}, gpu_request_to_dict(gpu),
        preemptible, priority_class, priority, workers, workers, 0.0, 0.0, "", "", None,
        float(seq), 10.0 if phase != "Pending" else None, None)


def half(device: int) -> Placement:
    return Placement("n", (device,), (8 * GiB,), (8 * GiB,))


def test_a_stored_workload_becomes_the_cores_workload() -> None:
    w = stored("w", "a", GpuRequest.fraction("0.5"), phase="Running", workers=2)
    core = core_workload(w, [half(0)], now=100.0)
    # One pod of two runs: a fixed-size workload (no --min-workers below --workers) cannot
    # resize, so the cycle sees a gang of the one pod that runs (never given its second pod,
    # never shrunk).
    assert core.pods[0].gpu == GpuRequest.fraction(Decimal("0.5")) and len(core.pods) == 1
    assert core.placements == (half(0),) and core.gang_min == 1
    assert core.started_at == 10.0 and core.preemptible and core.name == "w"
    pending = core_workload(stored("p", "a", GpuRequest.whole(1)), None, now=100.0)
    assert pending.placements == () and pending.started_at is None


def test_a_running_elastic_workload_keeps_its_minimum_and_may_grow_into_its_free_slots() -> None:
    w = stored("e", "a", GpuRequest.fraction("0.5"), phase="Running", workers=4)
    w.min_workers = 2
    core = core_workload(w, [half(0), half(1), half(0)], now=100.0, free=1)
    assert len(core.pods) == 4 and core.placements == (half(0), half(1), half(0), None)
    assert core.gang_min == 2  # shrink may take the third, never the first two
    # While it may not resize (a pod starting or stopping): a gang of the pods that run.
    fixed = core_workload(w, [half(0), half(1), half(0)], now=100.0)
    assert len(fixed.pods) == 3 and fixed.gang_min == 3


def test_a_stopping_workload_is_not_a_victim_again() -> None:
    w = stored("w", "a", GpuRequest.fraction("0.5"), phase="Stopping")
    assert core_workload(w, [half(0)], now=1.0).preemptible is False


def test_a_stored_pod_record_gives_its_placement() -> None:
    pod = {"node": "n", "devices": [1], "requestBytes": [5], "limitBytes": [7], "exclusive": False}
    assert pod_placement(pod) == Placement("n", (1,), (5,), (7,), False)


def test_the_cycle_packs_fractions_and_reclaims_for_a_project_within_its_quota() -> None:
    cycle = LocalCycle("binpack")
    pending = [core_workload(stored("f5", "a", GpuRequest.fraction("0.5"), seq=1), None, 1.0),
               core_workload(stored("f3", "a", GpuRequest.fraction("0.3"), seq=2), None, 1.0)]
    plan = cycle.run([NODE], [project("a", 2.0)], pending, 1.0)
    devices = {b.workload_id: b.pods[0].placement.devices for b in plan.bindings}
    assert devices["f5"] == devices["f3"]
    # b runs over quota on both GPUs; a (deserved 1) gets one back by reclaim.
    running = [core_workload(stored(f"b{i}", "b", GpuRequest.whole(1), phase="Running", seq=i),
                             [Placement("n", (i,), (16 * GiB,), (16 * GiB,), True)], 100.0)
               for i in range(2)]
    want = core_workload(stored("a1", "a", GpuRequest.whole(1), seq=5), None, 100.0)
    plan = cycle.run([NODE], [project("a", 1.0), project("b", 0.0)], [*running, want], 100.0)
    assert [e.workload_id for e in plan.evictions] in (["b0"], ["b1"])
    assert plan.bindings[0].workload_id == "a1" and plan.bindings[0].after_evictions


def test_a_project_at_its_limit_waits_and_says_so() -> None:
    w = core_workload(stored("w", "a", GpuRequest.whole(2)), None, 1.0)
    plan = LocalCycle().run([NODE], [project("a", 1.0, limit=1.0)], [w], 1.0)
    assert not plan.bindings and "limit" in plan.waiting[0].reason


def test_a_refused_state_tells_every_pending_workload() -> None:
    w = core_workload(stored("w", "a", GpuRequest.whole(1)), None, 1.0)
    assert [x.reason for x in refused([w], "bad").waiting] == ["bad"]


def test_estimate_counts_shares_of_the_largest_allowed_device() -> None:
    assert estimate_gpus(GpuRequest.whole(2), [NODE]) == 2
    assert estimate_gpus(GpuRequest.of_memory(8 * GiB), [NODE], workers=3) == 1.5
