"""Quota accounting for one cycle: what each project (and its ancestors) holds, what a pod
counts as, and whether more for a workload breaks a rule (limit, deserved quota for
non-preemptible workloads, fair share). Also the fair order of projects, which follows from
what they hold against their fair shares.

Every change to ``alloc`` goes through ``account``, which the session calls inside its
statements (so a discarded statement puts the numbers back with the placements).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

from tessera.core.fairshare import EPS, FairShares, Vector
from tessera.core.model import COMPUTE_FULL, GpuKind, Node, ResourceRequest
from tessera.core.projects import ProjectTree, Resource
from tessera.core.state import ClusterState, Placement
from tessera.core.units import format_bytes, format_gpus

from .exact_sums import ExactSums
from .workload_state import Wait, WorkloadState


def fmt_amount(resource: Resource, amount: float) -> str:
    if resource is Resource.GPU:
        return f"{format_gpus(amount)} GPU{'' if abs(amount) <= 1 + EPS else 's'}"
    if resource is Resource.CPU:
        return f"{amount / 1000:g} CPU"
    return f"{format_bytes(amount)} of memory"


def _num(resource: Resource, amount: float) -> str:
    if resource is Resource.GPU:
        return format_gpus(amount)
    if resource is Resource.CPU:
        return f"{amount / 1000:g}"
    return format_bytes(amount)


_queue_key = attrgetter("queue_key")
"""Within a project: higher priority first, then older, then by id."""


def vector_of(v: Sequence[float]) -> Vector:
    return (v[0], v[1], v[2])


class QuotaLedger:
    """What every project holds during the cycle, and the quota rules checked against it."""

    def __init__(self, tree: ProjectTree, nodes: Sequence[Node], state: ClusterState) -> None:
        self.tree = tree
        self._nodes = nodes
        self._state = state
        self.alloc: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in tree.order}
        """Project -> GPUs, CPU millicores, memory bytes held now (a project counts its
        descendants' workloads too)."""
        self.alloc_np: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in tree.order}
        """The same for non-preemptible workloads only (they must fit in deserved quota)."""
        self.epoch: dict[str, int] = {p: 0 for p in tree.order}
        """Per top-level project: bumped whenever something under it is accounted, so a fair
        order key of a project under it is known fresh without computing it again."""
        self.deserved: dict[str, Vector] = {
            name: (p.gpu.deserved_amount, p.quota(Resource.CPU).deserved_amount,
                   p.quota(Resource.MEMORY).deserved_amount)
            for name, p in tree.projects.items()
        }
        self._limits: dict[str, Vector] = {
            name: (p.gpu.limit_amount, p.quota(Resource.CPU).limit_amount,
                   p.quota(Resource.MEMORY).limit_amount)
            for name, p in tree.projects.items()
        }
        self._resources = tuple(int(r) for r in tree.governed)
        self._fair_waits: dict[tuple[str, Resource, float], Wait] = {}
        self.allocated_before: dict[str, Vector] = {}
        self.shares: FairShares
        """Set by ``share_out`` once the running workloads are accounted."""
        self._demand: dict[ResourceRequest, Vector] = {}
        self._demand_of: dict[int, tuple[ResourceRequest, Vector]] = {}
        self._kinds: set[tuple[int, str]] | None = None
        self._levels: dict[str, tuple[tuple[str, int], ...]] = {}
        """Per leaf project: its chain from the top with each level's negated priority (the
        fixed parts of ``project_key``; the tree is fixed for the session)."""
        self.held = ExactSums(tree)
        """What the workloads in the session hold by their snapshot placements, exactly
        (kept between cycles; ``recount`` rounds it into ``alloc``)."""
        self.usage: dict[str, float] = {}
        """Decayed GPU-seconds per project (time-based fair share only)."""
        self.from_usage: dict[str, float] = {}
        """GPUs of each fair share due to usage history (time-based fair share only)."""

    def share_out(self, shares: FairShares) -> None:
        """Fix the fair shares for the cycle and remember what each project held at the start."""
        self.shares = shares
        self.allocated_before = {p: vector_of(v) for p, v in self.alloc.items()}

    def demand(self, request: ResourceRequest) -> Vector:
        """Quota a pending pod counts as. A memory request counts as its share of the smallest
        device (of an allowed model) that can hold it, which is the most it can cost; KAI used
        the smallest device in the cluster even when it could not hold the request (#1847).
        Looked up first by the request object (an int key; the entry keeps the object, so its
        id is not reused while there), then by value (a dataclass hash and compare)."""
        seen = self._demand_of.get(id(request))
        if seen is not None and seen[0] is request:
            return seen[1]
        d = self._demand.get(request)
        if d is None:
            gpu = request.gpu
            gpus = 0.0
            if request.gpus is not None:
                gpus = request.gpus
            elif gpu.kind is GpuKind.MEMORY:
                assert gpu.memory is not None
                sizes = [size for size, model in self._device_kinds()
                         if gpu.allows(model) and size >= gpu.memory]
                gpus = gpu.gpus_on(min(sizes)) if sizes else float(gpu.devices)
            elif gpu.kind is not GpuKind.NONE:
                gpus = gpu.gpus_on(1)
            d = (gpus, float(request.cpu_milli), float(request.memory))
            self._demand[request] = d
        if len(self._demand_of) >= 65_536:
            self._demand_of.clear()
        self._demand_of[id(request)] = (request, d)
        return d

    def _device_kinds(self) -> set[tuple[int, str]]:
        """Every (schedulable bytes, model) of the cluster's GPUs, gathered once: ``demand``
        takes a minimum over them, the same as over every GPU."""
        kinds = self._kinds
        if kinds is None:
            kinds = self._kinds = {(g.schedulable, g.model) for n in self._nodes for g in n.gpus}
        return kinds

    def unplaced_demands(self, ws: WorkloadState) -> tuple[Vector, ...]:
        """``demand`` of each unplaced pod, in pod order (kept until a placement changes)."""
        facts = ws.facts()
        found = facts.unplaced_demands
        if found is None:
            pods = ws.spec.pods
            out: list[Vector] = []
            last: ResourceRequest | None = None
            d: Vector = (0.0, 0.0, 0.0)
            for i in facts.unplaced:
                r = pods[i]
                if r is not last:  # a gang's pods are mostly one request object: one look-up
                    d, last = self.demand(r), r
                out.append(d)
            found = facts.unplaced_demands = tuple(out)
        return found

    def placement_vector(self, p: Placement) -> Vector:
        if p.gpus is not None:
            return (p.gpus, float(p.cpu_milli), float(p.memory))
        if p.exclusive:
            gpus = float(len(p.devices))
        else:
            memory = self._state.by_name[p.node].dev_memory
            # max(memory portion, compute request) per device (docs/compute-share.md)
            time = p.compute / COMPUTE_FULL
            devices = p.devices
            if len(devices) == 1:  # the common case, without the generator (same sum)
                gpus = max(p.request_bytes[0] / memory[devices[0]], time)
            else:
                gpus = sum(max(b / memory[i], time) for i, b in zip(devices, p.request_bytes, strict=True))
        return (gpus, float(p.cpu_milli), float(p.memory))

    def account(self, ws: WorkloadState, pod: int, p: Placement | None, sign: int) -> None:
        ws._vector = None
        if sign > 0:
            assert p is not None
            v = self.placement_vector(p)
            ws.pod_vectors[pod] = v
        else:
            old = ws.pod_vectors[pod]
            assert old is not None
            v = old
            ws.pod_vectors[pod] = None
        self.epoch[ws.chain[-1]] += 1
        targets = [self.alloc] if ws.preemptible else [self.alloc, self.alloc_np]
        for table in targets:
            for name in ws.chain:
                a = table[name]
                a[0] += sign * v[0]
                a[1] += sign * v[1]
                a[2] += sign * v[2]

    def recount(self) -> None:
        """What every project holds at the start of a cycle: ``ExactSums.round_into``, the
        same bits in a session kept between cycles as in a new one. Forgets the last cycle's
        usage history figures."""
        self.usage = {}
        self.from_usage = {}
        self.held.round_into(self.alloc, self.alloc_np)

    def shortfall(self, project: str) -> float:
        """GPUs the project is below its fair share (0 if at or above)."""
        return max(0.0, self.shares.gpu(project) - self.alloc[project][0])

    def check(
        self,
        ws: WorkloadState,
        demand: Vector,
        *,
        fair: bool = True,
        fair_caps: dict[str, Vector] | None = None,
    ) -> Wait | None:
        """Why ``demand`` more for this workload breaks a quota rule, or None.

        Checked on the project and each ancestor: the hard limit; for a non-preemptible
        workload, deserved quota (it may only use in-quota resources); and, when ``fair``,
        the fair share (or ``fair_caps`` where given, used by preemption).

        The same comparisons as ``_why`` (which words the first broken rule) over numbers
        looked up once per session: most checks pass or fail on fair share alone, and
        are asked for every waiting workload by several actions each cycle.
        """
        res = [r for r in self._resources if demand[r] > 0]
        if not res:
            return None
        alloc, limits = self.alloc, self._limits
        chain = ws.chain
        for name in chain:
            a, lim = alloc[name], limits[name]
            for r in res:
                if a[r] + demand[r] > lim[r] + EPS:
                    return _worded(self, ws, demand, fair, fair_caps)
        if not ws.preemptible:
            alloc_np, deserved = self.alloc_np, self.deserved
            for name in chain:
                a, d = alloc_np[name], deserved[name]
                for r in res:
                    if a[r] + demand[r] > d[r] + EPS:
                        return _worded(self, ws, demand, fair, fair_caps)
        if fair:
            share = self.shares.share if fair_caps is None else fair_caps
            for name in chain:
                a, caps = alloc[name], share[name]
                for r in res:
                    over = a[r] + demand[r] - caps[r]
                    if over > EPS:  # the first rule ``_why`` finds broken: its wording
                        return self._fair_wait(name, Resource(r), over)
        return None

    def _fair_wait(self, name: str, resource: Resource, over: float) -> Wait:
        """The fair-share wait (one object per distinct wording: a waiting queue asks for the
        same few amounts over and over)."""
        key = (name, resource, over)
        wait = self._fair_waits.get(key)
        if wait is None:
            if len(self._fair_waits) >= 65_536:
                self._fair_waits.clear()
            wait = self._fair_waits[key] = Wait(
                "fair-share", f"would exceed fair share of {name} by {fmt_amount(resource, over)}")
        return wait

    def project_key(self, leaf: str) -> tuple[tuple[float, int, str], ...]:
        """Fair order: at each level from the top, the least saturated (allocated ÷ fair share)
        first, then higher priority, then name."""
        levels = self._levels.get(leaf)
        if levels is None:
            tree = self.tree
            levels = self._levels[leaf] = tuple(
                (name, -tree[name].priority) for name in reversed(tree.chain(leaf)))
        share, alloc = self.shares.share, self.alloc
        key = []
        for name, rank in levels:
            fair = share[name][0]
            ratio = alloc[name][0] / fair if fair > EPS else math.inf
            key.append((ratio, rank, name))
        return tuple(key)

    def fair_order(self, workloads: Iterable[WorkloadState]) -> Iterator[WorkloadState]:
        """Workloads by project fair order, recomputed as allocations change; within a project
        by priority (higher first), then age (older first), then id."""
        per: dict[str, deque[WorkloadState]] = {}
        for ws in sorted(workloads, key=_queue_key):
            queue = per.get(ws.project)
            if queue is None:
                queue = per[ws.project] = deque()
            queue.append(ws)
        # An entry's key is fresh while nothing under its top-level project was accounted since
        # it was computed (``epoch``); only then is it computed again (lazily, at the top).
        # Shares are fixed for the cycle and ``alloc`` changes only through ``account``, which
        # bumps the epoch, so a key computed at an epoch still seen is the key now.
        epoch = self.epoch
        top = {p: self.tree.chain(p)[-1] for p in per}
        keys: dict[str, tuple[int, tuple[tuple[float, int, str], ...]]] = {}

        def key_of(p: str) -> tuple[tuple[float, int, str], ...]:
            seen = epoch[top[p]]
            known = keys.get(p)
            if known is not None and known[0] == seen:
                return known[1]
            key = self.project_key(p)
            keys[p] = (seen, key)
            return key

        heap = [(key_of(p), p, epoch[top[p]]) for p in sorted(per)]
        heapq.heapify(heap)
        # One entry per project, so no two entries are equal: a push followed by a pop is
        # ``heappushpop``, which hands the pushed entry straight back when it is the least
        # (the common case: a project whose workload waited keeps its place at the front).
        entry = heapq.heappop(heap) if heap else None
        while entry is not None:
            key, p, seen = entry
            if epoch[top[p]] != seen:
                fresh = key_of(p)
                if fresh != key:
                    entry = heapq.heappushpop(heap, (fresh, p, epoch[top[p]]))
                    continue
            queue = per[p]
            yield queue.popleft()
            if queue:
                if epoch[top[p]] == seen:
                    continue  # nothing accounted: the entry to push is this one, still least
                entry = heapq.heappushpop(heap, (key_of(p), p, epoch[top[p]]))
            else:
                entry = heapq.heappop(heap) if heap else None

    def within(self, chain: Sequence[str], caps: dict[str, Vector] | None) -> bool:
        """Every project of ``chain`` is within its limit (and ``caps`` where given)."""
        for name in chain:
            a = self.alloc[name]
            project = self.tree[name]
            for r in self.tree.governed:
                cap = project.quota(r).limit_amount
                if caps is not None:
                    cap = min(cap, caps[name][r])
                if a[r] > cap + EPS:
                    return False
        return True

    def over_quota_note(self, ws: WorkloadState) -> str:
        deserved = self.tree[ws.project].gpu.deserved_amount
        if self.alloc[ws.project][0] > deserved + EPS:
            return f" (project {ws.project} is over its deserved quota: preemptible, may be reclaimed)"
        return ""


