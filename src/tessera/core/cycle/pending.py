"""What ``Session.begin`` needs of the waiting workloads, kept while the session is (a session
kept between cycles, ``cycle.warm``, adds and removes only what changed):

- which workloads have a pod without a placement in the snapshot, listed in id order at
  ``begin`` (sorting the waiting ids instead of scanning every workload);
- why a waiting gang can never be placed (``NeverFits``), kept on a workload without node
  constraints or MIG pods while its unplaced pods are the same (the answer then depends only
  on its requests and the nodes, fixed for the session); asked again each cycle otherwise (a
  constraint's static filter is forgotten every cycle, MIG room changes);
- the cluster's capacity, computed again only when the MIG GPU count changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tessera.core.fairshare import Vector
from tessera.core.model import GpuRequest, Node
from tessera.core.placement import Placer

from .mig_state import MigState
from .never_fits import NeverFits
from .quota import QuotaLedger
from .workload_state import WorkloadState


def pending_demand(quota: QuotaLedger, pending: Iterable[WorkloadState],
                   waits: Mapping[str, object]) -> tuple[dict[str, Vector], list[GpuRequest]]:
    """One pass over the pending workloads that can run (not in ``waits``): what each project
    holds plus what its pending pods ask for (the demand fair share divides by; pods that can
    never run take no share), added in the order given; and the GPU requests of their unplaced
    pods, one per distinct object (what ``usable.unusable_gpus`` tries the fragments with)."""
    requested: dict[str, Vector] = {p: (v[0], v[1], v[2]) for p, v in quota.alloc.items()}
    gpus: dict[int, GpuRequest] = {}
    unplaced_demands = quota.unplaced_demands
    for ws in pending:
        if ws.id in waits:
            continue
        demands = unplaced_demands(ws)
        if not demands:
            continue
        pods = ws.spec.pods
        for i in ws.unplaced():
            g = pods[i].gpu
            gpus[id(g)] = g
        project = ws.project
        r = requested[project]
        for d in demands:
            r = (r[0] + d[0], r[1] + d[1], r[2] + d[2])
        requested[project] = r
    return requested, list(gpus.values())


class PendingIndex:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.never = NeverFits(nodes)
        self._by_id: dict[str, WorkloadState] = {}
        self._capacity: tuple[int, Vector] | None = None

    def added(self, ws: WorkloadState) -> None:
        """A workload entered the session as its snapshot has it."""
        if None in ws.placements:
            self._by_id[ws.id] = ws

    def removed(self, workload_id: str) -> None:
        self._by_id.pop(workload_id, None)

    def in_id_order(self) -> list[WorkloadState]:
        by_id = self._by_id
        return [by_id[wid] for wid in sorted(by_id)]

    def capacity(self, mig_gpus: int) -> Vector:
        if self._capacity is None or self._capacity[0] != mig_gpus:
            self._capacity = (mig_gpus, self.never.capacity(mig_gpus))
        return self._capacity[1]

    def never_fits(self, ws: WorkloadState, placer: Placer, mig: MigState) -> str | None:
        """``NeverFits.gang``, kept as the module docstring says."""
        unplaced = ws.unplaced()
        known = ws.never
        if known is not None and known[0] == unplaced:
            return known[1]
        why = self.never.gang(ws, placer, mig)
        spec = ws.spec
        if not spec.constraints and all(r.mig is None for r in spec.pods):
            ws.never = (unplaced, why)
        return why
