"""Requests that no node of the cluster could ever hold, whatever it evicts: more CPU or memory
than the largest node has, or a GPU request no kind of node's GPUs can meet. Such a workload
waits as ``unschedulable`` from the session's first pass, without a search; the answer for a
GPU request is computed once per distinct request and set of GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest, Node, ResourceRequest
from tessera.core.requests import check_against_cluster
from tessera.core.units import format_bytes


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
