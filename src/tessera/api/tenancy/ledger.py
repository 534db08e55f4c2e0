"""GPU accounting: intervals during which a workload held GPUs (``gpu_allocations``), and the
usage report computed from them in SQL.

An interval is (workload, project, user, GPUs, start, end): GPUs is what its binding holds
(whole devices, a fraction's share of the device, a MIG partition's fraction), end is NULL
while it still holds them. A change of allocation closes the open interval and opens another;
a suspended, pending or finished workload holds 0 and has no open interval, so suspend time
costs nothing. GPU-hours allocated over [from, to) = sum of GPUs x overlap / 3600: exact
(0.5 GPU for 2 h = 1.00).

Embedded mode writes the intervals with SQLite triggers on its workloads table, in the same
transaction as the binding (``tessera.local.accounting``); the Kubernetes API server observes
bound pods each reconcile (``observe``). Both keep them in the API server's database, so they
survive restarts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tessera.api.sqlite_db import SqliteDb

SCHEMA = """
CREATE TABLE IF NOT EXISTS gpu_allocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, workload_id TEXT NOT NULL, workload TEXT NOT NULL,
    project TEXT NOT NULL, user TEXT NOT NULL DEFAULT '', gpus REAL NOT NULL,
    start_time REAL NOT NULL, end_time REAL);
CREATE INDEX IF NOT EXISTS gpu_allocations_open ON gpu_allocations (workload_id, end_time);
CREATE INDEX IF NOT EXISTS gpu_allocations_start ON gpu_allocations (start_time);
CREATE TABLE IF NOT EXISTS gpu_used (
    workload_id TEXT NOT NULL, hour REAL NOT NULL, workload TEXT NOT NULL,
    project TEXT NOT NULL, user TEXT NOT NULL DEFAULT '', gpu_seconds REAL NOT NULL,
    start_time REAL NOT NULL, end_time REAL NOT NULL, PRIMARY KEY (workload_id, hour));
