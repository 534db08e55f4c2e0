"""From the caches to the core's Snapshot: pods grouped into workloads, projects, nodes.

Pure: reads what the informers hold and what this scheduler has assumed (placements decided
but not yet seen bound), returns the snapshot plus what the adapter needs to apply the plan
(which pod is index i of which workload) and why each left-out pod cannot be considered.
Over 400 lines because it is one pass from the informers' caches to the Snapshot (grouping,
the cache by version, what other schedulers hold, conflicts); its parts share that pass.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.core.constraints import NodeConstraint
from tessera.core.cycle import ProjectTree, Snapshot, Workload, validate_workload
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.projects import Project, Quota
from tessera.core.state import ClusterState, Placement
from tessera.core.workloads import PRIORITY_CLASSES
from tessera.kube import names
from tessera.kube.mig import MigView
from tessera.kube.objects import (
    ForeignPod,
    NodeInfo,
    PodGroupInfo,
    PodInfo,
    PodKey,
    ProjectInfo,
    priority_class_of,
)
from tessera.kube.podgrouper import anchor_pods_missing, anchors_of, inferred_group, member_order
from tessera.kube.predicates.cluster import ClusterView, NodeFacts, OtherPod
from tessera.kube.predicates.constraint import KubeConstraint, constraint_for
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.predicates.topology import Domain, TopologyRequest, choose_domain
from tessera.kube.snapshot_facts import NodeFactsCache

log = logging.getLogger(__name__)

RECREATED_BY = frozenset({"ReplicaSet", "StatefulSet", "Job"})
"""Controllers that recreate an evicted pod: only their pods are moved by consolidation."""

FENCE_PROJECT = "tessera.io/unschedulable-nodes"
FENCE_WORKLOAD = "tessera.io/unschedulable-nodes"


@dataclass
class Context:
    """What the adapter needs besides the plan."""

    pods_of: dict[str, list[PodKey]] = field(default_factory=dict)
    """Workload id -> pod keys, in the order of ``Workload.pods``."""
    waits: dict[PodKey, str] = field(default_factory=dict)
    """Pending pods left out of the snapshot, and why (shown on the pod)."""
    orphans: list[PodInfo] = field(default_factory=list)
    """Pods bound to a node that no longer exists."""
    conflicts: list[PodInfo] = field(default_factory=list)
    """Bound pods whose recorded placement collides with another (never expected)."""
    project_errors: dict[str, str] = field(default_factory=dict)
    tree: ProjectTree | None = None
    agents_not_ready: dict[str, str] = field(default_factory=dict)
    """GPU nodes whose tessera-node is not ready (closed like NotReady nodes) -> why."""


def agents_not_ready_text(not_ready: Mapping[str, str]) -> str:
    """The part of a pending GPU pod's reason that says which nodes tessera-node keeps closed."""
    first = sorted(not_ready)[0]
    more = f" and {len(not_ready) - 1} more" if len(not_ready) > 1 else ""
    return (f"{len(not_ready)} GPU node(s) not ready for GPU shares: {first} "
            f"(tessera-node: {not_ready[first]}){more}")


def _tree(projects: Mapping[str, ProjectInfo], ctx: Context) -> ProjectTree:
    good: dict[str, Project] = {}
    for name, pi in projects.items():
        if pi.project is None:
            ctx.project_errors[name] = pi.error or "invalid"
        else:
            good[name] = pi.project
    for _ in range(len(good) + 1):
        try:
            return ProjectTree(good.values())
        except InvalidRequest as exc:
            bad = next((n for n in good if exc.field.startswith(f"projects.{n}.")
                        or exc.field == f"projects.{n}"), None)
            if bad is None:
                bad = next(iter(good))
            ctx.project_errors[bad] = str(exc)
            del good[bad]
    return ProjectTree(())


