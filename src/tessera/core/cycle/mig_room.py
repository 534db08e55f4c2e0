"""Making MIG room by eviction, for reclaim and preemption (docs/mig.md).

A pending MIG pod (``ResourceRequest.mig``) with no room for its profile on any MIG GPU is not
helped by the node-targeted search of ``victims``: evicting pods frees GPU memory, CPU and
memory, never a MIG slot. Here the victims are the running workloads holding partitions
(``Snapshot.mig``): :func:`tessera.core.mig.make_room` finds the cheapest set whose partitions,
once idle, let ``choose`` place the profile on one GPU (fewest victims, then lowest priority,
then least GPU given back; none needless), taking only sets the action's rule allows (reclaim's
fair-share floors, preemption's priority within the project) and after which the node has the
pod's CPU and memory. The pod is then bound there, after those evictions, with the partition
``choose`` gives it (``PodBinding.mig``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from tessera.core.constraints import without_room
from tessera.core.mig import MigGpu, MigRoom, Victim, make_room
from tessera.core.model import ResourceRequest
from tessera.core.state import Placement

from .session import PodPlacements, Session, WorkloadState
from .victims import Allow, Tentative, take


def mig_pod(ws: WorkloadState) -> tuple[int, ResourceRequest] | None:
    """The one pod a pending MIG workload still needs, or None (not MIG, or a gang of more:
    a MIG room search places one pod)."""
    if ws.required() != 1:
        return None
    i = ws.unplaced()[0]
    request = ws.spec.pods[i]
    return (i, request) if request.mig is not None else None


def find_room(session: Session, ws: WorkloadState, candidates: Iterable[WorkloadState],
              allow: Allow) -> tuple[str, MigRoom] | None:
    """The node and the victims (among ``candidates``, each allowed by ``allow`` on top of the
    others) that make room for ``ws``'s MIG pod; None if no allowed set does."""
    found = mig_pod(ws)
    if found is None:
        return None
    _, request = found
    assert request.mig is not None
    constraint = without_room(session.constraint_for(ws, request))
    holders = session.mig.holders()
    by_id = {v.id: v for v in candidates if v.id in holders and not v.evicted and v is not ws}
    victims = {v.id: Victim(v.priority, v.vector()[0]) for v in by_id.values()}
    gpus: list[MigGpu] = []
    node_of: dict[str, str] = {}
    for node, gs in session.mig.nodes.items():
        ns = session.state.by_name[node]
        if constraint is not None and not session.node_allowed(constraint, ns):
            continue
        for g in gs:  # keyed by node too: a GPU key need only be unique on its node
            key = f"{node}\x00{g.key}"
            gpus.append(MigGpu(key, g.model, g.partitions))
            node_of[key] = node

    def ok(gpu: str, combo: tuple[str, ...]) -> bool:
        node = node_of[gpu]
        ns = session.state.by_name[node]
        cpu, mem = ns.free_cpu, ns.free_mem
        tentative: Tentative = {}
        for vid in combo:
            v = by_id[vid]
            if not allow(v, tentative):
                return False
            take(tentative, v)
            for p in v.placements:
                if p is not None and p.node == node:
                    cpu += p.cpu_milli
                    mem += p.memory
        return request.cpu_milli <= cpu and request.memory <= mem

    room = make_room(gpus, request.mig, victims, ok)
    if room is None:
        return None
    gpu = room.gpu.split("\x00", 1)[1]
    return node_of[room.gpu], MigRoom(gpu, room.victims, replace(room.choice, gpu=gpu))


def bind_in_room(session: Session, ws: WorkloadState, node: str, room: MigRoom,
                 evict: Callable[[WorkloadState], None]) -> tuple[PodPlacements, list[WorkloadState]] | None:
    """Evict ``room.victims`` (through ``evict``) and place the MIG pod on ``node`` with the
    partition ``room.choice``, inside the caller's statement; None (the caller discards) if the
    node lacks its CPU or memory even so."""
    found = mig_pod(ws)
    assert found is not None
    pod, request = found
    evicted = [session.workloads[vid] for vid in room.victims]
    for v in evicted:
        evict(v)
    p = Placement(node=node, cpu_milli=request.cpu_milli, memory=request.memory, gpus=request.gpus)
    if session.state.fits(p) is not None:
        return None
    session.assign_pod(ws, pod, p, mig=room.choice)
    return [(pod, p)], evicted


def where_mig(session: Session, ws: WorkloadState, placed: PodPlacements) -> str:
    """``n1 (MIG 3g.20gb on GPU-…)`` for a binding's message."""
    pod, p = placed[0]
    choice = session.mig_choices.get((ws.id, pod))
    profile = ws.spec.pods[pod].mig
    return f"{p.node} (MIG {profile} on {choice.gpu})" if choice is not None else p.node