CREATE INDEX IF NOT EXISTS gpu_used_start ON gpu_used (start_time);
"""

BY = {"project": "a.project", "department": "COALESCE(d.department, '')",
      "user": "a.user", "workload": "a.workload_id"}
RETENTION_DAYS = 400.0


def retention_days() -> float:
    """``TESSERA_ACCOUNTING_RETENTION_DAYS`` (default 400): how far back a report may reach."""
    try:
        return float(os.environ.get("TESSERA_ACCOUNTING_RETENTION_DAYS") or RETENTION_DAYS)
    except ValueError:
        return RETENTION_DAYS


class Ledger(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, SCHEMA)
        self._db.execute("CREATE TABLE IF NOT EXISTS project_departments ("
                         "project TEXT PRIMARY KEY, department TEXT NOT NULL)")

    def observe(self, now: float, held: Mapping[str, tuple[str, str, str, float]]) -> None:
        """The allocations now: workload id -> (name, project, user, GPUs held). Intervals of
        workloads whose GPUs changed (or that hold none now) close at ``now``; new ones open."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                open_ = {r[0]: r[1] for r in self._db.execute(
                    "SELECT workload_id, gpus FROM gpu_allocations WHERE end_time IS NULL")}
                for wid, gpus in open_.items():
                    now_gpus = held[wid][3] if wid in held else 0.0
                    if abs(now_gpus - gpus) > 1e-12:
                        self._db.execute("UPDATE gpu_allocations SET end_time=? WHERE "
                                         "workload_id=? AND end_time IS NULL", (now, wid))
                for wid, (name, project, user, gpus) in held.items():
                    if gpus > 0 and abs(open_.get(wid, 0.0) - gpus) > 1e-12:
                        self._db.execute(
                            "INSERT INTO gpu_allocations (workload_id, workload, project, user,"
                            " gpus, start_time) VALUES (?, ?, ?, ?, ?, ?)",
                            (wid, name, project, user, gpus, now))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def open_allocations(self) -> dict[str, tuple[str, str, str, float]]:
        """Workloads holding GPUs now: id -> (name, project, user, GPUs)."""
        with self._lock:
            return {r[0]: (r[1], r[2], r[3], r[4]) for r in self._db.execute(
                "SELECT workload_id, workload, project, user, gpus FROM gpu_allocations"
                " WHERE end_time IS NULL")}

    def add_used(self, rows: list[tuple[str, str, str, str, float, float, float]]) -> None:
        """Measured use: (workload id, name, project, user, start, end, GPU-seconds used in
        [start, end)). Kept per workload and hour (``gpu_used``): a span crossing an hour is
        split in proportion, and each hour's row adds the seconds and widens its span."""
        out = []
        for wid, name, project, user, start, end, seconds in rows:
            if end <= start:
                continue
            t = start
            while t < end:
                hour = float(int(t // 3600) * 3600)
                stop = min(end, hour + 3600)
                out.append((wid, hour, name, project, user,
                            seconds * (stop - t) / (end - start), t, stop))
                t = stop
        with self._lock:  # one transaction (one fsync) for the whole reading
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO gpu_used (workload_id, hour, workload, project, user,"
                    " gpu_seconds, start_time, end_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (workload_id, hour) DO UPDATE SET"
                    " gpu_seconds = gpu_seconds + excluded.gpu_seconds,"
                    " start_time = MIN(start_time, excluded.start_time),"
                    " end_time = MAX(end_time, excluded.end_time)", out)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def report(self, since: float, until: float, by: str, now: float | None = None,
               projects: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """GPU-hours allocated and used per ``by`` key over [since, until), counting only
        ``projects`` when given (what the caller may read)."""
        now = time.time() if now is None else now
        key = BY[by]
        only = ""
        if projects is not None:
            only = " AND a.project IN (SELECT value FROM json_each(:projects))"
        names = json.dumps(sorted(projects or ()))
        with self._lock:
            allocated = self._db.execute(
                f"SELECT {key}, SUM(a.gpus * (MIN(COALESCE(a.end_time, :now), :to)"
                "  - MAX(a.start_time, :from))) / 3600.0, MIN(a.project), MIN(a.workload)"
                " FROM gpu_allocations a LEFT JOIN project_departments d ON d.project=a.project"
                " WHERE a.start_time < :to AND COALESCE(a.end_time, :now) > :from"
                f" AND a.start_time < :now{only} GROUP BY {key}",
                {"now": now, "to": until, "from": since, "projects": names}).fetchall()
            used = dict(self._db.execute(
                f"SELECT {key}, SUM(a.gpu_seconds * (MIN(a.end_time, :to)"
                "  - MAX(a.start_time, :from)) / (a.end_time - a.start_time)) / 3600.0"
                " FROM gpu_used a LEFT JOIN project_departments d ON d.project=a.project"
                f" WHERE a.start_time < :to AND a.end_time > :from{only} GROUP BY {key}",
                {"to": until, "from": since, "projects": names}).fetchall())
        rows = []
        for k, hours, project, workload in allocated:
            row: dict[str, Any] = {by: k, "gpu_hours_allocated": round(max(hours, 0.0), 6),
                                   "gpu_hours_used": None if k not in used
                                   else round(max(used[k], 0.0), 6)}
            if by == "workload":
                row.update({"name": workload, "project": project})
            rows.append(row)
        have = {r[by] for r in rows}
        for k, hours in used.items():
            if k not in have:
                rows.append({by: k, "gpu_hours_allocated": 0.0, "gpu_hours_used": round(hours, 6)})
        rows.sort(key=lambda r: (-r["gpu_hours_allocated"], str(r[by])))
        return rows

    def totals(self, now: float | None = None) -> list[tuple[str, str, float, float | None]]:
        """(project, department, GPU-hours allocated and used since the ledger began; used is
        None where nothing was measured): Prometheus."""
        now = time.time() if now is None else now
        with self._lock:
            used = dict(self._db.execute(
                "SELECT project, SUM(gpu_seconds) / 3600.0 FROM gpu_used GROUP BY project"))
            return [(r[0], r[1], r[2], used.get(r[0])) for r in self._db.execute(
                "SELECT a.project, COALESCE(d.department, ''), SUM(a.gpus * "
                "(COALESCE(a.end_time, :now) - a.start_time)) / 3600.0 FROM gpu_allocations a"
                " LEFT JOIN project_departments d ON d.project=a.project GROUP BY a.project",
                {"now": now})]
