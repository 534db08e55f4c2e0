"""Users, access rules, departments and the audit trail: tables in the API server's SQLite
database (``tessera.db`` in its data directory), the same for both backends.

Every change is one transaction (a refused request writes nothing); ``version`` counts changes
to rules and departments so the policy's compiled index knows when to rebuild.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.api.sqlite_db import SqliteDb

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT, must_change INTEGER NOT NULL DEFAULT 0,
    source TEXT NOT NULL DEFAULT 'local', created REAL NOT NULL, created_by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS access_rules (
    id INTEGER PRIMARY KEY AUTOINCREMENT, subject_type TEXT NOT NULL, subject TEXT NOT NULL,
    role TEXT NOT NULL, scope_type TEXT NOT NULL, scope TEXT NOT NULL, created REAL NOT NULL,
    created_by TEXT NOT NULL, UNIQUE (subject_type, subject, role, scope_type, scope));
CREATE INDEX IF NOT EXISTS access_rules_subject ON access_rules (subject_type, subject);
CREATE TABLE IF NOT EXISTS departments (
    name TEXT PRIMARY KEY, deserved REAL NOT NULL DEFAULT 0, gpu_limit REAL,
    over_quota_weight REAL NOT NULL DEFAULT 1, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS project_departments (
    project TEXT PRIMARY KEY, department TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, subject TEXT NOT NULL,
    source TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, action TEXT NOT NULL,
    status INTEGER NOT NULL, result TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_time ON audit (time);
"""


@dataclass(frozen=True)
class Rule:
    id: int
    subject_type: str
    subject: str
    role: str
    scope_type: str
    scope: str
    created: float
    created_by: str

    def doc(self) -> dict[str, Any]:
        """Run:ai's access rule shape (ids are strings here, roles by name)."""
        return {"id": str(self.id), "subjectType": self.subject_type, "subjectId": self.subject,
                "roleName": self.role, "scopeType": self.scope_type,
                "scopeId": self.scope, "scopeName": self.scope or "cluster",
                "createdAt": _iso(self.created), "createdBy": self.created_by}


