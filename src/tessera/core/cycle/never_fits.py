"""Requests that no node of the cluster could ever hold, whatever it evicts: more CPU or memory
than the largest node has, or a GPU request no kind of node's GPUs can meet. Such a workload
waits as ``unschedulable`` from the session's first pass, without a search; the answer for a
GPU request is computed once per distinct request and set of GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.constraints import NodeConstraint, without_room
from tessera.core.errors import InvalidRequest
from tessera.core.mig import profile_of
from tessera.core.model import GpuRequest, Node, ResourceRequest
from tessera.core.placement import Placer
from tessera.core.requests import check_against_cluster
from tessera.core.units import format_bytes

from .mig_state import MigState
from .workload_state import WorkloadState


class NeverFits:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self._cpu = max((n.cpu_milli for n in nodes), default=0)
        self._memory = max((n.memory for n in nodes), default=0)
        kinds: dict[tuple[tuple[str, int, int], ...], Node] = {}
        for n in nodes:
            kinds.setdefault(tuple((g.model, g.memory, g.headroom) for g in n.gpus), n)
        self._kinds = tuple(kinds.values())
        """One node per distinct set of GPUs: what ``check_against_cluster`` looks at."""
        self._gpu: dict[GpuRequest, str | None] = {}
        self._nodes = tuple(nodes)
        self._by_name = {n.name: n for n in nodes}

    def capacity(self, mig_gpus: int) -> tuple[float, float, float]:
        """GPUs (devices and MIG GPUs), CPU millicores and memory bytes of the whole cluster."""
        nodes = self._nodes
        return (float(sum(len(n.gpus) for n in nodes) + mig_gpus), float(sum(n.cpu_milli for n in nodes)),
                float(sum(n.memory for n in nodes)))

    def gang(self, ws: WorkloadState, placer: Placer, mig: MigState) -> str | None:
        """Why ``ws``'s gang can never be placed (no node its constraint allows, or a request
        no node could ever hold), or None."""
        for i in ws.unplaced()[: max(ws.required(), 1)]:
            request = ws.spec.pods[i]
            constraint = ws.spec.constraint_of(i)
            if constraint is not None and not any(placer.static(constraint)[0]) \
                    and not self._mig_room_possible(request, constraint, mig):
                refused = constraint.refusals(self._nodes)
                return f"0/{len(self._nodes)} nodes are available: {refused or 'no node is allowed'}"
            why = self.why(request)
            if why is not None:
                if i in ws.spec.anchors:  # say which pod the gang cannot start without
                    return f"anchor pod {ws.spec.pod_label(i)} does not fit: {why}"
                return why
        return None

    def _mig_room_possible(self, request: ResourceRequest, constraint: NodeConstraint, mig: MigState) -> bool:
        """A MIG pod with no room anywhere now may get it by eviction: on a node its
        constraint allows but for room, with a MIG GPU that has the profile."""
        if request.mig is None:
            return False
        base = without_room(constraint)
        for node, gpus in mig.nodes.items():
            if base is not None and not base.allows(self._by_name[node]):
                continue
            if any(profile_of(g.model, request.mig) is not None for g in gpus):
                return True
        return False

    def why(self, request: ResourceRequest) -> str | None:
        """Why no node can ever hold ``request`` (None: some node could)."""
        if request.cpu_milli > self._cpu:
            return (f"no node can ever hold it: it asks {request.cpu_milli / 1000:g} CPU, "
                    f"the largest node has {self._cpu / 1000:g}")
        if request.memory > self._memory:
            return (f"no node can ever hold it: it asks {format_bytes(request.memory)} of "
                    f"memory, the largest node has {format_bytes(self._memory)}")
        gpu = request.gpu
        if gpu not in self._gpu:
            try:
                check_against_cluster(gpu, self._kinds)
                self._gpu[gpu] = None
            except InvalidRequest as exc:
                self._gpu[gpu] = f"no node can ever hold it: {exc}"
        return self._gpu[gpu]

