"""A session kept between cycles: each cycle applies only what changed in the snapshot.

Building a session from scratch puts every running pod on its node (checking that it fits),
counts quota, and scores every node again for every request shape: at 5,000 nodes and 50,000
running workloads that is most of a cycle's setup. Between two cycles little changes (the last
plan's bindings and evictions, some arrivals and finishes), so ``WarmCycle`` keeps the session:

- the cycle runs as one outer statement that is discarded once the plan is built, which puts
  the cluster state, the workloads and the quota ledger back to the snapshot as it was;
- the next snapshot is compared with the last one by workload (the same object, or an equal
  one, is unchanged): a workload gone or changed leaves the cluster state, a new or changed one
  enters it, running pods checked as a new session checks them;
- ``Session.begin`` then starts the cycle: quota counted again from the kept per-pod amounts in
  workload id order (float sums in the same order as a new session's, so the numbers are
  equal to the last bit), the pending list, the never-fits reasons and the fair shares;
- the placer is kept: its per-request node rankings rescore only the nodes whose state changed
  (``ClusterState.subscribe``), and its score memo stays valid (keyed by node state). What it
  learnt per node constraint is dropped every cycle, and a workload with constraints counts as
  unchanged only as the same object: an adapter's constraint may compare equal to last cycle's
  and answer from this cycle's view of the cluster (Kubernetes: a node cordoned since).

A change to the nodes, the projects, the MIG layout or the configuration, a randomised
placement policy, or a snapshot the session refuses builds a new session (and raises what
``run_cycle`` raises). The plan is the one ``run_cycle`` gives for the same snapshot: a
property test applies random changes and compares (tests/core/cycle/test_warm.py).
"""

from __future__ import annotations

import random
import time

from tessera.core.placement.policies import make_policy
from tessera.core.workloads import Workload

from .kept_running import note_changed
from .run import check_config, run_session
from .session import Session
from .types import CycleConfig, Plan, Snapshot
from .validation import validate_workload


class WarmCycle:
    """``run(snapshot)`` gives ``run_cycle(snapshot, config)``'s plan, keeping its session.
    One cycle at a time (adapters run their cycles one after another)."""

    def __init__(self, config: CycleConfig | None = None) -> None:
        self.config = check_config(config)
        self._session: Session | None = None
        self._last: Snapshot | None = None
        self._specs: dict[str, Workload] = {}
        self.warm = False
        """Whether the last ``run`` reused the session (False: built from scratch)."""

    def run(self, snapshot: Snapshot, config: CycleConfig | None = None) -> Plan:
        """``config``: this cycle's (default: the one given at construction); a change
        builds a new session."""
        started = time.perf_counter()
        if config is not None and config != self.config:
            self.close()
            self.config = check_config(config)
        session = self._update(snapshot)
        self.warm = session is not None
        if session is None:
            self.close()
            session = Session(snapshot, self.config)
        if not self.warm:
            self._specs = {w.id: w for w in snapshot.workloads}
        self._session, self._last = session, snapshot
        randomised = make_policy(self.config.policy, random.Random(0)).randomised
        try:
            return run_session(session, started, keep=not randomised)
        except BaseException:
            self.close()
            raise
        finally:
            if randomised:
                self.close()

    def close(self) -> None:
        """Forget the kept session (the next cycle builds a new one)."""
        if self._session is not None:
            self._session.placer.close()
        self._session, self._last, self._specs = None, None, {}

    def _update(self, snapshot: Snapshot) -> Session | None:
        """The kept session with ``snapshot``'s changes applied and ``begin`` called, or None
        where a new session must be built."""
        session, last = self._session, self._last
        if session is None or last is None or not _same_frame(last, snapshot):
            return None
        try:
            return _apply(session, self._specs, snapshot)
        except Exception:
            # Half-applied: drop it; a new session gives the error (or the plan) run_cycle does.
            self.close()
            return None


def _same_frame(last: Snapshot, snapshot: Snapshot) -> bool:
    """Nodes, projects and MIG layout unchanged (compared by identity first, then value)."""
    return (_same(last.nodes, snapshot.nodes) and _same(last.projects, snapshot.projects)
            and (last.mig is snapshot.mig or last.mig == snapshot.mig))


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return a is b or (len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True)))


def _apply(session: Session, specs: dict[str, Workload], snapshot: Snapshot) -> Session | None:
    """One pass over the snapshot: workloads gone, changed (taken out and put back in at the
    same place of ``session.workloads``, which stays in id order) and new ones."""
    new = {w.id: w for w in snapshot.workloads}
    if len(new) != len(snapshot.workloads):
        return None  # duplicate ids: the new session names the field
    changed: list[Workload] = []
    arrived: list[Workload] = []
    get = specs.get
    for w in [w for wid, w in new.items() if get(wid) is not w]:  # most are the same objects
        old = get(w.id)
        if old is None:
            arrived.append(w)
        elif not _unchanged(old, w):
            changed.append(w)
    for w in changed:
        validate_workload(w, session.tree)
    for w in arrived:
        validate_workload(w, session.tree)
    if len(new) - len(arrived) < len(specs):
        for wid in [wid for wid in specs if wid not in new]:
            session.remove_workload(wid)
    for w in changed:
        session.remove_workload(w.id, keep_slot=True)
    for w in changed:
        session.add_workload(w)
    for w in arrived:
        session.add_workload(w)
    if arrived:
        workloads = session.workloads
        session.workloads = {wid: workloads[wid] for wid in sorted(workloads)}
    session.placer.forget_constraints()
    note_changed(session, [*(wid for wid in specs if wid not in new), *(w.id for w in changed),
                           *(w.id for w in arrived)])  # kept per-session indexes (kept_running)
    session.begin(snapshot)
    specs.clear()
    specs.update(new)
    return session


def _unchanged(old: Workload, new: Workload) -> bool:
    """A workload with node constraints is unchanged only as the same object: a constraint
    may compare equal to last cycle's and still answer from this cycle's view of the cluster
    (Kubernetes predicates: a node cordoned or tainted since)."""
    return old is new or (not new.constraints and old == new)
