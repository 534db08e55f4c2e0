"""The store's tables and its schema version: a database written by an earlier release is
brought up to date when the store opens it, in one transaction.

The version is the ``schema_version`` row of the ``meta`` table (the file is shared with the
token, tenancy and accounting tables, so SQLite's one ``user_version`` is not the workload
store's alone). A database without it is the layout of every release before versions
(``1`` after its two late columns are added). Each step below takes the database one version
up; all steps and the new version commit together, so a server killed during a migration
leaves the old layout untouched and the next start migrates again. A database newer than this
release is refused, never half-read.

Versions:
  1. the layout before versions (``request_text``, ``running_pods`` added if missing);
  2. the loop's own state moves out of the user's spec (13 ``_``-keys) into the ``control``
     column (``tessera.local.records.Control``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from tessera.local import faultpoints
from tessera.local.records import LEGACY_KEYS

TABLES = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS projects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    deserved REAL NOT NULL DEFAULT 0,
    gpu_limit REAL,
    over_quota_weight REAL NOT NULL DEFAULT 1,
    priority INTEGER NOT NULL DEFAULT 50,
    created REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS workloads (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    project_id INTEGER NOT NULL,
    project_name TEXT NOT NULL,
    type TEXT NOT NULL,
    phase TEXT NOT NULL,
    phase_message TEXT NOT NULL DEFAULT '',
    spec TEXT NOT NULL,
    request TEXT NOT NULL,
    preemptible INTEGER NOT NULL,
    priority_class TEXT NOT NULL,
    priority INTEGER NOT NULL,
    workers INTEGER NOT NULL DEFAULT 1,
    min_workers INTEGER NOT NULL DEFAULT 1,
    gpus_requested REAL NOT NULL DEFAULT 0,
    gpus_allocated REAL NOT NULL DEFAULT 0,
    node TEXT NOT NULL DEFAULT '',
    devices TEXT NOT NULL DEFAULT '',
    exit_code INTEGER,
    created REAL NOT NULL,
    started REAL,
    completed REAL,
    pods TEXT NOT NULL DEFAULT '[]',
    request_text TEXT NOT NULL DEFAULT '',
    running_pods INTEGER NOT NULL DEFAULT 0,
    control TEXT NOT NULL DEFAULT '{}',
    UNIQUE (project_id, name)
)""",
    "CREATE INDEX IF NOT EXISTS workloads_phase ON workloads (phase)",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_id TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS events_workload ON events (workload_id)",
]


class StoreTooNew(Exception):
    """The database was written by a newer release; the message says what to do."""


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(workloads)")}


def _to_1(db: sqlite3.Connection) -> None:
    have = _columns(db)
    for column, decl in (("request_text", "TEXT NOT NULL DEFAULT ''"),
                         ("running_pods", "INTEGER NOT NULL DEFAULT 0")):
        if column not in have:
            db.execute(f"ALTER TABLE workloads ADD COLUMN {column} {decl}")


def _to_2(db: sqlite3.Connection) -> None:
    """Control keys out of the spec into ``control``. The accounting triggers of version 1
    read ``spec._submittedBy``: dropped here, ``tessera.local.accounting.install`` creates
    them anew reading ``control``."""
    db.execute("ALTER TABLE workloads ADD COLUMN control TEXT NOT NULL DEFAULT '{}'")
    for trigger in ("accounting_insert", "accounting_update", "accounting_delete"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    rows = db.execute("SELECT id, spec FROM workloads ORDER BY seq").fetchall()
    for wid, text in rows:
        spec = json.loads(text)
        control = {LEGACY_KEYS[k]: spec.pop(k) for k in list(spec) if k in LEGACY_KEYS}
        for k in [k for k in spec if k.startswith("_")]:
            del spec[k]  # no other '_'-key was ever written; none stays in a user's spec
        db.execute("UPDATE workloads SET spec=?, control=? WHERE id=?",
                   (json.dumps(spec), json.dumps(control), wid))
        faultpoints.hit("store-migrate-row")


STEPS: list[Callable[[sqlite3.Connection], None]] = [_to_1, _to_2]
"""``STEPS[v]`` takes a database at version ``v`` to ``v + 1``."""
VERSION = len(STEPS)


def version_of(db: sqlite3.Connection) -> int:
    """The stored schema version (0: before versions, or a new file)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchall():
        return 0
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(db: sqlite3.Connection, where: str) -> int:
    """Create the tables, or bring those of an earlier release to ``VERSION``, in one
    transaction (``db`` in autocommit mode, no transaction open). The version it found."""
    db.execute("BEGIN IMMEDIATE")
    try:
        found = version_of(db)
        if found > VERSION:
            raise StoreTooNew(
                f"{where} was written by a newer tessera (store schema {found}; this release "
                f"reads up to {VERSION}): run that release, or start with another --data-dir")
        if found < VERSION:
            fresh = "workloads" not in {r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            for statement in TABLES:
                db.execute(statement)
            if not fresh:
                for step in STEPS[found:]:
                    step(db)
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                       (str(VERSION),))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return found
