"""The entry point: one scheduling cycle over one snapshot."""

from __future__ import annotations

import time

from tessera.core.errors import InvalidRequest

from .actions import ACTIONS
from .plan import build_plan
from .session import Session
from .types import CycleConfig, Plan, Snapshot


def run_cycle(snapshot: Snapshot, config: CycleConfig | None = None) -> Plan:
    """Decide what runs: bindings, evictions, moves, and why every other pending workload waits.

    Pure: reads ``snapshot`` and returns a plan; nothing outside is changed. Raises
    ``InvalidRequest`` (naming the field) for a bad project tree, an unknown or non-leaf
    project, a gang minimum above its size, duplicate ids or running placements that do not
    fit their nodes; in that case no plan is produced at all.
    """
    config = config or CycleConfig()
    for name in config.actions:
        if name not in ACTIONS:
            raise InvalidRequest("config.actions", f"each must be one of {', '.join(ACTIONS)}", name)
    started = time.perf_counter()
    session = Session(snapshot, config)
    timings = {"setup": time.perf_counter() - started}
    try:
        for name in config.actions:
            t0 = time.perf_counter()
            ACTIONS[name]().execute(session)
            timings[name] = time.perf_counter() - t0
    finally:
        session.placer.close()
    plan = build_plan(session, timings)
    timings["total"] = time.perf_counter() - started  # the plan holds this dict
    return plan
