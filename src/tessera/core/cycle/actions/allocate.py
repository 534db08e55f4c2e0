"""allocate and backfill: place pending workloads on free resources, without evicting anyone.

``allocate`` takes workloads in fair order (the project furthest below its fair share first;
within a project by priority, then age) and places each gang all-or-nothing, provided the
project stays within its limits, non-preemptible workloads within deserved quota, and the
project (and each ancestor) within its fair share. A workload that would exceed its fair share
waits for ``backfill``, which runs last and lets it use whatever is still idle: idle GPUs are
not left unused, but they go to those within their fair share first, and over-share work is
what reclaim takes back later.
"""

from __future__ import annotations

from tessera.core.cycle.anchors import missing
from tessera.core.cycle.session import FIT, Session, Statement, Wait, WorkloadState
from tessera.core.cycle.workload_state import gang_reason
from tessera.core.fairshare import ZERO, Vector, vadd
from tessera.core.model import ResourceRequest


def gang_demand(session: Session, ws: WorkloadState) -> Vector:
    """Quota the gang's required pods count as (one pod for elastic pods of a running one).
    Kept on the workload until one of its placements changes (``WorkloadState.set_placement``):
    it depends only on which pods are unplaced and on the nodes, fixed for the session."""
    facts = ws.facts()
    total = facts.demand
    if total is None:
        total = ZERO
        for i in facts.unplaced[: max(facts.required, 1)]:
            total = vadd(total, session.quota.demand(ws.spec.pods[i]))
        facts.demand = total
    return total


Shape = tuple[tuple[object, ...], int]
"""What a workload still needs (its unplaced pods' requests and constraints, and the gang
minimum): workloads of one shape fit or fail alike, so a failed shape is not tried again."""


def shape(ws: WorkloadState) -> Shape:
    """Kept on the workload until one of its placements changes."""
    facts = ws.facts()
    found = facts.shape
    if found is None:
        spec = ws.spec
        if spec.constraints:
            found = tuple((spec.pods[i], spec.constraints[i]) for i in facts.unplaced), facts.required
        else:
            found = tuple(spec.pods[i] for i in facts.unplaced), facts.required
        if spec.anchors:  # its first pods are anchors, which end the attempt (cycle.anchors)
            found = (*found[0], ("anchors", len(missing(spec.anchors, ws.placements)))), found[1]
        facts.shape = found
    return found


class Allocate:
    name = "allocate"
    over_fair_share = False

    def candidates(self, session: Session) -> list[WorkloadState]:
        return [
            ws
            for ws in session.pending
            if ws.unplaced() and session.wait_kind(ws) != "unschedulable"
        ]

    def execute(self, session: Session) -> None:
        failed: dict[Shape, tuple[str, ResourceRequest | None]] = {}
        fair = not self.over_fair_share
        for ws in session.quota.fair_order(self.candidates(session)):
            if not ws.unplaced():
                continue
            previous = session.waits.get(ws.id)
            why = session.quota.check(ws, gang_demand(session, ws), fair=fair)
            if why is not None:
                session.wait(ws, why)
                continue
            key = shape(ws)
            if key in failed:
                session.wait(ws, self._no_room(previous, *failed[key]))
                continue

            def extra_ok(demand: Vector, ws: WorkloadState = ws) -> bool:
                return session.quota.check(ws, demand, fair=fair) is None

            stmt = Statement(session)
            placed, fail, fitted = session.place_pods(ws, extra_ok)
            if not placed:
                stmt.discard()
                reason = gang_reason(ws, fitted, fail)
                failed[key] = (reason, fail)
                session.wait(ws, self._no_room(previous, reason, fail))
                continue
            note = " beyond its fair share, on idle resources" if self.over_fair_share else ""
            message = f"placed on {session.where(placed)}{note}{session.quota.over_quota_note(ws)}"
            session.record_binding(ws, placed, self.name, message)
            stmt.commit()
            rest = ws.unplaced()
            if rest:
                request = ws.spec.pods[rest[0]]
                why = session.quota.check(ws, session.quota.demand(request), fair=fair)
                session.wait(ws, why or Wait("placement", FIT, request))

    def _no_room(self, previous: Wait | None, reason: str, request: ResourceRequest | None) -> Wait:
        if self.over_fair_share and previous is not None and previous.kind == "fair-share":
            return Wait("fair-share", f"{previous.reason}, and no idle room fits it: {reason}", request)
        return Wait("placement", reason, request)


class Backfill(Allocate):
    """Workloads held back only by fair share may use what is still idle at the end."""

    name = "backfill"
    over_fair_share = True

    def candidates(self, session: Session) -> list[WorkloadState]:
        return [
            ws
            for ws in session.pending
            if ws.unplaced() and session.wait_kind(ws) == "fair-share"
        ]
