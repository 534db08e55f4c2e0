"""MIG partitions for embedded mode: a workload that asks for a profile (``--gpu-mig-profile
3g.20gb``) gets a partition of a GPU an operator put in MIG mode, chosen by
``tessera.core.mig.choose`` (an idle partition of the profile first, else the placement that
fragments least, removing idle partitions only when nothing else fits) and made or removed by
``tessera.node.mig`` (journaled, so a restart neither leaks nor makes one twice).

A partition stays when its workload ends (idle, in the journal without an owner) until a later
request reuses it or needs its room. MIG workloads are in the scheduling cycle like the others
(``tessera.local.scheduling``): a pending one counts as ``MigProfile.fraction`` of a GPU and may
go only where ``RoomNow`` says there is room for its profile; with none, reclaim and preemption
may evict running MIG workloads whose partitions make room (``tessera.core.cycle.mig_room``).
The partition is made here when the cycle binds it (docs/mig.md). Where the operator allows
it (``tessera up --mig-serves-shares``), a share the cycle left waiting for room is served
after the cycle by the smallest profile that holds it (``tessera.core.mig.choose_serving``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.api.validation import check_mig_profile
from tessera.core.constraints import PlacedPods
from tessera.core.errors import InvalidRequest
from tessera.core.mig import (
    PROFILES,
    MigChoice,
    MigGpu,
    Partition,
    choose,
    choose_serving,
    profile_slots,
    serving_profile,
)
from tessera.core.model import GpuRequest, Node
from tessera.local.gpus import Machine
from tessera.local.mig_serving import ServedShares
from tessera.node.mig import MigError, MigGpuState, MigNode
from tessera.node.nvml import Nvml, NvmlUnavailable

FIELD = "spec.compute.gpuMigProfile"


def _geometry(name: str) -> str:
    """The profile whose geometry a listed one has (``1g.5gb+me`` is placed like ``1g.5gb``)."""
    return name.removesuffix("+me")


class LocalMig:
    """The machine's MIG GPUs and the partitions on them (use under the backend's lock)."""

    def __init__(self, machine: Machine, journal: Path, serves_shares: bool = False) -> None:
        self.gpus = machine.mig
        self.journal_path = journal
        self.serves_shares = serves_shares
        """The operator lets a share no shared GPU can hold be served by the smallest MIG
        profile that holds it (``tessera up --mig-serves-shares``; docs/mig.md)."""
        self._nvml: Nvml | None = None
        self.node: MigNode | None = None
        self.serving = ServedShares()
        """Shares a partition may serve, asked of the cycle as their profile."""

    def start(self) -> list[str]:
        """Opens NVML and repairs what a crash left (the journal); lines to log."""
        if not self.gpus:
            return []
        try:
            self._nvml = Nvml().open()
            self.node = MigNode(self._nvml, self.journal_path)
            return self.node.reconcile()
        except (NvmlUnavailable, MigError) as exc:
            self.stop()
            return [f"MIG partitions unavailable: {exc}"]

    def stop(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
        self._nvml = None
        self.node = None

    def check(self, profile: str, workers: int = 1) -> float:
        """Refuses a MIG submission this machine cannot serve (the shared rules and words of
        tessera.api.validation, naming what it has); its GPU fraction."""
        fraction = check_mig_profile(profile, {g.model for g in self.gpus}, "on this machine",
                                     workers, max_workers=1)
        if self.node is None:
            raise InvalidRequest(FIELD, "this machine's MIG GPUs cannot be managed now (NVML did "
                                        "not open; see the server's log)", profile)
        return fraction

    def _layout(self, states: list[MigGpuState]) -> list[MigGpu]:
        """The MIG GPUs for ``choose``; each busy partition's holder is the workload that owns
        it ("" for an operator's: never evicted for room)."""
        out = []
        for s in states:
            if not s.mig_enabled or s.model not in PROFILES:
                continue
            out.append(MigGpu(s.uuid, s.model, tuple(
                Partition(_geometry(p.profile), p.start, p.busy or p.uuid is None, p.uuid or "",
                          p.owner or "" if p.managed else "")
                for p in s.partitions if _geometry(p.profile) in PROFILES[s.model])))
        return out

    def for_cycle(self) -> tuple[list[MigGpu], str]:
        """The MIG GPUs as the scheduling cycle sees them (``Snapshot.mig``) and what is on
        them in words; none, with the reason, when NVML cannot be read now."""
        if self.node is None:
            return [], "this machine's MIG GPUs cannot be managed now (NVML did not open)"
        try:
            states = self.node.state()
        except Exception as exc:  # an NVML read failing: MIG workloads wait, the cycle goes on
            return [], f"reading the MIG GPUs failed: {exc!r}"
        return self._layout(states), self._summary(states)

    @staticmethod
    def _summary(states: list[MigGpuState]) -> str:
        parts = []
        for s in states:
            if not s.mig_enabled:
                continue
            cut = ", ".join(f"{p.profile} {'busy' if p.busy else 'idle'}" for p in s.partitions)
            parts.append(f"GPU {s.index} {s.model}: {cut or 'not cut'}")
        return "; ".join(parts)

    def serving_fraction(self, request: GpuRequest) -> float | None:
        """What a share served by a partition counts as (the smallest profile that serves it on
        this machine's MIG GPUs), or None when serving shares is off or no profile holds it."""
        if not self.serves_shares or self.node is None:
            return None
        fits = [p for p in (serving_profile(request, m) for m in {g.model for g in self.gpus})
                if p is not None]
        return min((p.fraction for p in fits), default=None)

    def place(self, workload_id: str, profile: str | GpuRequest) -> tuple[dict[str, Any], str]:
        """A partition of ``profile`` (or of the smallest profile that serves the share
        ``profile``) held by ``workload_id``: reused, or made (after removing idle ones only
        when nothing else fits). MigError (the reason to wait) when none can be had; nothing
        half-made stays."""
        if self.node is None:
            raise MigError("this machine's MIG GPUs cannot be managed now (NVML did not open)")
        try:
            return self._place(self.node, workload_id, profile)
        except MigError:
            raise
        except Exception as exc:  # an NVML read failing: this workload waits, the cycle goes on
            raise MigError(f"reading the MIG GPUs failed: {exc!r}") from None

    def _place(self, node: MigNode, workload_id: str,
               want: str | GpuRequest) -> tuple[dict[str, Any], str]:
        states = node.state()
        choice: MigChoice | None
        if isinstance(want, str):
            profile, choice = want, choose(self._layout(states), want)
            if choice is None:
                raise MigError(f"no room for MIG {profile} on this machine's MIG GPUs "
                               f"({self._summary(states)})")
        else:
            found = choose_serving(self._layout(states), want)
            if found is None:
                raise MigError(f"no MIG profile that holds {want.describe()} has room on this "
                               f"machine's MIG GPUs ({self._summary(states)})")
            profile, choice = found
        by_uuid = {p.uuid: p for s in states for p in s.partitions if p.uuid}
        for gone in choice.destroy:
            old = by_uuid[gone.uuid]
            node.destroy(old.gpu_uuid, old.gi)
        state = next(s for s in states if s.uuid == choice.gpu)
        if choice.reuse is not None:
            part = by_uuid[choice.reuse.uuid]
            node.assign(part.gpu_uuid, part.gi, workload_id)
            how = "an idle partition reused"
        else:
            part = node.create(choice.gpu, profile, choice.start, owner=workload_id)
            how = f"made at memory slot {choice.start}" + (
                f" after removing {len(choice.destroy)} idle partition(s)" if choice.destroy else "")
        prof = PROFILES[state.model][profile]
        device = {"uuid": part.uuid, "gpu": part.gpu_uuid, "gpuIndex": part.gpu_index,
                  "gi": part.gi, "profile": profile, "start": part.start,
                  "fraction": prof.fraction}
        served = "" if isinstance(want, str) else "served by "
        return device, f"{served}MIG {profile} on GPU {part.gpu_index} ({how}): {part.uuid}"

    def release(self, holders: set[str]) -> None:
        """Partitions whose workload no longer runs become idle (kept for reuse)."""
        if self.node is None:
            return
        for rec in list(self.node.journal.partitions):
            if rec.get("owner") and rec["owner"] not in holders:
                self.node.assign(rec["gpu"], rec["gi"], None)

    def describe(self, names: dict[str, str]) -> list[dict[str, Any]]:
        """The MIG GPUs and their partitions for the cluster document; ``names``: workload id ->
        name (the partitions' holders)."""
        if self.node is None:
            return [{"index": g.index, "uuid": g.uuid, "model": g.model, "partitions": None}
                    for g in self.gpus]
        try:
            states = self.node.state()
        except Exception:  # NVML failing now: the document says nothing rather than failing
            states = []
        return [{"index": s.index, "uuid": s.uuid, "model": s.model, "partitions": [
            {"profile": p.profile, "start": p.start, "slots": profile_slots(s.model, p.profile),
             "uuid": p.uuid, "managed": p.managed,
             "workload": names.get(p.owner or "", p.owner), "processes": p.processes}
            for p in s.partitions]} for s in states if s.mig_enabled]


@dataclass(unsafe_hash=True, slots=True)
class RoomNow:
    """A pending MIG workload's node constraint in the cycle: the machine, where its MIG GPUs
    have room for the profile now. Without that part (``without_room``) there is none, so
    reclaim and preemption may make room by eviction (tessera.core.constraints)."""

    profile: str
    room: bool
    why: str
    dynamic: bool = False

    def allows(self, node: Node) -> bool:
        return self.room

    def score(self, node: Node) -> float:
        return 0.0

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return True

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        return "" if self.room else self.why

    def without_room(self) -> None:
        return None


def room_now(gpus: list[MigGpu], summary: str, profile: str) -> RoomNow:
    if choose(gpus, profile) is not None:
        return RoomNow(profile, True, "")
    if not gpus:
        return RoomNow(profile, False, summary)
    return RoomNow(profile, False, f"no room for MIG {profile} on this machine's MIG GPUs "
                                   f"({summary})")
