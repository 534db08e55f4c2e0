"""The entry point: one scheduling cycle over one snapshot."""

from __future__ import annotations

import time

from tessera.core.errors import InvalidRequest

from .actions import ACTIONS
from .plan import build_plan
from .session import Session, Statement
from .types import CycleConfig, Plan, Snapshot


def run_cycle(snapshot: Snapshot, config: CycleConfig | None = None) -> Plan:
    """Decide what runs: bindings, evictions, moves, and why every other pending workload waits.

    Pure: reads ``snapshot`` and returns a plan; nothing outside is changed. Raises
    ``InvalidRequest`` (naming the field) for a bad project tree, an unknown or non-leaf
    project, a gang minimum above its size, duplicate ids or running placements that do not
    fit their nodes; in that case no plan is produced at all.

    Every cycle builds its session from scratch; ``WarmCycle`` (``cycle.warm``) keeps one
    between cycles and gives the same plans.
    """
    config = check_config(config)
    started = time.perf_counter()
    session = Session(snapshot, config)
    try:
        return run_session(session, started, keep=False)
    finally:
        session.placer.close()


def check_config(config: CycleConfig | None) -> CycleConfig:
    config = config or CycleConfig()
    for name in config.actions:
        if name not in ACTIONS:
            raise InvalidRequest("config.actions", f"each must be one of {', '.join(ACTIONS)}", name)
    return config


def run_session(session: Session, started: float, keep: bool) -> Plan:
    """Run the actions on a session whose ``begin`` was just called (``started``: when its
    setup began, by ``time.perf_counter``). The whole cycle is one outer statement; with
    ``keep`` it is discarded once the plan is built, which puts the session back as ``begin``
    left it (the snapshot's state) for the next cycle's changes."""
    timings = {"setup": time.perf_counter() - started}
    outer = Statement(session)
    try:
        for name in session.config.actions:
            t0 = time.perf_counter()
            ACTIONS[name]().execute(session)
            timings[name] = time.perf_counter() - t0
        plan = build_plan(session, timings)
    finally:
        if keep:
            outer.discard()
    timings["total"] = time.perf_counter() - started  # the plan holds this dict
    return plan