class SnapshotBuilder:
    """Builds snapshots, reusing the Workload of a group whose pods, assumptions, PodGroup and
    projects are unchanged since the last cycle (most of them, in a busy cluster), so a cycle
    costs what changed rather than what exists.

    "Unchanged" is decided by explicit versions (``PodInfo.version``, ``ProjectInfo.version``,
    ``PodGroupInfo.version``: one counter, a fresh number per object read) and by the assumed
    placements' values, never by ``id()``, which a new object can inherit from a collected one."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str, str], tuple[tuple[Any, ...], Workload | None,
                                                     list[PodKey], dict[PodKey, str]]] = {}
        self._projects_sig: tuple[Any, ...] | None = None
        self.view = ClusterView()
        """What the Kubernetes predicates read while the cycle runs (see tessera.kube.predicates)."""
        self._others: dict[PodKey, tuple[tuple[Any, ...], OtherPod]] = {}
        """The predicates' view of each snapshot pod, kept while the pod and its place are."""
        self._facts = NodeFactsCache()
        self._constraints: dict[tuple[Any, ...], KubeConstraint] = {}

    def build(
        self,
        nodes: Mapping[str, NodeInfo],
        pods: Mapping[PodKey, PodInfo],
        projects: Mapping[str, ProjectInfo],
        pod_groups: Mapping[PodKey, PodGroupInfo],
        assumed: Mapping[PodKey, Placement],
        evicting: set[PodKey],
        now: float,
        foreign: Mapping[str, tuple[int, int, int]] | None = None,
        foreign_pods: Iterable[ForeignPod | None] = (),
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        claims: Mapping[PodKey, str] | None = None,
        unmovable: Collection[PodKey] = frozenset(),
        mig: MigView | None = None,
    ) -> tuple[Snapshot, Context]:
        """``foreign``: node -> (whole GPUs, CPU millicores, memory bytes) that pods of other
        schedulers hold there; ``foreign_pods``: those pods (labels, affinity, ports) for the
        predicates; ``namespaces``: namespace -> labels; ``claims``: PersistentVolumeClaim
        (namespace, name) -> phase; ``unmovable``: pods consolidation must not move now (an
        eviction of theirs was refused, e.g. by a PodDisruptionBudget); ``mig``: the MIG GPUs,
        for pods asking for a MIG profile (tessera.kube.mig)."""
        claims = claims or {}
        ctx = Context()
        core_nodes: list[Node] = [ni.node for ni in nodes.values() if ni.node is not None]
        node_names = {n.name for n in core_nodes}
        projects_sig = tuple((n, pi.version) for n, pi in sorted(projects.items()))
        if projects_sig != self._projects_sig:
            self._memo.clear()
            self._projects_sig = projects_sig
        tree = _tree(projects, ctx)
        ctx.tree = tree
        owner: dict[str, str] = {}
        for name, pi in projects.items():
            if pi.namespace and name in tree and tree.is_leaf(name):
                owner.setdefault(pi.namespace, name)

        groups: dict[tuple[str, str, str], list[PodInfo]] = {}
        for pod in pods.values():
            if pod.reservation is not None or pod.finished or pod.key in evicting:
                continue
            if pod.node and pod.node not in node_names:
                if pod.node not in nodes:
                    ctx.orphans.append(pod)
                continue
            if pod.node and pod.placement is None:
                log.warning("pod %s/%s: %s; left out of the snapshot", pod.namespace, pod.name,
                            pod.placement_error)
                continue
            if pod.request is None:
                if not pod.node:
                    ctx.waits[pod.key] = f"invalid GPU request: {pod.error}"
                continue
            if pod.sched_error is not None and not pod.node:
                ctx.waits[pod.key] = f"invalid scheduling constraint: {pod.sched_error}"
                continue
            g = pod.group
            gkey = ("g", pod.namespace, g) if g else ("p", pod.namespace, pod.name)
            groups.setdefault(gkey, []).append(pod)

        workloads: list[Workload] = []
        memo: dict[tuple[str, str, str], tuple[tuple[Any, ...], Workload | None,
                                               list[PodKey], dict[PodKey, str]]] = {}
        for gkey, members in groups.items():
            pg = pod_groups.get((gkey[1], gkey[2])) if gkey[0] == "g" else None
            sig = (None if pg is None else pg.version, owner.get(gkey[1]),
                   tuple((p.version, assumed.get(p.key)) for p in members),
                   _claims_sig(members, claims), tuple(p.key in unmovable for p in members))
            cached = self._memo.get(gkey)
            if cached is None or cached[0] != sig:
                members.sort(key=member_order)
                w, keys, waits = _workload(gkey, members, pg, owner, assumed, ctx, tree, now, claims,
                                           unmovable)
                cached = (sig, w, keys, waits)
            memo[gkey] = cached
            _, w, keys, waits = cached
            ctx.waits.update(waits)
            if w is not None:
                ctx.pods_of[w.id] = keys
                workloads.append(w)
        self._memo = memo
        projects_out = list(tree.projects.values())
        ctx.agents_not_ready = {n: ni.agent_reason for n, ni in nodes.items()
                                if ni.node is not None and not ni.agent_ready}
        workloads = self._constrain(workloads, ctx, pods, nodes, foreign_pods, namespaces or {},
                                    mig or MigView())
        closed: set[str] = set()  # closed nodes are refused by the predicates (taints, cordon)
        held = {n: f for n, f in (foreign or {}).items() if n in node_names and any(f)}
        if closed or held:
            fence = _fence(core_nodes, closed, held, workloads, now)
            if fence is not None:
                workloads.append(fence)
                projects_out.append(Project(FENCE_PROJECT, gpu=Quota(deserved=-1), priority=10**6))
        view = mig or MigView()
        workload_of = {f"{k[0]}/{k[1]}": wid for wid, keys in ctx.pods_of.items() for k in keys}
        layout = {n: gpus for n, gpus in view.for_cycle(workload_of).items() if n in node_names}
        snapshot = Snapshot(tuple(core_nodes), tuple(projects_out), tuple(workloads), now, layout)
        return snapshot, ctx


    def _constrain(self, workloads: list[Workload], ctx: Context, pods: Mapping[PodKey, PodInfo],
                   nodes: Mapping[str, NodeInfo], foreign_pods: Iterable[ForeignPod | None],
                   namespaces: Mapping[str, Mapping[str, str]], mig: MigView) -> list[Workload]:
        """Refresh the predicates' view and give every pending pod that needs one its
        constraint (tessera.kube.predicates)."""
        facts = self._facts.facts(nodes)
        others: list[OtherPod] = []
        known = self._others
        fresh: dict[PodKey, tuple[tuple[Any, ...], OtherPod]] = {}
        for w in workloads:
            for i, key in enumerate(ctx.pods_of[w.id]):
                p = pods[key]
                pl = w.placement_of(i)
                start = None if pl is None else pl.node
                sig = (p.version, w.id, i, start)
                got = known.get(key)
                if got is None or got[0] != sig:
                    sp = p.sched
                    got = (sig, OtherPod(p.namespace, p.labels, sp, ref=(w.id, i), start_node=start,
                                         resources=dict(sp.resources) if sp else {},
                                         ports=sp.host_ports if sp else ()))
                fresh[key] = got
                others.append(got[1])
        self._others = fresh
        others += foreign_others(foreign_pods, facts)
        view = self.view
        view.reset(facts, namespaces, others)
        any_closed = any(f.closed for f in facts.values())
        any_anti = bool(view.anti_holders())
        kept = self._constraints  # kept across cycles, and their static answers with them
        cache: dict[tuple[Any, ...], KubeConstraint] = {}
        used: dict[str, dict[int, tuple[int, bool]]] | None = None
        out = []
        for w in workloads:
            if w.placements and None not in w.placements:
                out.append(w)
                continue
            keys = ctx.pods_of[w.id]
            domain = None
            want = next((pods[k].topology for k in keys if pods[k].topology is not None), None)
            if want is not None:
                if used is None:
                    used = _devices_used(workloads)
                domain = self._domain(want, w, keys, pods, nodes, used)
            cs: list[NodeConstraint | None] = []
            for key in keys:
                p = pods[key]
                assert p.request is not None
                gpu = p.request.gpu.kind is not GpuKind.NONE or p.mig_profile is not None
                sp = p.sched
                symmetric = any_anti and bool(view.symmetric_anti(
                    p.namespace, sp.labels if sp else tuple(sorted(p.labels.items()))))
                if sp is None and symmetric:
                    sp = SchedulingSpec(p.namespace, tuple(sorted(p.labels.items())))
                if sp is None and not any_closed and domain is None:
                    cs.append(None if p.mig_profile is None
                              else mig.constraint(None, p.mig_profile, p.mig_served))
                    continue
                ckey = (sp, gpu, symmetric, domain)
                c = cache.get(ckey)
                if c is None:
                    c = kept.get(ckey) or constraint_for(sp, gpu, view, symmetric, domain)
                    cache[ckey] = c
                cs.append(c if p.mig_profile is None else mig.constraint(c, p.mig_profile,
                                                                        p.mig_served))
            out.append(replace(w, constraints=tuple(cs)) if any(c is not None for c in cs) else w)
        self._constraints = cache
        return out


    def _domain(self, want: TopologyRequest, w: Workload, keys: list[PodKey],
                pods: Mapping[PodKey, PodInfo], nodes: Mapping[str, NodeInfo],
                used: Mapping[str, Mapping[int, tuple[int, bool]]]) -> Domain:
        """The topology domain of a workload this cycle (tessera.kube.predicates.topology)."""
        running = [pl.node for pl in w.placements if pl is not None] if w.placements else []
        pending = [w.pods[i] for i in range(len(w.pods)) if not w.placements or w.placements[i] is None]
        first = pods[keys[0]]
        assert first.request is not None
        base = constraint_for(first.sched, first.request.gpu.kind is not GpuKind.NONE, self.view)
        core = {n: ni.node for n, ni in nodes.items() if ni.node is not None}
        labels = {n: ni.labels for n, ni in nodes.items()}
        return choose_domain(want, pending, running, core, labels, base.allows, used)


