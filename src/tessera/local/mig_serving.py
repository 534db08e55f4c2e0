"""Embedded mode's shares served by MIG partitions (``tessera up --mig-serves-shares``,
docs/mig.md), on the core's path as on Kubernetes.

A share the scheduling cycle left waiting for room (a wait in :data:`SERVABLE_WAITS`) becomes a
candidate. From the next cycle on, while it is pending, it is asked of the cycle as a MIG
workload of the smallest profile that holds it and has room now (``choose_serving``), counted
as that profile's fraction: the cycle's quota, limit, fair share and order apply to it as to a
workload that named the profile. When no profile has room it stays a share and its wait says
why no partition serves it either. The control loop places the partition when the cycle binds
it (tessera.local.control).
"""

from __future__ import annotations

from tessera.core.mig import PROFILES, SERVABLE_WAITS, MigGpu, choose_serving
from tessera.core.model import GpuRequest


class ServedShares:
    def __init__(self) -> None:
        self.candidates: set[str] = set()
        """Pending shares a partition may serve (they waited for room)."""
        self.asked: dict[str, str] = {}
        """This cycle: workload id -> the profile it is asked as."""
        self.no_room: dict[str, str] = {}
        """This cycle: workload id -> why no partition can serve it now."""

    def begin(self, pending: set[str]) -> None:
        """A new cycle: candidates that are no longer pending are dropped."""
        self.candidates &= pending
        self.asked.clear()
        self.no_room.clear()

    def ask(self, workload_id: str, request: GpuRequest, gpus: list[MigGpu],
            summary: str) -> tuple[str, float] | None:
        """(profile, fraction) a candidate is asked as in this cycle; None: it stays a share."""
        if workload_id not in self.candidates:
            return None
        found = choose_serving(gpus, request)
        if found is None:
            self.no_room[workload_id] = (f"no MIG profile that holds {request.describe()} has "
                                         f"room on this machine's MIG GPUs ({summary})")
            return None
        profile, choice = found
        model = next(g.model for g in gpus if g.key == choice.gpu)
        self.asked[workload_id] = profile
        return profile, PROFILES[model][profile].fraction

    def waited(self, workload_id: str, kind: str) -> None:
        """The cycle left it waiting with ``kind``: a candidate from the next cycle on when it
        waited for room (the caller checks that a partition could serve it at all)."""
        if kind in SERVABLE_WAITS:
            self.candidates.add(workload_id)

    def reason(self, workload_id: str, kind: str, reason: str) -> str:
        """Its wait in words: with why no partition serves it either, where that was asked."""
        why = self.no_room.get(workload_id)
        if why is not None and kind in SERVABLE_WAITS:
            return f"{reason}; nor on a MIG GPU: {why}"
        return reason
