"""Reclaim and preemption make MIG room (tessera.core.cycle.mig_room): a pending MIG pod that
fits on no MIG GPU gets the slot of running MIG workloads the rules let it evict."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.constraints import PlacedPods
from tessera.core.cycle import Plan, Snapshot, Workload, run_cycle
from tessera.core.cycle.types import CycleConfig
from tessera.core.mig import PROFILES, MigGpu, Partition, choose, free_placements, released
from tessera.core.model import GpuRequest, Node, ResourceRequest
from tessera.core.state import Placement

from .scenario import nodes, project

GPU = "GPU-mig-0"


@dataclass(frozen=True)
class Room:
    """What an adapter gives a MIG pod: the nodes with room for its profile now."""

    names: frozenset[str] = frozenset()
    dynamic: bool = False

    def allows(self, node: Node) -> bool:
        return node.name in self.names

    def score(self, node: Node) -> float:
        return 0.0

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return True

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        n = sum(1 for x in nodes if x.name not in self.names)
        return f"{n} no room for the MIG profile" if n else ""

    def without_room(self) -> None:
        return None


def _fraction(profile: str) -> float:
    return next(t[profile].fraction for t in PROFILES.values() if profile in t)


def _req(profile: str, cpu: int = 0) -> ResourceRequest:
    return ResourceRequest(GpuRequest.none(), cpu_milli=cpu, gpus=_fraction(profile),
                           mig=profile)


def running(id: str, project: str, profile: str, cls: str = "train", **kw: object) -> Workload:
    r = _req(profile)
    return Workload(id, project, (r,), priority_class=cls, started_at=0.0,
                    placements=(Placement("n1", cpu_milli=r.cpu_milli, gpus=r.gpus),), **kw)  # type: ignore[arg-type]


def pending(id: str, project: str, profile: str, cls: str = "train", room: frozenset[str] = frozenset(),
            cpu: int = 0) -> Workload:
    return Workload(id, project, (_req(profile, cpu),), priority_class=cls, created_at=1.0,
                    constraints=(Room(room),))


def mig(*parts: tuple[str, int, str]) -> dict[str, tuple[MigGpu, ...]]:
    """n1's one A100-40GB in MIG mode: (profile, start, holder); holder "" idle, "?" not ours."""
    return {"n1": (MigGpu(GPU, "A100-40GB", tuple(
        Partition(p, s, h != "", f"MIG-{s}", "" if h == "?" else h) for p, s, h in parts)),)}


def run(projects: list[object], workloads: list[Workload], layout: dict[str, tuple[MigGpu, ...]],
        **config: object) -> Plan:
    snap = Snapshot(tuple(nodes(2, gpus=1)), tuple(projects), tuple(workloads), 1000.0, layout)  # type: ignore[arg-type]
    return run_cycle(snap, CycleConfig(**config))  # type: ignore[arg-type]


def test_a_project_below_deserved_reclaims_one_slot_from_one_over_quota() -> None:
    plan = run([project("a", 0), project("b", 1)],
               [running("a1", "a", "3g.20gb"), running("a2", "a", "3g.20gb"),
                pending("b1", "b", "3g.20gb")],
               mig(("3g.20gb", 0, "a1"), ("3g.20gb", 4, "a2")))
    assert [(e.workload_id, e.action) for e in plan.evictions] == [("a1", "reclaim")]
    b = plan.binding("b1")
    assert b is not None and b.action == "reclaim" and b.after_evictions == ("a1",)
    [pb] = b.pods
    assert pb.placement.node == "n1" and pb.placement.gpus == 0.429
    # the victim's partition, now idle, is reused as it is
    assert pb.mig is not None and pb.mig.gpu == GPU and pb.mig.reuse is not None
    assert pb.mig.reuse.uuid == "MIG-0" and "MIG 3g.20gb on GPU-mig-0" in b.message


def test_reclaim_keeps_a_victim_project_at_what_it_must_keep() -> None:
    # a is within its deserved quota: b (deserved 0) takes nothing, and says why it waits.
    plan = run([project("a", 1), project("b", 0)],
               [running("a1", "a", "3g.20gb"), running("a2", "a", "3g.20gb"),
                pending("b1", "b", "3g.20gb")],
               mig(("3g.20gb", 0, "a1"), ("3g.20gb", 4, "a2")))
    assert plan.evictions == () and plan.bindings == ()
    why = plan.waiting_for("b1")
    assert why is not None and "no room for the MIG profile" in why.reason