def _devices_used(workloads: list[Workload]) -> dict[str, dict[int, tuple[int, bool]]]:
    """node -> device -> (bytes held, exclusive), from the snapshot's placements."""
    out: dict[str, dict[int, tuple[int, bool]]] = {}
    for w in workloads:
        for pl in w.placements:
            if pl is None:
                continue
            devs = out.setdefault(pl.node, {})
            for i, b in zip(pl.devices, pl.request_bytes, strict=True):
                held, excl = devs.get(i, (0, False))
                devs[i] = (held + b, excl or pl.exclusive)
    return out


def foreign_others(foreign_pods: Iterable[ForeignPod | None], facts: Mapping[str, NodeFacts]) -> list[OtherPod]:
    """Other schedulers' bound pods, as the predicates see them."""
    out = []
    for f in foreign_pods:
        if f is None or f.node not in facts:
            continue
        sp = f.sched
        out.append(OtherPod(f.namespace, dict(f.labels), sp, node=f.node,
                            resources=dict(sp.resources) if sp else {},
                            ports=sp.host_ports if sp else ()))
    return out


def _claims_sig(members: list[PodInfo], claims: Mapping[PodKey, str]) -> tuple[Any, ...]:
    return tuple(claims.get((p.namespace, c)) for p in members if p.sched and not p.node
                 for c in p.sched.claims)


