"""Department quotas at placement time (tessera.core.departments): random departments shaped as
the API allows them (their projects' deserved sum within the department's, each project's limit
within the department's), projects under them and at the top, and workloads arriving over
several cycles. Whatever the cycles decide: a department's projects together never hold more
than its limit, non-preemptible workloads of a department stay within its deserved, and a
workload held back by a limit is told whose (its project's or its department's, by name)."""

from __future__ import annotations

import re
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cycle import CycleConfig, Project, Quota, Snapshot, Workload, run_cycle
from tessera.core.departments import Department, with_departments
from tessera.core.model import GpuDevice, GpuRequest, Node, ResourceRequest
from tessera.core.units import GiB
from tests.core.cycle.plan_helpers import apply, gpus

EPS = 1e-6


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Node], list[Project], list[Department], dict[str, str],
                                     list[list[Workload]]]:
    nodes = [Node(f"n{k}", tuple(GpuDevice(f"g{k}-{i}", i, 16 * GiB, "V100")
                                 for i in range(draw(st.integers(1, 4)))),
                  cpu_milli=64_000, memory=256 * GiB) for k in range(draw(st.integers(1, 3)))]
    departments: list[Department] = []
    projects: list[Project] = []
    membership: dict[str, str] = {}
    for d in range(draw(st.integers(1, 3))):
        deserved = float(draw(st.integers(0, 4)))
        limit = draw(st.one_of(st.none(), st.integers(0, 3).map(lambda x, dd=deserved: dd + x)))
        departments.append(Department(f"d{d}", Quota(deserved, limit,
                                                     draw(st.sampled_from([0.0, 1.0, 3.0])))))
        left = deserved
        for i in range(draw(st.integers(1, 3))):
            pd = float(draw(st.integers(0, int(left))))
            left -= pd
            if limit is None:  # the API: a project's limit is within its department's
                plimit = draw(st.one_of(st.none(), st.sampled_from([pd, pd + 1])))
            else:
                plimit = draw(st.sampled_from([pd, float(limit)]))
            name = f"d{d}p{i}"
            projects.append(Project(name, Quota(pd, plimit, draw(st.sampled_from([0.0, 1.0]))),
                                    priority=draw(st.sampled_from([50, 100]))))
            membership[name] = f"d{d}"
    for i in range(draw(st.integers(0, 2))):
        projects.append(Project(f"top{i}", Quota(float(draw(st.integers(0, 2))), None, 1.0)))
    leaves = [p.name for p in projects]
    waves = []
    n = 0
    for _ in range(draw(st.integers(1, 3))):
        wave = []
        for _ in range(draw(st.integers(1, 8))):
            g = draw(st.sampled_from(["1", "1", "2", "0.5", "0.25"]))
            req = GpuRequest.whole(int(g)) if g in ("1", "2") else GpuRequest.fraction(Decimal(g))
            wave.append(Workload(f"w{n}", draw(st.sampled_from(leaves)), (ResourceRequest(req),),
                                 priority_class=draw(st.sampled_from(["train", "train", "build"])),
                                 created_at=float(n)))
            n += 1
        waves.append(wave)
    return nodes, projects, departments, membership, waves


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_department_quotas_hold_at_placement(world: tuple) -> None:  # type: ignore[type-arg]
    nodes, projects, departments, membership, waves = world
    tree = with_departments(projects, departments, membership)
    dept = {d.name: d for d in departments}
    running: dict[str, Workload] = {}
    pending: list[Workload] = []
    now = 100.0
    for wave in waves:
        pending += wave
        snap = Snapshot(tuple(nodes), tree, (*running.values(), *pending), now)
        plan = run_cycle(snap, CycleConfig())
        state = apply(snap, plan)
        for wid in plan.evicted:
            w = running.pop(wid)
            pending.append(Workload(w.id, w.project, w.pods, w.priority_class,
                                    created_at=w.created_at))
        by_id = {w.id: w for w in pending}
        for b in plan.bindings:
            w = by_id[b.workload_id]
            placements = [None] * len(w.pods)
            for pb in b.pods:
                placements[pb.pod] = pb.placement  # type: ignore[call-overload]
            running[w.id] = Workload(w.id, w.project, w.pods, w.priority_class,
                                     created_at=w.created_at, started_at=now,
                                     placements=tuple(placements))
        pending = [w for w in pending if w.id not in running]
        held: dict[str, float] = {}
        held_np: dict[str, float] = {}
        for w in running.values():
            d = membership.get(w.project)
            if d is None:
                continue
            amount = sum(gpus(state, p) for p in w.placements if p is not None)
            held[d] = held.get(d, 0.0) + amount
            if not w.cls.preemptible:
                held_np[d] = held_np.get(d, 0.0) + amount
        for d, amount in held.items():
            assert amount <= dept[d].gpu.limit_amount + EPS, (d, amount, dept[d])
        for d, amount in held_np.items():
            assert amount <= dept[d].gpu.deserved_amount + EPS, (d, amount, dept[d])
        for wait in plan.waiting:
            m = re.match(r"(project|department) (\S+) is at its limit", wait.reason)
            if wait.kind == "limit":
                assert m, wait
                level, name = m.groups()
                assert (level, name) in (("project", wait.project),
                                         ("department", membership.get(wait.project))), wait
        now += 10.0


def test_the_department_limit_is_what_holds_a_workload_back() -> None:
    """Two projects without limits of their own in a department limited to 2 GPUs, on 4 free
    GPUs: the third whole-GPU workload waits, naming the department; without the department
    in the tree it would run."""
    nodes = (Node("n", tuple(GpuDevice(f"g{i}", i, 16 * GiB, "V100") for i in range(4)),
                  cpu_milli=64_000, memory=256 * GiB),)
    projects = [Project("a", Quota(1.0)), Project("b", Quota(1.0))]
    ml = Department("ml", Quota(2.0, 2.0, 1.0))
    one = (ResourceRequest(GpuRequest.whole(1)),)
    workloads = tuple(Workload(f"w{i}", "ab"[i % 2], one, created_at=float(i)) for i in range(3))
    plan = run_cycle(Snapshot(nodes, with_departments(projects, [ml], {"a": "ml", "b": "ml"}),
                              workloads, 10.0), CycleConfig())
    assert len(plan.bindings) == 2
    [wait] = plan.waiting
    assert wait.kind == "limit" and wait.reason.startswith("department ml is at its limit of 2 GPU")
    free = run_cycle(Snapshot(nodes, tuple(projects), workloads, 10.0), CycleConfig())
    assert len(free.bindings) == 3
