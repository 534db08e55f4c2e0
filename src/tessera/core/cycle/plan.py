"""The cycle's outcome as a ``Plan``: bindings, evictions and moves as the session recorded
them, and for every workload still waiting the reason in words, the placement part computed
once per request from the final state (``FitExplainer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.core.constraints import NodeConstraint

from .anchors import missing
from .explain import FitExplainer
from .quota import vector_of
from .types import Binding, Plan, PodBinding, ProjectStatus, Waiting
from .workload_state import FIT, Wait, WorkloadState

if TYPE_CHECKING:
    from .session import Session


def build_plan(session: Session, timings: dict[str, float]) -> Plan:
    """The plan of a finished session (``timings`` is kept as given, not copied)."""
    return Plan(bindings(session), tuple(session.evictions.values()),
                tuple(session.moves.values()), waiting(session), project_statuses(session),
                timings)


def bindings(session: Session) -> tuple[Binding, ...]:
    return tuple(
        Binding(
            wid,
            session.workloads[wid].project,
            b.action,
            tuple(PodBinding(i, p, session.mig_choices.get((wid, i))) for i, p in sorted(b.pods.items())),
            b.message,
            b.after,
        )
        for wid, b in session.bindings.items()
    )


def waiting(session: Session) -> tuple[Waiting, ...]:
    """Why each pending workload with pods unplaced still waits, in words."""
    waiting = []
    explainer = FitExplainer(session.state)
    explainers: dict[NodeConstraint, tuple[FitExplainer | None, str, int]] = {}
    for ws in session.pending:
        if not ws.unplaced():
            continue
        wait = session.waits.get(ws.id) or Wait("placement", "not tried this cycle")
        reason = wait.reason
        if wait.request is not None and FIT in reason:
            constraint = session.constraint_for(ws, wait.request)
            if constraint is None:
                reason = reason.replace(FIT, explainer.explain(wait.request))
            else:
                found = explainers.get(constraint)
                if found is None:
                    # The nodes it may use as the cycle ends: static and dynamic filter.
                    subset = [ns for ns in session.state.nodes if session.node_allowed(constraint, ns)]
                    refused = constraint.refusals(session.nodes)
                    head = f"0/{len(session.nodes)} nodes are available: {refused}" if refused else ""
                    found = explainers[constraint] = (
                        FitExplainer(session.state, subset, explainer) if subset else None, head, len(subset))
                fit, head, usable = found
                if fit is None:
                    reason = reason.replace(FIT, head or "no node is allowed")
                else:
                    sep = "; " if head else ""
                    reason = reason.replace(
                        FIT, f"{head}{sep}on the {usable} node(s) it may use: " + fit.explain(wait.request))
        waiting.append(Waiting(ws.id, ws.project, wait.kind, _elastic_prefix(ws, reason)))
    return tuple(waiting)


def project_statuses(session: Session) -> dict[str, ProjectStatus]:
    return {
        name: ProjectStatus(
            name,
            session.quota.shares.share[name],
            session.quota.shares.requested[name],
            session.quota.allocated_before[name],
            vector_of(session.quota.alloc[name]),
            session.quota.from_usage.get(name, 0.0),
            session.quota.usage.get(name, 0.0),
        )
        for name in session.tree.order
    }


def _elastic_prefix(ws: WorkloadState, reason: str) -> str:
    if ws.placed_count() and ws.placed_count() >= ws.spec.gang_min and not missing(ws.spec.anchors, ws.placements):
        return f"{len(ws.unplaced())} elastic pod(s) wait: {reason}"
    return reason