def _claims_wait(members: list[PodInfo], claims: Mapping[PodKey, str]) -> str | None:
    """Why a pod naming PersistentVolumeClaims must wait (VolumeBinding): a claim that does
    not exist, or one not bound to a volume yet."""
    for p in members:
        if p.node or p.sched is None:
            continue
        for c in p.sched.claims:
            phase = claims.get((p.namespace, c))
            if phase is None:
                return f'persistentvolumeclaim "{c}" not found'
            if phase != "Bound":
                return f'pod has unbound PersistentVolumeClaims ("{c}" is {phase})'
    return None


def _fence(nodes: list[Node], closed: set[str], held: Mapping[str, tuple[int, int, int]],
           workloads: list[Workload], now: float) -> Workload | None:
    """A non-preemptible workload holding everything still free on cordoned or NotReady nodes,
    and what pods of other schedulers hold elsewhere (whole free GPUs, CPU, memory), so the core
    places nothing there while what runs there stays accounted for. (The core has no notion of
    a closed node or of someone else's pods; this keeps that knowledge in the adapter.)"""
    used: dict[str, tuple[list[int], list[bool], list[int]]] = {}
    for n in nodes:
        if n.name in closed or n.name in held:
            used[n.name] = ([0] * len(n.gpus), [False] * len(n.gpus), [0, 0])
    for w in workloads:
        for pl in w.placements:
            if pl is None or pl.node not in used:
                continue
            dev, excl, hostres = used[pl.node]
            for i, b in zip(pl.devices, pl.request_bytes, strict=True):
                dev[i] += b
                excl[i] = excl[i] or pl.exclusive
            hostres[0] += pl.cpu_milli
            hostres[1] += pl.memory
    pods: list[ResourceRequest] = []
    placements: list[Placement] = []
    for n in nodes:
        if n.name not in used:
            continue
        dev, excl, hostres = used[n.name]
        if n.name not in closed:
            gpus, cpu_f, mem_f = held[n.name]
            idle = [g.index for g in sorted(n.gpus, key=lambda g: g.index) if dev[g.index] == 0]
            memory_of = {g.index: g.schedulable for g in n.gpus}
            for i in idle[:gpus]:
                mem_i = memory_of[i]
                pods.append(ResourceRequest(GpuRequest.whole(1)))
                placements.append(Placement(n.name, (i,), (mem_i,), (mem_i,), True))
            cpu = min(cpu_f, max(0, n.cpu_milli - hostres[0]))
            mem = min(mem_f, max(0, n.memory - hostres[1]))
            if cpu or mem:
                pods.append(ResourceRequest(cpu_milli=cpu, memory=mem))
                placements.append(Placement(n.name, cpu_milli=cpu, memory=mem))
            continue
        for g in sorted(n.gpus, key=lambda g: g.index):
            i = g.index
            free = g.schedulable - dev[i]
            if excl[i] or free <= 0:
                continue
            if dev[i] == 0:
                pods.append(ResourceRequest(GpuRequest.whole(1)))
                placements.append(Placement(n.name, (i,), (g.schedulable,), (g.schedulable,), True))
            else:
                pods.append(ResourceRequest(GpuRequest.of_memory(free)))
                placements.append(Placement(n.name, (i,), (free,), (free,), False))
        cpu = max(0, n.cpu_milli - hostres[0])
        mem = max(0, n.memory - hostres[1])
        if cpu or mem:
            pods.append(ResourceRequest(cpu_milli=cpu, memory=mem))
            placements.append(Placement(n.name, cpu_milli=cpu, memory=mem))
    if not pods:
        return None
    return Workload(
        id=FENCE_WORKLOAD, project=FENCE_PROJECT, pods=tuple(pods), priority_class="inference",
        started_at=now, placements=tuple(placements), preemptible=False,
        name="room on cordoned or NotReady nodes, and other schedulers' pods",
    )


