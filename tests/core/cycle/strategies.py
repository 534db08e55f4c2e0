"""Hypothesis strategies for random small clusters, project trees and workloads (the cycle's
property tests share them)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tessera.bench.cycle import place_all
from tessera.core.cycle import CycleConfig, Project, Quota, Snapshot, Workload
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.placement import Placer
from tessera.core.state import ClusterState
from tessera.core.units import GiB

CLASSES = ("train", "train", "build", "inference", "build-preemptible")


def gpu_request(draw: st.DrawFn) -> ResourceRequest:
    kind = draw(st.sampled_from(["whole", "whole", "portion", "portion", "multi", "memory", "dynamic"]))
    if kind == "whole":
        g = GpuRequest.whole(draw(st.integers(1, 2)))
    elif kind == "portion":
        g = GpuRequest.fraction(draw(st.sampled_from(["0.25", "0.5", "0.75", "0.3"])))
    elif kind == "multi":
        g = GpuRequest.fraction(Decimal("0.5"), devices=2)
    elif kind == "memory":
        g = GpuRequest.of_memory(draw(st.sampled_from([4, 8, 12])) * GiB)
    else:
        g = GpuRequest.fraction(Decimal("0.25"), limit=Decimal("1"))
    return ResourceRequest(g, cpu_milli=draw(st.sampled_from([0, 1000, 4000])))


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, CycleConfig]:
    node_list = []
    for k in range(draw(st.integers(1, 3))):
        size = draw(st.sampled_from([16, 32])) * GiB
        gpus = tuple(GpuDevice(f"g{k}-{i}", i, size, "V100") for i in range(draw(st.integers(1, 4))))
        node_list.append(Node(f"n{k}", gpus, cpu_milli=16_000, memory=64 * GiB))
    count = draw(st.integers(1, 4))
    nested = count >= 3 and draw(st.booleans())
    projects = []
    for i in range(count):
        deserved = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
        limit = draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 3.0]).map(lambda x, d=deserved: d + x)))
        projects.append(
            Project(
                f"p{i}",
                Quota(deserved, limit, draw(st.sampled_from([0.0, 1.0, 2.0]))),
                priority=draw(st.sampled_from([100, 200])),
                parent="dept" if nested and i < 2 else None,
            )
        )
    if nested:
        projects.append(Project("dept", Quota(draw(st.sampled_from([0.0, 1.0, 2.0])))))
    leaves = [p.name for p in projects if p.name != "dept"]
    state = ClusterState(node_list)
    placer = Placer(state, policy=draw(st.sampled_from(["binpack", "spread"])))
    workloads: list[Workload] = []
    for i in range(draw(st.integers(0, 14))):
        req = gpu_request(draw)
        pods = draw(st.integers(1, 2))
        placements = place_all(placer, state, f"r{i}", req, pods)
        if placements is None:
            continue
        workloads.append(
            Workload(
                f"r{i}",
                draw(st.sampled_from(leaves)),
                (req,) * pods,
                priority_class=draw(st.sampled_from(CLASSES)),
                started_at=float(draw(st.integers(0, 1000))),
                placements=tuple(placements),
            )
        )
    for i in range(draw(st.integers(0, 6))):
        pods = draw(st.integers(1, 3))
        workloads.append(
            Workload(
                f"q{i}",
                draw(st.sampled_from(leaves)),
                (gpu_request(draw),) * pods,
                priority_class=draw(st.sampled_from(CLASSES)),
                min_members=draw(st.integers(1, pods)),
                created_at=float(draw(st.integers(0, 100))),
            )
        )
    config = CycleConfig(
        preempt_min_runtime=draw(st.sampled_from([0.0, 300.0])),
        reclaim_min_runtime=draw(st.sampled_from([0.0, 300.0])),
    )
    return Snapshot(tuple(node_list), tuple(projects), tuple(workloads), now=1000.0), config


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
