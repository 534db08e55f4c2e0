"""A session kept between cycles: each cycle applies only what changed in the snapshot.

Building a session from scratch puts every running pod on its node (checking that it fits),
counts quota, and scores every node again for every request shape: at 5,000 nodes and 50,000
running workloads that is most of a cycle's setup. Between two cycles little changes (the last
plan's bindings and evictions, some arrivals and finishes), so ``WarmCycle`` keeps the session:

- the cycle runs as one outer statement that is discarded once the plan is built, which puts
  the cluster state, the workloads and the quota ledger back to the snapshot as it was;
- the next snapshot is compared with the last one by object identity (``map``/``compress``
  over the workloads, loops in C: adapters keep a workload nothing happened to as the same
  object), and only the objects new and the ids gone are looked at: a new object equal to the one it
  replaces is unchanged, a workload gone or changed leaves the cluster state, a new or changed
  one enters it, running pods checked as a new session checks them;
- ``Session.begin`` then starts the cycle: quota from per-project sums kept exactly (integer
  multiples of 2**-1074, ``QuotaLedger.enter``/``leave``) and rounded once, so the numbers
  equal a new session's to the last bit whatever came and went; the pending list, the
  never-fits reasons and the fair shares;
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
from itertools import compress, filterfalse
from operator import attrgetter, is_not

from tessera.core.placement.policies import make_policy
from tessera.core.workloads import Workload

from .kept_running import note_changed
from .run import check_config, run_session
from .session import Session
from .types import CycleConfig, Plan, Snapshot
from .validation import leaf_projects, plainly_valid, validate_workload


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
            return _apply(session, self._specs, last, snapshot)
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


_id_of = attrgetter("id")


def _apply(session: Session, specs: dict[str, Workload], last: Snapshot, snapshot: Snapshot) -> Session | None:
    """The snapshot's changes applied: workloads gone, changed (taken out and put back in at
    the same place of ``session.workloads``, which stays in id order) and new ones.

    An adapter keeps a workload nothing happened to as the same object, so the objects new
    since the last snapshot are picked out with ``map``/``compress`` (C loops over the 60,000
    workloads, no Python frame per workload) and only they, and the ids gone, are looked at,
    in the snapshots' order as the per-workload loop this replaces found them."""
    now = snapshot.workloads
    ids = list(map(_id_of, now))
    present = set(ids)
    if len(present) != len(ids):
        return None  # duplicate ids: the new session names the field
    changed: list[Workload] = []
    arrived: list[Workload] = []
    same: list[Workload] = []
    for w in compress(now, map(is_not, map(specs.get, ids), now)):
        prev = specs.get(w.id)
        if prev is None:
            arrived.append(w)
        elif _unchanged(prev, w):
            same.append(w)
        else:
            changed.append(w)
    gone = (list(filterfalse(present.__contains__, map(_id_of, last.workloads)))
            if len(ids) - len(arrived) < len(specs) else [])
    leaves = leaf_projects(session.tree)  # (validation.plainly_valid: the usual workload)
    for w in changed:
        if not plainly_valid(w, leaves):
            validate_workload(w, session.tree)
    for w in arrived:
        if not plainly_valid(w, leaves):
            validate_workload(w, session.tree)
    for wid in gone:  # in the last snapshot's order
        session.remove_workload(wid)
        del specs[wid]
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
    note_changed(session, [*gone, *(w.id for w in changed), *(w.id for w in arrived)])
    # (kept per-session indexes: kept_running)
    session.begin(snapshot)
    for group in (same, changed, arrived):
        for w in group:
            specs[w.id] = w
    return session


def _unchanged(old: Workload, new: Workload) -> bool:
    """A workload with node constraints is unchanged only as the same object: a constraint
    may compare equal to last cycle's and still answer from this cycle's view of the cluster
    (Kubernetes predicates: a node cordoned or tainted since)."""
    return old is new or (not new.constraints and old == new)