def test_two_victims_only_when_one_is_not_enough_and_lower_priority_first() -> None:
    layout = mig(("3g.20gb", 0, "a1"), ("3g.20gb", 4, "a2"))
    plan = run([project("a", 0), project("b", 2)],
               [running("a1", "a", "3g.20gb"), running("a2", "a", "3g.20gb"),
                pending("b1", "b", "7g.40gb")], layout)
    assert {e.workload_id for e in plan.evictions} == {"a1", "a2"}
    b = plan.binding("b1")
    assert b is not None and set(b.after_evictions) == {"a1", "a2"}
    assert b.pods[0].mig is not None and b.pods[0].mig.start == 0 and len(b.pods[0].mig.destroy) == 2
    # A full GPU: any one of four frees room for a 1g.5gb. The lowest priority goes (a1 or
    # a2 at 50, not a3 or a4 at 75), and of those the one giving back the least GPU (a2).
    layout = mig(("3g.20gb", 0, "a1"), ("1g.5gb", 4, "a2"), ("1g.5gb", 5, "a3"), ("2g.10gb", 6, "a4"))
    plan = run([project("a", 0), project("b", 2)],
               [running("a1", "a", "3g.20gb"), running("a2", "a", "1g.5gb"),
                running("a3", "a", "1g.5gb", cls="build-preemptible"),
                running("a4", "a", "2g.10gb", cls="build-preemptible"),
                pending("b1", "b", "1g.5gb")], layout)
    assert {e.workload_id for e in plan.evictions} == {"a2"}
    b = plan.binding("b1")
    assert b is not None and b.pods[0].mig is not None and b.pods[0].mig.start == 4


def test_preemption_within_a_project_by_priority() -> None:
    layout = mig(("3g.20gb", 0, "lo"), ("3g.20gb", 4, "mid"))
    plan = run([project("a", 1)],
               [running("lo", "a", "3g.20gb"), running("mid", "a", "3g.20gb", cls="build-preemptible"),
                pending("hi", "a", "3g.20gb", cls="build-preemptible")], layout)
    assert [(e.workload_id, e.action) for e in plan.evictions] == [("lo", "preempt")]
    b = plan.binding("hi")
    assert b is not None and b.action == "preempt" and b.after_evictions == ("lo",)
    # Equal priority preempts nobody.
    plan = run([project("a", 1)],
               [running("lo", "a", "3g.20gb"), running("mid", "a", "3g.20gb"),
                pending("hi", "a", "3g.20gb")], layout)
    assert plan.evictions == () and plan.bindings == ()


def test_nothing_is_evicted_when_no_eviction_makes_room() -> None:
    # Someone else's partition (an operator's) blocks a 7g.40gb for good; a profile the GPU
    # lacks has no room at all; a node without the pod's CPU is not a place either.
    layout = mig(("3g.20gb", 0, "a1"), ("3g.20gb", 4, "?"))
    ws = [running("a1", "a", "3g.20gb"), pending("b1", "b", "7g.40gb")]
    plan = run([project("a", 0), project("b", 2)], ws, layout)
    assert plan.evictions == () and plan.bindings == ()
    plan = run([project("a", 0), project("b", 2)],
               [running("a1", "a", "7g.40gb"), pending("b1", "b", "3g.40gb")],
               mig(("7g.40gb", 0, "a1")))
    assert plan.evictions == ()
    why = plan.waiting_for("b1")
    assert why is not None and why.kind == "unschedulable"
    plan = run([project("a", 0), project("b", 2)],
               [running("a1", "a", "7g.40gb"), pending("b1", "b", "1g.5gb", cpu=10**6)],
               mig(("7g.40gb", 0, "a1")))
    assert plan.evictions == () and plan.bindings == ()


def test_allocate_records_the_partition_and_a_second_pod_sees_the_first() -> None:
    layout = mig(("3g.20gb", 0, ""))
    plan = run([project("a", 2)],
               [pending("p1", "a", "3g.20gb", room=frozenset({"n1"})),
                pending("p2", "a", "3g.20gb", room=frozenset({"n1"}))], layout)
    chosen = {b.workload_id: b.pods[0].mig for b in plan.bindings}
    assert chosen["p1"] is not None and chosen["p1"].reuse is not None  # the idle one
    assert chosen["p2"] is not None and chosen["p2"].start == 4 and chosen["p2"].reuse is None


def test_a_quota_victim_whose_slot_is_taken_stays_evicted() -> None:
    # Preemption evicts for the project's limit first ("q", lowest priority): its slot is then
    # free and reused, so no room victim is needed, "r" stays, and "q" is not put back (its
    # partition went to "hi").
    layout = mig(("3g.20gb", 0, "q"), ("3g.20gb", 4, "r"))
    plan = run([project("a", 0.5, limit=0.9)],
               [running("q", "a", "3g.20gb"), running("r", "a", "3g.20gb", cls="build-preemptible"),
                pending("hi", "a", "3g.20gb", cls="build-preemptible")], layout)
    assert [e.workload_id for e in plan.evictions] == ["q"]
    b = plan.binding("hi")
    assert b is not None and b.after_evictions == ("q",)
    assert b.pods[0].mig is not None and b.pods[0].mig.start == 0 and b.pods[0].mig.reuse is not None


