"""The adapters' side of time-based fair share (``tessera.core.usage``): the settings as a user
writes them, and the usage history an adapter keeps between cycles.

Settings (``--fair-share-history`` on ``tessera up`` and on ``tessera-scheduler``, Helm value
``policy.fairShareHistory``)::

    off                                   plain fair share (the default)
    window=7d,half-life=1d,k=1            any subset; the rest keep UsagePolicy's defaults

and per department (or project) ``NAME:window=1d,half-life=6h`` (``--fair-share-history-for``,
repeatable; on Kubernetes also a Project's ``usageWindowSeconds`` / ``usageHalfLifeSeconds``,
which win). Durations are seconds or a number with ``s``, ``m``, ``h``, ``d`` or ``w``. A
window or half-life ≤ 0 or above one year is refused naming the flag and the rule.

:class:`UsageHistory` remembers every running workload from one cycle to the next; when one
stops running (finished, evicted, deleted) or its GPUs change (an elastic workload grew or
shrank), the stretch it held becomes a :class:`~tessera.core.usage.UsageRecord`. Records older
than the longest window in force are dropped. The adapters write it (compacted,
``tessera.core.usage_saved``) to a store no tenant can write every ``save-every`` seconds and
read it back at start (docs/scheduling.md).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tessera.core import usage_saved
from tessera.core.errors import InvalidRequest
from tessera.core.model import COMPUTE_FULL, Node
from tessera.core.projects import Project, ProjectTree
from tessera.core.usage import UsagePolicy, UsageRecord, check_seconds
from tessera.core.workloads import Workload

if TYPE_CHECKING:
    from tessera.core.cycle.types import Snapshot

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smhdw]?)\s*$")
_KEYS = {"window": "window", "half-life": "half_life", "half_life": "half_life", "k": "k",
         "save-every": "save_every", "save_every": "save_every"}
SAVE_EVERY = 30.0
"""How often (seconds) an adapter writes the history to its store (``save-every=``); a crash
loses at most this much of the stretches that ended since the last write."""

Running = dict[str, tuple[str, float, float]]
"""Workload id -> (project, since, GPUs) of the workloads seen running."""
Override = tuple[float | None, float | None]
"""(window, half-life) of one department or project; None: inherited."""


def duration(field: str, text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``6h``, ``7d`` or ``2w``: more than 0 and at most a
    year, else refused naming ``field``."""
    m = _DURATION.match(text)
    if m is None:
        if text.strip().startswith("-"):
            raise InvalidRequest(field, "must be more than 0 seconds", text)
        raise InvalidRequest(field, "must be a duration: seconds, or a number with s, m, h, d or w "
                             "(e.g. 6h, 7d)", text)
    return check_seconds(field, float(m.group(1)) * UNITS[m.group(2) or "s"])


