"""Fair shares for the cycle, with usage history when ``CycleConfig.usage`` asks for it
(time-based fair share, ``tessera.core.usage``): the decayed GPU-seconds of each leaf project
from ``Snapshot.usage`` plus its running workloads (from ``started_at`` to now), each project
with its own (inherited) window and half-life. The share computed without history is kept
too, so each project's status says how much of its fair share usage history gave or took."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tessera.core.fairshare import FairShares, Vector, compute_fair_shares
from tessera.core.projects import ProjectTree
from tessera.core.usage import UsagePolicy, UsageRecord, decayed_usage

from .quota import QuotaLedger
from .workload_state import WorkloadState

if TYPE_CHECKING:
    from .types import Snapshot


def fair_shares(tree: ProjectTree, policy: UsagePolicy | None, workloads: Mapping[str, WorkloadState],
                quota: QuotaLedger, snapshot: Snapshot, capacity: Vector, requested: dict[str, Vector],
                unusable: float = 0.0) -> FairShares:
    plain = compute_fair_shares(tree, capacity, requested, unusable=unusable)
    if policy is None:
        return plain
    policy.validate("config.usage")
    leaves = [name for name in tree.order if tree.is_leaf(name)]
    settings = {name: tree.usage_settings(name, policy.window, policy.half_life) for name in leaves}
    records = list(snapshot.usage)
    for ws in workloads.values():
        started = ws.spec.started_at
        if ws.was_running and started is not None:
            records.append(UsageRecord(ws.project, started, snapshot.now, ws.vector()[0]))
    usage = decayed_usage(records, snapshot.now, settings)
    shares = compute_fair_shares(tree, capacity, requested, usage, policy.k, unusable)
    for leaf, amount in usage.items():
        for name in tree.chain(leaf):
            quota.usage[name] = quota.usage.get(name, 0.0) + amount
    quota.from_usage = {name: shares.gpu(name) - plain.gpu(name) for name in tree.order}
    return shares