def test_two_pods_never_take_the_same_room_in_one_cycle() -> None:
    # The adapter saw room on n1 for both (one free 3g.20gb slot): the cycle binds one only.
    layout = mig(("3g.20gb", 0, "a0"))
    plan = run([project("a", 2)],
               [running("a0", "a", "3g.20gb"),
                pending("p1", "a", "3g.20gb", room=frozenset({"n1"})),
                pending("p2", "a", "3g.20gb", room=frozenset({"n1"}))], layout)
    assert [b.workload_id for b in plan.bindings] == ["p1"]
    assert plan.binding("p1").pods[0].mig.start == 4  # type: ignore[union-attr]
    assert plan.waiting_for("p2") is not None


# -- a property over random clusters ------------------------------------------------------------

_PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[list[object], list[Workload], dict[str, tuple[MigGpu, ...]], str]:
    projects = [project(p, draw(st.sampled_from([0, 0.5, 1, 2, 4]))) for p in ("a", "b", "c")]
    layout: dict[str, tuple[MigGpu, ...]] = {}
    workloads: list[Workload] = []
    n = 0
    for node in ("n1", "n2"):
        gpus = []
        for g in range(draw(st.integers(1, 2))):
            gpu = MigGpu(f"{node}-{g}", "A100-40GB")
            for _ in range(draw(st.integers(2, 10))):  # mostly full GPUs: room must be made
                profile = draw(st.sampled_from(_PROFILES))
                starts = free_placements("A100-40GB", gpu.partitions, PROFILES["A100-40GB"][profile])
                if not starts:
                    continue
                n += 1
                wid = f"w{n}"
                kind = draw(st.sampled_from(["run"] * 8 + ["idle", "foreign"]))
                holder = wid if kind == "run" else ""
                part = Partition(profile, draw(st.sampled_from(starts)), kind != "idle", f"MIG-{n}", holder)
                gpu = MigGpu(gpu.key, gpu.model, (*gpu.partitions, part))
                if kind == "run":
                    r = _req(profile)
                    workloads.append(Workload(
                        wid, draw(st.sampled_from(["a", "b", "c"])), (r,),
                        priority_class=draw(st.sampled_from(["train", "build-preemptible"])),
                        started_at=0.0, placements=(Placement(node, gpus=r.gpus),)))
            gpus.append(gpu)
        layout[node] = tuple(gpus)
    profile = draw(st.sampled_from(_PROFILES))
    room = frozenset(n for n, gs in layout.items() if choose(list(gs), profile) is not None)
    me = draw(st.sampled_from(["a", "b", "c"]))
    cls = draw(st.sampled_from(["train", "build-preemptible", "inference"]))
    workloads.append(pending("new", me, profile, cls=cls, room=room))
    return projects, workloads, layout, profile


@settings(max_examples=300, deadline=None)
@given(_clusters())
def test_evictions_for_mig_room_keep_the_rules_and_make_room(
        cluster: tuple[list[object], list[Workload], dict[str, tuple[MigGpu, ...]], str]) -> None:
    projects, workloads, layout, profile = cluster
    plan = run(projects, workloads, layout)
    specs = {w.id: w for w in workloads}
    new = specs["new"]
    b = plan.binding("new")
    for e in plan.evictions:
        v = specs[e.workload_id]
        assert e.for_workload == "new" and b is not None and e.workload_id in b.after_evictions
        assert v.running and v.is_preemptible
        if e.action == "reclaim":
            assert v.project != new.project
            st_ = plan.projects[v.project]
            deserved = next(p for p in projects if p.name == v.project).gpu.deserved  # type: ignore[attr-defined]
            assert st_.allocated_after[0] >= min(st_.fair_share[0], deserved) - 1e-6
        else:
            assert e.action == "preempt" and v.project == new.project
            assert v.priority_value < new.priority_value
    if b is None:
        return
    [pb] = b.pods
    assert pb.mig is not None
    node = pb.placement.node
    gone = set(b.after_evictions)
    gpu = next(g for g in layout[node] if g.key == pb.mig.gpu)
    freed = released(gpu, gone)
    # What the cycle chose is what choose() does on that GPU once the victims' partitions are
    # idle (or, with no victims there, on the node as it was).
    assert choose([freed], profile) == pb.mig or not gone
    if b.action == "reclaim":  # every reclaim victim is needed for the room
        on_gpu = {p.holder for p in gpu.partitions if p.holder in gone}
        assert on_gpu == gone
        for v in gone:
            assert choose([released(gpu, gone - {v})], profile) is None
