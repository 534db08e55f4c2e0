"""A new session puts its workloads in with a few passes (``session._add_all``: the pods in one
``ClusterState.load``, quota vectors and exact sums by ``quota.enter_all``); the result
equals putting them in one by one with ``Session.add_workload``, fact for fact."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.bench.cycle import build
from tessera.core.cycle import CycleConfig
from tessera.core.cycle import session as session_module
from tessera.core.cycle.session import Session


def _facts(s: Session) -> object:
    return (
        [(wid, ws.placements, ws.pod_vectors, ws.held, ws.was_running, ws.preemptible, ws.priority,
          ws.queue_key) for wid, ws in s.workloads.items()],
        {k: list(v) for k, v in s.quota.held._held.items()},
        dict(s.state.allocations),
        [ws.id for ws in s.pending],
        {p: list(v) for p, v in s.quota.alloc.items()},
        {p: list(v) for p, v in s.quota.alloc_np.items()},
        {wid: (w.kind, w.reason) for wid, w in s.waits.items()},
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_new_session_equals_one_by_one(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = build(nodes=30, running=300, pending=60, seed=seed)
    config = CycleConfig()
    fast = Session(snap, config)
    assert len(fast.state.allocations) > 300  # the fast path ran (not the fallback)
    monkeypatch.setattr(session_module, "_add_all", lambda session, specs: False)
    slow = Session(snap, config)
    assert _facts(fast) == _facts(slow)


def test_demand_by_object_equals_demand_by_value() -> None:
    """``QuotaLedger.demand`` looks a request up by object first: objects made and dropped one
    after another (their ids reused) each get the demand of their own value."""
    snap = build(nodes=30, running=300, pending=60, seed=4)
    config = CycleConfig()
    kept = Session(snap, config).quota
    requests = [r for w in snap.workloads for r in w.pods]
    for i in range(3000):
        original = requests[(i * 7919) % len(requests)]
        made = dataclasses.replace(original)  # equal value, a new object, dropped after use
        assert kept.demand(made) == Session(snap, config).quota.demand(original) if i < 20 \
            else kept.demand(made) == kept.demand(original)