def _worded(ledger: QuotaLedger, ws: WorkloadState, demand: Vector, fair: bool,
            fair_caps: dict[str, Vector] | None) -> Wait | None:
    """The first quota rule ``demand`` more for ``ws`` breaks, in words (``QuotaLedger.check``
    asks only when its comparisons found one broken)."""
    tree = ledger.tree
    resources = tree.governed
    for name in ws.chain:
        project = tree[name]
        level = "project" if tree.is_leaf(name) else "department"
        a = ledger.alloc[name]
        for r in resources:
            if demand[r] <= 0:
                continue
            limit = project.quota(r).limit_amount
            if a[r] + demand[r] > limit + EPS:
                return Wait(
                    "limit",
                    f"{level} {name} is at its limit of {fmt_amount(r, limit)}: "
                    f"{_num(r, a[r])} in use, this needs {_num(r, demand[r])} more",
                )
    if not ws.preemptible:
        for name in ws.chain:
            a = ledger.alloc_np[name]
            for r in resources:
                deserved = tree[name].quota(r).deserved_amount
                if demand[r] > 0 and a[r] + demand[r] > deserved + EPS:
                    return Wait(
                        "quota",
                        f"non-preemptible ({ws.spec.priority_class}) workloads only use "
                        f"deserved quota: {name} has {_num(r, a[r])} of its "
                        f"{fmt_amount(r, deserved)} deserved in non-preemptible use, "
                        f"this needs {_num(r, demand[r])} more",
                    )
    if fair:
        for name in ws.chain:
            a = ledger.alloc[name]
            caps = ledger.shares.share[name] if fair_caps is None else fair_caps[name]
            for r in resources:
                over = a[r] + demand[r] - caps[r]
                if demand[r] > 0 and over > EPS:
                    return ledger._fair_wait(name, r, over)
    return None


def enter_all(quota: QuotaLedger, states: Iterable[WorkloadState]) -> None:
    """A new session's workloads entered into ``quota`` with their snapshot placements: each placed pod's
    ``placement_vector`` into ``pod_vectors`` (the same expressions, inlined: one per pod
    of 55,000 at 5,000 nodes), then ``ExactSums.enter_all``."""
    by_name = quota._state.by_name
    for ws in states:
        if not ws.was_running:
            continue
        vectors = ws.pod_vectors
        for i, p in enumerate(ws.placements):
            if p is None:
                continue
            if p.gpus is not None:
                gpus = p.gpus
            elif p.exclusive:
                gpus = float(len(p.devices))
            else:
                memory = by_name[p.node].dev_memory
                time = p.compute / COMPUTE_FULL
                devices = p.devices
                if len(devices) == 1:
                    gpus = max(p.request_bytes[0] / memory[devices[0]], time)
                else:
                    gpus = sum(max(b / memory[d], time)
                               for d, b in zip(devices, p.request_bytes, strict=True))
            vectors[i] = (gpus, float(p.cpu_milli), float(p.memory))
    quota.held.enter_all(states)