def _workload(
    gkey: tuple[str, str, str],
    members: list[PodInfo],
    pg: PodGroupInfo | None,
    owner: Mapping[str, str],
    assumed: Mapping[PodKey, Placement],
    ctx: Context,
    tree: ProjectTree,
    now: float,
    claims: Mapping[PodKey, str] | None = None,
    unmovable: Collection[PodKey] = frozenset(),
) -> tuple[Workload | None, list[PodKey], dict[PodKey, str]]:
    kind, ns, gname = gkey
    pending = [p for p in members if not p.node and p.key not in assumed]
    waits: dict[PodKey, str] = {}

    def wait_all(message: str) -> tuple[None, list[PodKey], dict[PodKey, str]]:
        for p in pending:
            waits[p.key] = message
        return None, [], waits

    unbound = _claims_wait(pending, claims or {})
    if unbound is not None:
        return wait_all(unbound)
    if kind == "g" and pg is None and (pg := inferred_group(ns, gname, members)) is None:
        return wait_all(f"PodGroup {ns}/{gname} ({names.POD_GROUP}) does not exist")
    project = (pg.project if pg else None) or members[0].labels.get(names.PROJECT) or owner.get(ns)
    if project is None:
        return wait_all(f"namespace {ns} belongs to no tessera Project "
                        f"(create a Project with spec.namespace: {ns})")
    if project in ctx.project_errors:
        return wait_all(f"project {project} is invalid: {ctx.project_errors[project]}")
    pclass = priority_class_of(members[0], pg.priority_class if pg else None)
    if pclass not in PRIORITY_CLASSES:
        return wait_all(f"priority class {pclass!r} is not one of {', '.join(PRIORITY_CLASSES)}")
    if kind == "g" and (absent := anchor_pods_missing(gname, members, len(anchors_of(members)))):
        waits.update((p.key, absent) for p in pending)  # nothing more starts without the anchor
        if not (members := [p for p in members if p.node or p.key in assumed]):
            return None, [], waits
    placements: list[Placement | None] = []
    requests: list[ResourceRequest] = []
    keys: list[PodKey] = []
    started: float | None = None
    terminating = False
    for p in members:
        pl = p.placement if p.node else assumed.get(p.key)
        if pl is not None:
            s = p.started or now
            started = s if started is None else min(started, s)
        assert p.request is not None
        requests.append(p.request)
        placements.append(pl)
        keys.append(p.key)
        terminating = terminating or p.deleting
    min_members = None
    if pg is not None:
        if pg.min_member > len(keys):
            if all(pl is None for pl in placements):
                return wait_all(f"gang {gname} needs {pg.min_member} pods ({'PodGroup minMember' if pg.version >= 0 else names.GANG_MIN_MEMBER}); {len(keys)} exist")
            min_members = len(keys)
        else:
            min_members = pg.min_member
    wid = f"{ns}/{gname}" if kind == "g" else f"{ns}/pod/{gname}"
    anchors = anchors_of(members) if kind == "g" else ()  # required to start (core/cycle/anchors.py)
    w = Workload(
        id=wid,
        project=project,
        pods=tuple(requests),
        priority_class=pclass,
        min_members=min_members,
        created_at=min(p.created for p in members),
        started_at=started,
        placements=tuple(placements),
        preemptible=False if terminating else None,
        movable=all(p.owner in RECREATED_BY and p.key not in unmovable for p in members),
        name=gname,
        anchors=anchors,
        pod_names=tuple(p.name for p in members) if anchors else (),
    )
    try:
        validate_workload(w, tree)
    except InvalidRequest as exc:
        return wait_all(str(exc))
    return w, keys, waits


def find_conflicts(snapshot: Snapshot, ctx: Context, pods: Mapping[PodKey, PodInfo]) -> list[PodInfo]:
    """Bound pods whose recorded placements do not fit together (the core refuses such a
    snapshot as a whole). Never expected; looked for only when the core refused one."""
    state = ClusterState(snapshot.nodes)
    bad: list[PodInfo] = []
    for w in snapshot.workloads:
        for key, pl in zip(ctx.pods_of.get(w.id, ()), w.placements or (), strict=False):
            if pl is None:
                continue
            try:
                state.assign(f"{key[0]}/{key[1]}", pl)
            except InvalidRequest as exc:
                pod = pods.get(key)
                if pod is not None and pod.node:
                    log.error("pod %s/%s: recorded placement conflicts: %s", key[0], key[1], exc)
                    bad.append(pod)
    return bad
