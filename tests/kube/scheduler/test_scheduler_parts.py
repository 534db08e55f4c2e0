"""Pure parts of tessera.kube (no cluster): pod request parsing, placement annotations,
snapshot building from cached objects."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, Node
from tessera.core.projects import Project, Quota
from tessera.core.state import Placement
from tessera.kube import names
from tessera.kube.objects import (
    NodeInfo,
    PodGroupInfo,
    PodInfo,
    ProjectInfo,
    placement_from_json,
    placement_to_json,
)
from tessera.kube.podspec import ContainerResources, pod_request, pod_request_from_dict
from tessera.kube.snapshot import SnapshotBuilder

T = TypeVar("T")


def _c(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> ContainerResources:
    return ContainerResources("main", requests or {}, limits or {})


def test_portion_memory_devices_and_whole_spellings() -> None:
    r = pod_request({names.GPU_PORTION: "0.5", names.GPU_PORTION_LIMIT: "0.8"}, [_c()])
    assert r.gpu.kind is GpuKind.PORTION and r.gpu.portion == Decimal("0.5")
    assert r.gpu.portion_limit == Decimal("0.8")
    r = pod_request({names.GPU_MEMORY: "2Gi", names.GPU_DEVICES: "4"}, [_c()])
    assert r.gpu.kind is GpuKind.MEMORY and r.gpu.memory == 2 * 2**30 and r.gpu.devices == 4
    r = pod_request({names.GPU_MEMORY: "5G"}, [_c()])
    assert r.gpu.memory == 5 * 10**9
    r = pod_request({}, [_c(limits={names.GPU_RESOURCE: "2", "cpu": "500m", "memory": "1Gi"})])
    assert r.gpu.kind is GpuKind.WHOLE and r.gpu.devices == 2
    assert (r.cpu_milli, r.memory) == (500, 2**30)
    assert pod_request({}, [_c()]).gpu.kind is GpuKind.NONE


@pytest.mark.parametrize(
    ("annotations", "limits", "field"),
    [
        ({names.GPU_PORTION: "1.5"}, {}, names.GPU_PORTION),
        ({names.GPU_PORTION: "0.5"}, {names.GPU_RESOURCE: "1"}, names.GPU_PORTION),
        ({names.GPU_MEMORY: "lots"}, {}, names.GPU_MEMORY),
        ({names.GPU_DEVICES: "2"}, {}, names.GPU_DEVICES),
        ({names.GPU_PORTION: "0.5", names.GPU_MEMORY: "5G"}, {}, names.GPU_MEMORY),
        ({names.GPU_PORTION: "0.5", names.GPU_PORTION_LIMIT: "0.4"}, {}, names.GPU_PORTION_LIMIT),
        ({}, {names.GPU_RESOURCE: "0.5"}, f"containers[main].resources.limits.{names.GPU_RESOURCE}"),
    ],
)
def test_bad_requests_name_the_annotation(
    annotations: dict[str, str], limits: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        pod_request(annotations, [_c(limits=limits)])
    assert err.value.field == field


def test_pod_request_from_admission_dict() -> None:
    pod = {"metadata": {"annotations": {names.GPU_PORTION: "0.25"}},
           "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "2"}}}],
                    "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]}}
    r = pod_request_from_dict(pod)
    assert r.gpu.portion == Decimal("0.25") and r.cpu_milli == 4000


def test_placement_annotation_round_trip() -> None:
    p = Placement("n1", (3, 5), (100, 200), (150, 250), False, 500, 1024)
    assert placement_from_json(placement_to_json(p)) == p


def _pod(name: str, ns: str = "team-a", node: str | None = None, placement: Placement | None = None,
         group: str | None = None, portion: str = "0.5") -> PodInfo:
    annotations = {names.GPU_PORTION: portion}
    info = PodInfo(ns, name, f"uid-{name}", node, "Running" if node else "Pending", False, 1.0,
                   None, annotations, {}, None, group=group)
    info.request = pod_request(annotations, [_c()])
    info.placement = placement
    return info


def _world() -> tuple[dict[str, NodeInfo], dict[str, ProjectInfo]]:
    from tessera.core.model import GpuDevice

    node = Node("n1", tuple(GpuDevice(f"g{i}", i, 80 * 2**30, "H100-80GB") for i in range(2)),
                96000, 2**40)
    nodes = {"n1": NodeInfo("n1", node)}
    projects = {"team-a": ProjectInfo("team-a", Project("team-a", Quota(2)), "team-a")}
    return nodes, projects


def test_snapshot_groups_explains_and_reuses_unchanged_workloads() -> None:
    nodes, projects = _world()
    running = _pod("r", node="n1", placement=Placement("n1", (0,), (40 * 2**30,), (40 * 2**30,)))
    pods = {
        p.key: p for p in (
            running,
            _pod("lone"),
            _pod("g0", group="gang"), _pod("g1", group="gang"),
            _pod("orphan-group", group="nope"),
            _pod("stray", ns="nobody"),
        )
    }
    groups = {("team-a", "gang"): PodGroupInfo("team-a", "gang", 2, None, None)}
    builder = SnapshotBuilder()
    snap, ctx = builder.build(nodes, pods, projects, groups, {}, set(), 10.0)
    ids = {w.id: w for w in snap.workloads}
    assert set(ids) == {"team-a/pod/r", "team-a/pod/lone", "team-a/gang"}
    assert ids["team-a/gang"].min_members == 2 and len(ids["team-a/gang"].pods) == 2
    assert ids["team-a/pod/r"].placements[0] == running.placement
    assert "PodGroup team-a/nope" in ctx.waits[("team-a", "orphan-group")]
    assert "namespace nobody belongs to no tessera Project" in ctx.waits[("nobody", "stray")]
    # Nothing changed: the same Workload objects come back; an assumption rebuilds only its own.
    snap2, _ = builder.build(nodes, pods, projects, groups, {}, set(), 11.0)
    again = {w.id: w for w in snap2.workloads}
    assert all(again[k] is ids[k] for k in ids)
    assumed = {("team-a", "lone"): Placement("n1", (1,), (40 * 2**30,), (40 * 2**30,))}
    snap3, _ = builder.build(nodes, pods, projects, groups, assumed, set(), 12.0)
    third = {w.id: w for w in snap3.workloads}
    assert third["team-a/pod/lone"] is not ids["team-a/pod/lone"]
    assert third["team-a/pod/lone"].placements[0] == assumed[("team-a", "lone")]
    assert third["team-a/gang"] is ids["team-a/gang"]


def test_snapshot_leaves_out_evicting_pods_and_reports_pods_on_deleted_nodes() -> None:
    nodes, projects = _world()
    gone = _pod("gone", node="n9", placement=Placement("n9", (0,), (1,), (1,)))
    victim = _pod("victim", node="n1", placement=Placement("n1", (0,), (2**30,), (2**30,)))
    pods = {gone.key: gone, victim.key: victim}
    snap, ctx = SnapshotBuilder().build(nodes, pods, projects, {}, {}, {victim.key}, 1.0)
    assert snap.workloads == ()
    assert ctx.orphans == [gone]


def test_small_gang_waits_for_its_members() -> None:
    nodes, projects = _world()
    pods = {p.key: p for p in (_pod("g0", group="gang"),)}
    groups = {("team-a", "gang"): PodGroupInfo("team-a", "gang", 3, None, None)}
    snap, ctx = SnapshotBuilder().build(nodes, pods, projects, groups, {}, set(), 1.0)
    assert snap.workloads == ()
    assert "needs 3 pods" in ctx.waits[("team-a", "g0")]


def test_cordoned_or_not_ready_nodes_get_nothing_new() -> None:
    from tessera.core.cycle import CycleConfig, run_cycle
    from tessera.core.model import GpuDevice

    def node(name: str) -> Node:
        return Node(name, tuple(GpuDevice(f"{name}-g{i}", i, 80 * 2**30, "H100-80GB")
                                for i in range(2)), 96000, 2**40)

    _, projects = _world()
    running = _pod("r", node="a", placement=Placement("a", (0,), (40 * 2**30,), (40 * 2**30,)))
    pods = {p.key: p for p in (running, _pod("p1"), _pod("p2"), _pod("p3", portion="0.9"))}
    for closed in (NodeInfo("a", node("a"), unschedulable=True), NodeInfo("a", node("a"), ready=False)):
        nodes = {"a": closed, "b": NodeInfo("b", node("b"))}
        snap, ctx = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 5.0)
        plan = run_cycle(snap, CycleConfig(actions=("allocate", "reclaim", "preempt", "backfill")))
        placed = {pb.placement.node for b in plan.bindings for pb in b.pods}
        assert placed == {"b"}, plan.bindings
        assert not plan.evictions
        # Node b holds two GPUs: 0.5 + 0.5 on one, 0.9 on the other; nothing else fits there.
        assert len(plan.bindings) == 3
        assert ("team-a", "r") not in ctx.waits
    nodes = {"a": NodeInfo("a", node("a")), "b": NodeInfo("b", node("b"))}
    snap, _ = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 5.0)
    assert all(w.project != "tessera.io/unschedulable-nodes" for w in snap.workloads)


def test_gpus_of_other_schedulers_pods_are_kept_free() -> None:
    from tessera.core.cycle import CycleConfig, run_cycle
    from tessera.core.model import GpuDevice

    node = Node("a", tuple(GpuDevice(f"g{i}", i, 80 * 2**30, "H100-80GB") for i in range(2)),
                96000, 2**40)
    nodes = {"a": NodeInfo("a", node)}
    _, projects = _world()
    whole = PodInfo("team-a", "w", "u", None, "Pending", False, 1.0, None, {}, {}, None)
    whole.request = pod_request({}, [_c(limits={names.GPU_RESOURCE: "2"})])
    pods = {whole.key: whole}
    snap, _ = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 1.0, {"a": (1, 0, 0)})
    plan = run_cycle(snap, CycleConfig(actions=("allocate",)))
    assert not plan.bindings, "one of the two GPUs is held by another scheduler's pod"
    snap, _ = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 1.0, {})
    assert run_cycle(snap, CycleConfig(actions=("allocate",))).bindings


def _at_recycled_address(old_id: int, make: Callable[[], T]) -> T:
    """A new object from ``make``, at ``old_id``'s address when the allocator hands it out again
    (CPython usually does at once), so a cache keyed by ``id()`` would take it for the old one."""
    held = []
    for _ in range(1000):
        obj = make()
        if id(obj) == old_id:
            return obj
        held.append(obj)
    return make()


def test_snapshot_reuse_is_not_fooled_by_a_recycled_object() -> None:
    """A replaced PodGroup, Project or assumed placement rebuilds its workloads even when the new
    object sits where the old one was (the cache keys by version and value, not by ``id()``)."""
    nodes, projects = _world()
    pods = {p.key: p for p in (_pod("g0", group="gang"), _pod("g1", group="gang"), _pod("lone"))}
    groups = {("team-a", "gang"): PodGroupInfo("team-a", "gang", 2, None, None)}
    assumed = {("team-a", "lone"): Placement("n1", (0,), (40 * 2**30,), (40 * 2**30,))}
    builder = SnapshotBuilder()
    snap, _ = builder.build(nodes, pods, projects, groups, assumed, set(), 1.0)
    assert {w.id: w.min_members for w in snap.workloads}["team-a/gang"] == 2

    old = id(groups[("team-a", "gang")])
    del groups[("team-a", "gang")]
    groups[("team-a", "gang")] = _at_recycled_address(
        old, lambda: PodGroupInfo("team-a", "gang", 3, None, None))
    old = id(assumed[("team-a", "lone")])
    del assumed[("team-a", "lone")]
    assumed[("team-a", "lone")] = _at_recycled_address(
        old, lambda: Placement("n1", (1,), (40 * 2**30,), (40 * 2**30,)))
    snap, ctx = builder.build(nodes, pods, projects, groups, assumed, set(), 2.0)
    by_id = {w.id: w for w in snap.workloads}
    assert "team-a/gang" not in by_id and "needs 3 pods" in ctx.waits[("team-a", "g0")]
    assert by_id["team-a/pod/lone"].placements[0].devices == (1,)

    old = id(projects["team-a"])
    del projects["team-a"]
    projects["team-a"] = _at_recycled_address(
        old, lambda: ProjectInfo("team-a", Project("team-a", Quota(2), priority=7), "team-a"))
    snap, _ = builder.build(nodes, pods, projects, groups, assumed, set(), 3.0)
    assert {p.name: p.priority for p in snap.projects}["team-a"] == 7


def test_reservations_track_uuids_tenants_and_what_is_missing() -> None:
    import asyncio

    from tessera.kube.reservations import Reservations

    async def scenario() -> None:
        res = Reservations(None, uuid_timeout=1.0)  # type: ignore[arg-type]  # no writes here
        holder = _pod("tessera-res-n1-0", ns="tessera-system", node="n1")
        holder.reservation = ("n1", 0)
        assert res.seen(None, holder) is False
        assert res.missing("n1", [0, 1]) == [1]
        # A binding waiting for the UUID gets it when the pod reports it.
        waiter = asyncio.create_task(res.reserve("n1", 0))
        await asyncio.sleep(0.01)
        assert res.busy(("n1", 0)) and res.waiting() == 1
        assert res.missing("n1", [0]) == []
        with_uuid = _pod("tessera-res-n1-0", ns="tessera-system", node="n1")
        with_uuid.reservation, with_uuid.gpu_uuid = ("n1", 0), "GPU-abc"
        res.seen(holder, with_uuid)
        assert await waiter == "GPU-abc" and res.waiting() == 0 and not res.busy(("n1", 0))
        assert res.seen(with_uuid, None) is True and res.missing("n1", [0]) == [0]

    asyncio.run(scenario())
    shared = Placement("n1", (1,), (2**30,), (2**30,))
    bound = _pod("a", node="n1", placement=shared)
    assumed = {("team-a", "b"): Placement("n2", (0,), (2**30,), (2**30,))}
    whole = _pod("c", node="n1", placement=Placement("n1", (2,), (2**30,), (2**30,), True))
    assert Reservations.tenants([bound, whole], assumed) == {("n1", 1), ("n2", 0)}


def test_conflict_search_skips_workloads_without_pods() -> None:
    """When the core refuses a snapshot, the scheduler looks for the conflicting pods; the fence
    workload that keeps pods off unschedulable nodes has no pods, and the search raised
    KeyError('tessera.io/unschedulable-nodes'), which stopped the scheduler (seen in a full run
    after a gang member's recorded placement conflicted)."""
    from tessera.core.cycle import Snapshot, Workload
    from tessera.core.model import GpuDevice, GpuRequest, ResourceRequest
    from tessera.kube.snapshot import FENCE_PROJECT, FENCE_WORKLOAD, Context, find_conflicts

    node = Node("n1", (GpuDevice("GPU-n1-0", 0, 16 * 2**30, "V100M16"),), cpu_milli=64_000,
                memory=512 * 2**30)
    fence = Workload(id=FENCE_WORKLOAD, project=FENCE_PROJECT,
                     pods=(ResourceRequest(GpuRequest.none()),),
                     placements=(Placement("n1", (), (), ()),), started_at=0.0)
    snap = Snapshot((node,), (Project(FENCE_PROJECT),), (fence,), 0.0)
    assert find_conflicts(snap, Context(), {}) == []


def test_a_collision_is_acted_on_only_once_it_has_lasted() -> None:
    """A swap of two pods' whole GPUs being written by tessera-node collides for a moment; only a
    collision that lasts the grace period leads to an eviction, and one that ended starts over."""
    from tessera.kube.conflicts import LastingConflicts

    def pod(name: str) -> PodInfo:
        return PodInfo("ns", name, name, "n1", "Running", False, 0.0, 0.0, {}, {}, None)

    now = [100.0]
    lasting = LastingConflicts(grace=15.0, clock=lambda: now[0])
    a, b = pod("a"), pod("b")
    assert lasting.lasting([a]) == []
    now[0] = 110.0
    assert lasting.lasting([a, b]) == []
    now[0] = 115.0
    assert lasting.lasting([a, b]) == [a]
    now[0] = 116.0
    assert lasting.lasting([b]) == []  # a's collision ended: forgotten
    now[0] = 125.0
    assert lasting.lasting([a, b]) == [b]


def test_gang_anchors_reach_the_core_and_a_gang_waits_while_its_anchor_pod_does_not_exist() -> None:
    """The webhook's tessera.io/gang-anchor pods become the core's Workload.anchors (named, for
    the reason); with tessera.io/gang-anchors saying the gang has one and no such pod yet, its
    pending pods wait, saying so, and those running go on (core/cycle/anchors.py,
    docs/workloads.md)."""
    nodes, projects = _world()
    groups = {("team-a", "rc"): PodGroupInfo("team-a", "rc", 2, None, None)}
    workers = [_pod(f"rc-worker-{i}", group="rc") for i in range(3)]
    for w in workers:
        w.annotations[names.GANG_ANCHORS] = "1"
    pods = {p.key: p for p in workers}
    snap, ctx = SnapshotBuilder().build(nodes, pods, projects, groups, {}, set(), 1.0)
    assert snap.workloads == ()
    assert ctx.waits[("team-a", "rc-worker-0")] == (
        "gang rc waits for its anchor pod(s) to exist: 1 expected (tessera.io/gang-anchors), "
        "0 exist (tessera.io/gang-anchor)")
    # One worker runs (its head's pod was deleted): it stays, the others wait for the head.
    running = _pod("rc-worker-9", group="rc", node="n1",
                   placement=Placement("n1", (0,), (40 * 2**30,), (40 * 2**30,)))
    running.annotations[names.GANG_ANCHORS] = "1"
    snap, ctx = SnapshotBuilder().build(nodes, {**pods, running.key: running}, projects, groups, {},
                                        set(), 1.5)
    (w,) = snap.workloads
    assert len(w.pods) == 1 and w.placements[0] == running.placement and w.min_members == 1
    assert "waits for its anchor pod(s) to exist" in ctx.waits[("team-a", "rc-worker-1")]
    head = _pod("rc-head-x", group="rc")
    head.annotations.update({names.GANG_ANCHOR: "true", names.GANG_ANCHORS: "1"})
    head.created = 5.0  # the newest: still first, as an anchor
    pods[head.key] = head
    snap, ctx = SnapshotBuilder().build(nodes, pods, projects, groups, {}, set(), 2.0)
    (w,) = snap.workloads
    assert w.anchors == (0,) and w.pod_names[0] == "rc-head-x" and len(w.pod_names) == 4


def _full_pod_body() -> dict[str, Any]:
    """A pod that states every field ``pod_info`` reads."""
    placement = placement_to_json(Placement("n1", (0,), cpu_milli=500, memory=2**30))
    term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team", "uid": "u-1", "labels": {"app": "x"},
                     "annotations": {names.GPU_PORTION: "0.5", names.PLACEMENT: placement},
                     "creationTimestamp": "2026-11-28T10:00:00Z",
                     "deletionTimestamp": "2026-11-28T11:00:00Z",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": "rs", "uid": "r", "controller": True}]},
        "spec": {
            "nodeName": "n1", "schedulerName": names.SCHEDULER_NAME, "priorityClassName": "build",
            "nodeSelector": {"disktype": "ssd"}, "overhead": {"cpu": "100m"},
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "gpus", "operator": "Gt", "values": ["3"]}]}]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {
                        "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}}]},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
            "tolerations": [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}],
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                           "whenUnsatisfiable": "DoNotSchedule",
                                           "labelSelector": {"matchLabels": {"app": "x"}}}],
            "containers": [{"name": "main", "image": "i",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                          "limits": {"memory": "1Gi"}},
                            "ports": [{"containerPort": 80, "hostPort": 8080}]}],
            "initContainers": [{"name": "init", "image": "i",
                                "resources": {"requests": {"cpu": "1"}}}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
                        {"name": "tmp", "emptyDir": {}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"phase": "Running", "startTime": "2026-11-28T10:00:05Z",
                   "conditions": [{"type": "PodScheduled", "status": "False", "message": "m"}],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-1"}]},
    }
    return body


def test_pods_read_through_the_lean_watch_parse_as_lightkubes_models_do() -> None:
    """The pods informer decodes events with msgspec into ``LeanPod`` instead of building
    lightkube models; ``pod_info`` must read the same from both, for every field it reads
    (requests and limits, placement and MIG annotations, node, phase, deletion, owner,
    conditions, claims, and the scheduling spec: selector, affinity, tolerations, spread,
    host ports, PVC volumes, overhead)."""
    import json
    from dataclasses import replace

    from lightkube.resources.core_v1 import Pod

    from tessera.kube.lean_watch import decode_pod
    from tessera.kube.objects import pod_info

    body = _full_pod_body()
    lean = pod_info(decode_pod(json.dumps(body).encode()))
    model = pod_info(Pod.from_dict(json.loads(json.dumps(body))))
    assert lean == replace(model, version=lean.version)  # version: a counter per parse
    assert lean.sched is not None and lean.sched_error is None and lean.error is None
    assert lean.placement is not None and lean.claim_names == ("p-gpu-1",)
    assert (lean.deleting, lean.owner, lean.scheduled_message) == (True, "ReplicaSet", "m")
    bare = {"metadata": {"name": "q", "namespace": "team"}, "spec": {"containers": [
        {"name": "main", "image": "i"}]}}
    got = pod_info(decode_pod(json.dumps(bare).encode()))
    assert got == replace(pod_info(Pod.from_dict(dict(bare))), version=got.version)


class _Reads:
    """A lightkube object that records each attribute path read through it
    (``spec.containers[].resources.requests``; ``x.to_dict()`` for a part taken whole)."""

    def __init__(self, obj: Any, path: str, seen: set[str]) -> None:
        self._obj, self._path, self._seen = obj, path, seen

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        if name == "to_dict":
            self._seen.add(f"{self._path}.to_dict()")
            return value
        path = f"{self._path}.{name}" if self._path else name
        self._seen.add(path)
        return _reads(value, path, self._seen)


def _reads(value: Any, path: str, seen: set[str]) -> Any:
    if hasattr(value, "to_dict"):  # a lightkube model
        return _Reads(value, path, seen)
    if isinstance(value, list):
        return [_reads(v, f"{path}[]", seen) for v in value]
    return value


def _lean_has(path: str) -> bool:
    """Whether ``LeanPod`` decodes what ``path`` reads: a field of its Structs, or anything
    inside a part it keeps whole as JSON (``JsonDict``)."""
    import typing

    import msgspec

    from tessera.kube.lean_watch import JsonDict, LeanPod

    def bare(t: Any) -> Any:
        while True:  # Optional[X] -> X, list[X] -> X
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if typing.get_origin(t) in (list, typing.Union) or type(t).__name__ == "UnionType":
                t = args[0]
            else:
                return t

    t: Any = LeanPod
    for part in path.replace("[]", "").split("."):
        t = bare(t)
        if t is JsonDict or (isinstance(t, type) and issubclass(t, JsonDict)):
            return True
        if part == "to_dict()" or not (isinstance(t, type) and issubclass(t, msgspec.Struct)):
            return False
        fields = {f.name: f.type for f in msgspec.structs.fields(t)}
        if part not in fields:
            return False
        t = fields[part]
    return True


def test_every_field_pod_info_reads_is_decoded_by_the_lean_pod() -> None:
    """The pods watches decode only ``LeanPod``'s fields (msgspec skips the rest): a field
    ``pod_info`` or ``foreign_pod`` reads that ``LeanPod`` lacks would raise in the informer.
    ``pod_info`` runs over a lightkube Pod stating every field, recording each path it reads;
    each must be a field of ``LeanPod`` or inside a part it keeps whole."""
    import json

    from lightkube.resources.core_v1 import Pod

    from tessera.kube.lean_watch import decode_pod
    from tessera.kube.objects import foreign_pod, pod_info

    seen: set[str] = set()
    reservation = {"metadata": {"name": "r", "namespace": "team", "labels": {
        names.RESERVATION_LABEL: "true", names.RESERVATION_DEVICE: "0"}}, "spec": {
        "nodeName": "n1", "containers": [{"name": "main", "image": "i"}]}}
    for body in (_full_pod_body(), reservation):
        pod_info(_Reads(Pod.from_dict(body), "", seen))  # type: ignore[arg-type]
    # Other schedulers' bound pods are watched the same way (kube.caches.foreign_pods).
    foreign_pod(_Reads(Pod.from_dict(_full_pod_body()), "", seen))
    full = json.dumps(_full_pod_body()).encode()
    assert foreign_pod(decode_pod(full)) == foreign_pod(Pod.from_dict(json.loads(full)))
    assert foreign_pod(decode_pod(full)) is not None
    assert {"spec.containers[].resources.requests", "spec.affinity.to_dict()",
            "metadata.ownerReferences[].controller"} <= seen  # it does record
    assert [p for p in sorted(seen) if not _lean_has(p)] == []
    assert not _lean_has("spec.runtimeClassName") and not _lean_has("spec.containers[].image")
