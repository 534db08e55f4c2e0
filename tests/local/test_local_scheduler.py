"""The interim quota scheduler on its own: snapshot in, decisions out."""

from __future__ import annotations

from decimal import Decimal

from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.units import GiB
from tessera.local.scheduler import ProjectView, QuotaScheduler, Snapshot, WorkloadView

NODE = Node("n", tuple(GpuDevice(f"GPU-{i}", i, 16 * GiB, "V100-16GB") for i in range(2)))


def wl(wid: str, project: str, gpu: GpuRequest, seq: int, preemptible: bool = True,
       workers: int = 1, min_workers: int | None = None) -> WorkloadView:
    return WorkloadView(wid, wid, project, ResourceRequest(gpu), workers=workers,
                        min_workers=workers if min_workers is None else min_workers,
                        preemptible=preemptible, seq=seq)


def run(pending: list[WorkloadView], running: list[WorkloadView] | None = None,
        projects: dict[str, ProjectView] | None = None):  # type: ignore[no-untyped-def]
    projects = projects or {"a": ProjectView("a", 2.0)}
    return QuotaScheduler().decide(Snapshot((NODE,), projects, running or [], pending))


def test_fractions_pack_on_one_gpu() -> None:
    d = run([wl("f5", "a", GpuRequest.fraction("0.5"), 1),
             wl("f3", "a", GpuRequest.fraction("0.3"), 2)])
    devices = {b.workload_id: b.placements[0].devices for b in d.bindings}
    assert devices["f5"] == devices["f3"]


def test_limit_blocks_and_says_so() -> None:
    d = run([wl("w", "a", GpuRequest.whole(2), 1)],
            projects={"a": ProjectView("a", 1.0, limit=1.0)})
    assert not d.bindings and "limit" in d.waiting["w"]


def test_non_preemptible_waits_over_quota_preemptible_runs() -> None:
    projects = {"a": ProjectView("a", 0.5)}
    d = run([wl("build", "a", GpuRequest.fraction("0.75"), 1, preemptible=False),
             wl("train", "a", GpuRequest.fraction("0.75"), 2)], projects=projects)
    assert [b.workload_id for b in d.bindings] == ["train"]
    assert "deserved quota" in d.waiting["build"]


def test_reclaim_evicts_over_quota_workload_of_another_project() -> None:
    projects = {"a": ProjectView("a", 0.0), "b": ProjectView("b", 2.0)}
    first = run([wl("borrow", "a", GpuRequest.whole(2), 1)], projects=projects)
    placed = first.bindings[0].placements
    running = [WorkloadView("borrow", "borrow", "a", ResourceRequest(GpuRequest.whole(2)),
                            seq=1, placements=placed)]
    d = run([wl("own", "b", GpuRequest.whole(1), 2, preemptible=False)], running, projects)
    assert [e.workload_id for e in d.evictions] == ["borrow"]
    assert [b.workload_id for b in d.bindings] == ["own"]
    assert "reclaimed" in d.evictions[0].reason


def test_no_reclaim_below_the_victims_deserved_quota() -> None:
    projects = {"a": ProjectView("a", 2.0), "b": ProjectView("b", 2.0)}
    placed = run([wl("mine", "a", GpuRequest.whole(2), 1)], projects=projects).bindings[0]
    running = [WorkloadView("mine", "mine", "a", ResourceRequest(GpuRequest.whole(2)), seq=1,
                            placements=placed.placements)]
    d = run([wl("other", "b", GpuRequest.whole(1), 2)], running, projects)
    assert not d.evictions and not d.bindings and "idle" in d.waiting["other"]


def test_gang_all_or_min_workers() -> None:
    d = run([wl("gang", "a", GpuRequest.fraction(Decimal("0.75")), 1, workers=3)])
    assert not d.bindings and "gang of 3" in d.waiting["gang"]
    d = run([wl("elastic", "a", GpuRequest.fraction(Decimal("0.75")), 1, workers=3,
                min_workers=2)])
    assert len(d.bindings[0].placements) == 2