@dataclass(frozen=True)
class Department:
    name: str
    deserved: float
    limit: float | None
    over_quota_weight: float


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class TenancyStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        super().__init__(path, SCHEMA)
        self.version = 0
        """Bumped on every change to rules, departments or projects' departments."""

    # -- users -----------------------------------------------------------------------------------

    def user(self, name: str) -> tuple[str, str | None, bool, str, float] | None:
        rows = self._query("SELECT name, password_hash, must_change, source, created FROM users"
                           " WHERE name=?", (name,))
        return None if not rows else (rows[0][0], rows[0][1], bool(rows[0][2]), rows[0][3],
                                      rows[0][4])

    def users(self) -> list[tuple[str, bool, str, float, str]]:
        return [(r[0], bool(r[1]), r[2], r[3], r[4]) for r in self._query(
            "SELECT name, must_change, source, created, created_by FROM users ORDER BY name")]

    def add_user(self, name: str, password_hash: str | None, must_change: bool, source: str,
                 by: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO users (name, password_hash, must_change, source, created,"
                       " created_by) VALUES (?, ?, ?, ?, ?, ?)",
                       (name, password_hash, int(must_change), source, time.time(), by))

    def set_password(self, name: str, password_hash: str, must_change: bool) -> None:
        with self.transaction() as db:
            db.execute("UPDATE users SET password_hash=?, must_change=? WHERE name=?",
                       (password_hash, int(must_change), name))

    def delete_user(self, name: str) -> bool:
        """The user and its rules, in one transaction."""
        with self.transaction() as db:
            cur = db.execute("DELETE FROM users WHERE name=?", (name,))
            db.execute("DELETE FROM access_rules WHERE subject_type='user' AND subject=?", (name,))
        self.version += 1
        return cur.rowcount > 0

    # -- access rules ----------------------------------------------------------------------------

    def rules(self) -> list[Rule]:
        return [Rule(*r) for r in self._query("SELECT * FROM access_rules ORDER BY id")]

    def rules_of(self, subjects: Sequence[tuple[str, str]]) -> list[Rule]:
        out: list[Rule] = []
        for kind, name in subjects:
            out += [Rule(*r) for r in self._query(
                "SELECT * FROM access_rules WHERE subject_type=? AND subject=?", (kind, name))]
        return out

    def rule(self, rule_id: int) -> Rule | None:
        rows = self._query("SELECT * FROM access_rules WHERE id=?", (rule_id,))
        return Rule(*rows[0]) if rows else None

    def add_rule(self, subject_type: str, subject: str, role: str, scope_type: str, scope: str,
                 by: str) -> Rule:
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO access_rules (subject_type, subject, role, scope_type, scope,"
                " created, created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (subject_type, subject, role, scope_type, scope, time.time(), by))
            rid = int(cur.lastrowid or 0)
        self.version += 1
        rule = self.rule(rid)
        assert rule is not None
        return rule

    def add_rules_bulk(self, rows: Sequence[tuple[str, str, str, str, str]]) -> None:
        """For benchmarks and imports: many rules in one transaction."""
        now = time.time()
        with self.transaction() as db:
            db.executemany("INSERT OR IGNORE INTO access_rules (subject_type, subject, role,"
                           " scope_type, scope, created, created_by) VALUES (?,?,?,?,?,?,?)",
                           [(*r, now, "bench") for r in rows])
        self.version += 1

    def delete_rule(self, rule_id: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM access_rules WHERE id=?", (rule_id,))
        self.version += 1

    def count_cluster_admins(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM access_rules WHERE role='admin' AND"
                               " scope_type='cluster'")[0][0])

    # -- departments -----------------------------------------------------------------------------

    def departments(self) -> list[Department]:
        return [Department(*r) for r in self._query(
            "SELECT name, deserved, gpu_limit, over_quota_weight FROM departments ORDER BY name")]

    def department(self, name: str) -> Department | None:
        rows = self._query("SELECT name, deserved, gpu_limit, over_quota_weight FROM departments"
                           " WHERE name=?", (name,))
        return Department(*rows[0]) if rows else None

    def put_department(self, d: Department, create: bool) -> None:
        with self.transaction() as db:
            if create:
                db.execute("INSERT INTO departments (name, deserved, gpu_limit, over_quota_weight,"
                           " created) VALUES (?, ?, ?, ?, ?)",
                           (d.name, d.deserved, d.limit, d.over_quota_weight, time.time()))
            else:
                db.execute("UPDATE departments SET deserved=?, gpu_limit=?, over_quota_weight=?"
                           " WHERE name=?", (d.deserved, d.limit, d.over_quota_weight, d.name))
        self.version += 1

    def delete_department(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM departments WHERE name=?", (name,))
            db.execute("DELETE FROM access_rules WHERE scope_type='department' AND scope=?",
                       (name,))
        self.version += 1

    def project_departments(self) -> dict[str, str]:
        return dict(self._query("SELECT project, department FROM project_departments"))

    def set_project_department(self, project: str, department: str | None) -> None:
        with self.transaction() as db:
            if department is None:
                db.execute("DELETE FROM project_departments WHERE project=?", (project,))
            else:
                db.execute("INSERT OR REPLACE INTO project_departments (project, department)"
                           " VALUES (?, ?)", (project, department))
        self.version += 1

    def forget_project(self, project: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM project_departments WHERE project=?", (project,))
            db.execute("DELETE FROM access_rules WHERE scope_type='project' AND scope=?",
                       (project,))
        self.version += 1

    # -- audit -----------------------------------------------------------------------------------

    def append_audit(self, subject: str, source: str, method: str, path: str, action: str,
                     status: int, result: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO audit (time, subject, source, method, path, action, status,"
                       " result) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (time.time(), subject, source, method, path, action, status, result))

    def audit(self, since: float, until: float, limit: int) -> list[dict[str, Any]]:
        rows = self._query("SELECT id, time, subject, source, method, path, action, status,"
                           " result FROM audit WHERE time >= ? AND time < ? ORDER BY id DESC"
                           " LIMIT ?", (since, until, limit))
        return [{"id": r[0], "timestamp": _iso(r[1]), "time": r[1], "subject": r[2],
                 "source": r[3], "method": r[4], "path": r[5], "action": r[6],
                 "httpStatus": r[7], "result": r[8]} for r in rows]


def groups_json(groups: Sequence[str]) -> str:
    return json.dumps(sorted(set(groups)))