def _pairs(flag: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise InvalidRequest(flag, "must be off or key=value pairs of window, half-life, k and "
                                 "save-every (e.g. window=7d,half-life=1d,k=1)", text)
        out[_KEYS[key]] = value.strip()
    return out


def parse_policy(flag: str, text: str | None) -> UsagePolicy | None:
    """The cluster's setting: None (plain fair share) for empty or ``off``."""
    if text is None or text.strip().lower() in ("", "off", "none", "false"):
        return None
    pairs = _pairs(flag, text)
    kw: dict[str, float] = {}
    for key, value in pairs.items():
        if key == "save_every":
            continue  # parse_save_every
        if key == "k":
            try:
                kw["k"] = float(value)
            except ValueError:
                raise InvalidRequest(f"{flag} k", "must be a number from 0 to 100", value) from None
        else:
            kw[key] = duration(f"{flag} {key.replace('_', '-')}", value)
    policy = UsagePolicy(**kw)
    policy.validate(flag)
    return policy


def parse_save_every(flag: str, text: str | None) -> float:
    """``save-every=`` of the cluster's setting: how often the history is written (seconds, more
    than 0, at most a day); :data:`SAVE_EVERY` when not given."""
    if text is None or text.strip().lower() in ("", "off", "none", "false"):
        return SAVE_EVERY
    value = _pairs(flag, text).get("save_every")
    if value is None:
        return SAVE_EVERY
    seconds = duration(f"{flag} save-every", value)
    if seconds > 86400:
        raise InvalidRequest(f"{flag} save-every", "must be at most one day (86400 seconds)", value)
    return seconds


def parse_override(flag: str, text: str) -> tuple[str, Override]:
    """``NAME:window=1d,half-life=6h`` (k is cluster-wide only)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise InvalidRequest(flag, "must be NAME:window=...,half-life=... (a department or project)",
                             text)
    pairs = _pairs(flag, rest)
    for key in ("k", "save_every"):
        if key in pairs:
            raise InvalidRequest(f"{flag} {name}", f"{key.replace('_', '-')} is cluster-wide; a "
                                 "department sets only window and half-life", text)
    window = pairs.get("window")
    half = pairs.get("half_life")
    return name, (None if window is None else duration(f"{flag} {name} window", window),
                  None if half is None else duration(f"{flag} {name} half-life", half))


def with_overrides(projects: Sequence[Project], overrides: Mapping[str, Override]) -> tuple[Project, ...]:
    """The projects with each named one's window and half-life set, unless it sets its own."""
    if not overrides:
        return tuple(projects)
    out = []
    for p in projects:
        o = overrides.get(p.name)
        if o is not None:
            window = p.usage_window if p.usage_window is not None else o[0]
            half = p.usage_half_life if p.usage_half_life is not None else o[1]
            p = dataclasses.replace(p, usage_window=window, usage_half_life=half)
        out.append(p)
    return tuple(out)


def held_gpus(w: Workload, nodes: Mapping[str, Node]) -> float:
    """GPUs a running workload's placed pods hold, counted as quota counts them."""
    total = 0.0
    for p in w.placements:
        if p is None:
            continue
        if p.gpus is not None:
            total += p.gpus
        elif p.exclusive:
            total += len(p.devices)
        else:
            node = nodes.get(p.node)
            if node is None:
                continue
            memory = {g.index: g.memory for g in node.gpus}
            time = p.compute / COMPUTE_FULL
            total += sum(max(b / memory[i], time) if memory.get(i) else time
                         for i, b in zip(p.devices, p.request_bytes, strict=True))
    return total


class UsageHistory:
    """What ran, kept across cycles for ``Snapshot.usage``; see the module text. An adapter
    writes :meth:`saved` to its store every ``save_every`` seconds and gives it back to
    :meth:`restore` at start (``tessera.core.usage_saved``)."""

    def __init__(self, policy: UsagePolicy | None, overrides: Mapping[str, Override] | None = None,
                 save_every: float = SAVE_EVERY) -> None:
        if policy is not None:
            policy.validate("fair share history")
        self.policy = policy
        self.overrides = dict(overrides or {})
        self.save_every = save_every
        self.records: list[UsageRecord] = []
        self._running: Running = {}
        """Workload id -> (project, since, GPUs) as last seen running."""
        self._projects: tuple[Project, ...] = ()
        self._last_save: float | None = None
        self._restored: tuple[set[str], float] = (set(), 0.0)
        """Workloads running when the restored record was written, not seen since, and when."""

    @property
    def running(self) -> Mapping[str, tuple[str, float, float]]:
        """Workload id -> (project, since, GPUs) of the workloads last seen running."""
        return self._running

    def horizon(self, projects: Sequence[Project]) -> float:
        """The longest window in force: older records can never count again."""
        assert self.policy is not None
        windows = [self.policy.window, *(p.usage_window for p in projects if p.usage_window)]
        return max(float(w) for w in windows if w is not None)

    def _ended(self, wid: str, now: float) -> float:
        """When a run that is gone ended: now, or, if it was last known from the restored record
        (it stopped while no scheduler watched), when that record was written."""
        unseen, saved = self._restored
        return saved if wid in unseen else now

    def observe(self, workloads: Sequence[Workload], nodes: Sequence[Node], now: float) -> None:
        """Turn what stopped or was resized since the last call into records. The cycle counts a
        running workload as its GPUs now from ``started_at``; a resize from g to g' at t adds a
        record of g − g' from ``started_at`` to t (negative when it grew), so the sum is what it
        really held."""
        by_name = {n.name: n for n in nodes}
        seen: Running = {}
        for w in workloads:
            if not w.running or w.started_at is None:
                continue
            gpus = held_gpus(w, by_name)
            before = self._running.get(w.id)
            if before is not None and before[0] == w.project and before[1] == w.started_at:
                if not math.isclose(before[2], gpus, abs_tol=1e-9):
                    self.records.append(UsageRecord(w.project, w.started_at, now, before[2] - gpus))
            elif before is not None:  # restarted or moved to another project: the old run ended
                self.records.append(UsageRecord(before[0], before[1], self._ended(w.id, now), before[2]))
            seen[w.id] = (w.project, w.started_at, gpus)
        for wid, (project, since, gpus) in self._running.items():
            if wid not in seen:
                self.records.append(UsageRecord(project, since, self._ended(wid, now), gpus))
        self._running = seen
        self._restored = (set(), 0.0)

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the history's records (and the overrides) for this cycle."""
        if self.policy is None:
            return snapshot
        projects = with_overrides(snapshot.projects, self.overrides)
        self._projects = projects
        self.observe(snapshot.workloads, snapshot.nodes, snapshot.now)
        oldest = snapshot.now - self.horizon(projects)
        self.records = [r for r in self.records if r.end > oldest]
        return dataclasses.replace(snapshot, projects=projects, usage=(*snapshot.usage, *self.records))

    # -- kept across restarts (tessera.core.usage_saved) -------------------------------------------

    def _settings(self) -> tuple[dict[str, tuple[float, float]], tuple[float, float]]:
        assert self.policy is not None
        default = (self.policy.window, self.policy.half_life)
        try:
            tree = ProjectTree(self._projects)
        except InvalidRequest:  # the cycle refuses such a tree too; bucket by the defaults
            return {}, default
        return {name: tree.usage_settings(name, *default) for name in tree.order}, default

    def take(self, now: float, force: bool = False) -> tuple[list[UsageRecord], Running] | None:
        """What to write now (copies), or None: off, or written less than ``save_every`` seconds
        ago and not ``force`` (at a stop). Then :meth:`compacted` (may run on another thread)
        and :meth:`keep`."""
        if self.policy is None or (not force and self._last_save is not None
                                   and now - self._last_save < self.save_every):
            return None
        self._last_save = now
        return list(self.records), dict(self._running)

    def compacted(self, records: list[UsageRecord], running: Running, now: float,
                  coarser: int = 0) -> tuple[list[UsageRecord], dict[str, Any]]:
        """``records`` compacted and the record to write (``tessera.core.usage_saved``);
        ``coarser``: buckets 2**coarser times longer (a store that cannot hold the record)."""
        settings, default = self._settings()
        packed = usage_saved.compact(records, now, settings, default, coarser)
        return packed, usage_saved.export(packed, running, now)

    def keep(self, taken: list[UsageRecord], packed: list[UsageRecord]) -> None:
        """Hold ``packed`` in place of the ``taken`` records still held (what a restart reads
        back is then what this process decides with); records added since stay as they are."""
        gone = {id(r) for r in taken}
        self.records = [*packed, *(r for r in self.records if id(r) not in gone)]

    def saved(self, now: float, force: bool = False) -> dict[str, Any] | None:
        """:meth:`take`, :meth:`compacted` and :meth:`keep` at once: the record to write, or None."""
        taken = self.take(now, force)
        if taken is None:
            return None
        packed, record = self.compacted(*taken, now)
        self.keep(taken[0], packed)
        return record

    def restore(self, data: object, now: float) -> str | None:
        """Start from a record :meth:`saved` wrote. Returns None, or why the record was ignored
        (the history then starts empty; the adapter logs it)."""
        if self.policy is None:
            return None
        try:
            records, running, saved = usage_saved.restore(data, now)
        except ValueError as exc:
            self.records, self._running = [], {}
            return str(exc)
        self.records, self._running = records, running
        self._restored = (set(running), saved)
        return None

    def restore_from(self, load: Callable[[], object], form: str, where: str,
                     now: float) -> tuple[bool, str]:
        """Restore from what ``load()`` decodes (a record in ``form``, read from ``where``):
        (True, what was restored) or (False, why it was ignored, the history starting empty).
        Both stores log the line; ``load`` may raise ValueError, OSError or EOFError."""
        try:
            record = load()
        except (ValueError, OSError, EOFError) as exc:
            why: str | None = f"not {form} ({exc})"
        else:
            why = self.restore(record, now)
        if why is None:
            return True, (f"usage history: restored from {where} ({len(self.records)} records, "
                          f"{len(self.running)} running)")
        return False, f"usage history: {where} ignored: {why}; starting empty"
