"""Durable state of embedded mode: one SQLite database in WAL mode: the listing built in SQL and
the project, workload and event tables (their schema and its versions: store_schema.py).

Every change is committed before the API answers, so a server killed at any moment restarts with
every project and workload it acknowledged. One connection guarded by a lock serves the API's
worker threads and the control loop; local scale (thousands of workloads) does not need more.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.api.backend import WorkloadQuery
from tessera.api.sqlite_db import SqliteDb
from tessera.local.records import ACTIVE_PHASES, Control, Phase, PodPhase, PodRecord
from tessera.local.store_schema import migrate

_ISO = "'%Y-%m-%dT%H:%M:%SZ'"
BRIEF_FIELDS: dict[str, str] = {
    "workloadId": "id",
    "name": "name",
    "requestedName": "name",
    "type": "type",
    "projectId": "CAST(project_id AS TEXT)",
    "projectName": "project_name",
    "phase": "phase",
    "phaseMessage": "phase_message",
    "createdAt": f"strftime({_ISO}, created, 'unixepoch')",
    "startedAt": f"strftime({_ISO}, started, 'unixepoch')",
    "pendingSince": f"strftime({_ISO}, COALESCE(json_extract(control, '$.pending_since'), created), "
    "'unixepoch')",
    "completedAt": f"strftime({_ISO}, completed, 'unixepoch')",
    "exitCode": "exit_code",
    "priorityClass": "priority_class",
    "preemptible": "json(CASE WHEN preemptible THEN 'true' ELSE 'false' END)",
    "nodeName": "NULLIF(node, '')",
    "gpuDevices": "devices",
    "workers": "workers",
    "minWorkers": "min_workers",
    "runningPods": "running_pods",
    "gpus": "json_object('requested', round(gpus_requested, 4), "
    "'allocated', round(gpus_allocated, 4), 'request', request_text)",
    "simulated": "json($SIMULATED)",
    "image": "COALESCE(json_extract(spec, '$.image'), '')",
    "serviceUrls": "json(COALESCE(json_extract(control, '$.service_urls'), '[]'))",
}
"""Keys of a workload in a listing and the SQL that computes each (SQLite builds the JSON)."""


def _brief_json(fields: Sequence[str] | None, simulated: bool, rows: bool = False) -> str:
    """SQL for one listed workload: an object, or (``rows``) an array in the order of ``fields``."""
    if rows:
        keys = list(fields or BRIEF_FIELDS)
        expr = f"json_array({', '.join(BRIEF_FIELDS[k] for k in keys)})"
    else:
        keys = list(BRIEF_FIELDS) if not fields else [k for k in BRIEF_FIELDS if k in fields]
        expr = f"json_object({', '.join(f'{chr(39)}{k}{chr(39)}, {BRIEF_FIELDS[k]}' for k in keys)})"
    return expr.replace("$SIMULATED", "'true'" if simulated else "'false'")


WORKLOAD_COLUMNS = (
    "seq", "id", "name", "project_id", "project_name", "type", "phase", "phase_message", "spec",
    "request", "preemptible", "priority_class", "priority", "workers", "min_workers",
    "gpus_requested", "gpus_allocated", "node", "devices", "exit_code", "created", "started",
    "completed", "pods", "request_text", "running_pods", "control",
)
SORTABLE = {
    "name": "name",
    "createdAt": "seq",
    "phase": "phase",
    "projectName": "project_name",
    "type": "type",
    "gpus": "gpus_requested",
}
FILTERABLE = {
    "name": "name",
    "type": "type",
    "phase": "phase",
    "status": "phase",
    "projectName": "project_name",
    "projectId": "project_id",
    "nodeName": "node",
    "priorityClass": "priority_class",
}


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) readable by this user only (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


@dataclass
class Project:
    id: int
    name: str
    deserved: float
    limit: float | None
    over_quota_weight: float
    priority: int
    created: float


@dataclass
class Workload:
    seq: int
    id: str
    name: str
    project_id: int
    project_name: str
    type: str
    phase: Phase
    phase_message: str
    spec: dict[str, Any]
    request: dict[str, Any]
    preemptible: bool
    priority_class: str
    priority: int
    workers: int
    min_workers: int
    gpus_requested: float
    gpus_allocated: float
    node: str
    devices: str
    exit_code: int | None
    created: float
    started: float | None
    completed: float | None
    pods: list[PodRecord] = field(default_factory=list)
    request_text: str = ""
    """The request in words (kept so listings need not rebuild it)."""
    running_pods: int = 0
    control: Control = field(default_factory=Control)
    """The loop's own state of it, never shown as the user's spec (tessera.local.records)."""


@contextmanager
def all_or_nothing(w: Workload, active: dict[str, Workload]) -> Iterator[None]:
    """Changes made to ``w`` inside the block, and whether it is in ``active``, are undone when
    the block raises, e.g. because the store could not write them (a full disk): memory never
    runs ahead of what is stored, so a refused request changes nothing."""
    before = copy.deepcopy(w)
    was_active = active.get(w.id) is w
    try:
        yield
    except BaseException:
        for f in dataclasses.fields(w):
            setattr(w, f.name, getattr(before, f.name))
        if was_active:
            active[w.id] = w
        elif active.get(w.id) is w:
            del active[w.id]
        raise


@dataclass(frozen=True)
class Event:
    time: float
    kind: str
    message: str


def _project(row: Sequence[Any]) -> Project:
    return Project(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def _workload(row: Sequence[Any]) -> Workload:
    values = dict(zip(WORKLOAD_COLUMNS, row, strict=True))
    values["spec"] = json.loads(values["spec"])
    values["request"] = json.loads(values["request"])
    values["phase"] = Phase(values["phase"])
    values["pods"] = [{**p, "phase": PodPhase(p["phase"])} if "phase" in p else p
                      for p in json.loads(values["pods"])]
    values["preemptible"] = bool(values["preemptible"])
    values["control"] = Control.from_json(json.loads(values["control"]))
    return Workload(**values)


class Store(SqliteDb):
    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        path.chmod(0o600)  # env values and tokens' hashes: the server's user only
        super().__init__(path, "")
        with self._lock:
            migrate(self._db, str(path))  # an earlier release's tables (store_schema.py)

    # -- meta -------------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- projects --------------------------------------------------------------------------------

    def create_project(
        self, name: str, deserved: float, limit: float | None, weight: float, priority: int
    ) -> Project:
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO projects (name, deserved, gpu_limit, over_quota_weight, priority,"
                " created) VALUES (?, ?, ?, ?, ?, ?)",
                (name, deserved, limit, weight, priority, time.time()),
            )
            pid = cur.lastrowid
        rows = self._query("SELECT * FROM projects WHERE id=?", (pid,))
        return _project(rows[0])

    def projects(self) -> list[Project]:
        return [_project(r) for r in self._query("SELECT * FROM projects ORDER BY id")]

    def project_named(self, name: str) -> Project | None:
        rows = self._query("SELECT * FROM projects WHERE name=?", (name,))
        return _project(rows[0]) if rows else None

    def project(self, id_or_name: str) -> Project | None:
        """A project by name, else by id (digits): a project named ``5`` is that project,
        never the one whose id is 5 (as the Kubernetes backend, where names come first too)."""
        named = self.project_named(id_or_name)
        if named is not None:
            return named
        if (id_or_name.isascii() and id_or_name.isdigit() and len(id_or_name) <= 19
                and int(id_or_name) < 2**63):
            # not '²' (int() refuses it), nor past SQLite's INTEGER (binding it raises)
            rows = self._query("SELECT * FROM projects WHERE id=?", (int(id_or_name),))
            if rows:
                return _project(rows[0])
        return None

    def update_project(self, project: Project) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE projects SET deserved=?, gpu_limit=?, over_quota_weight=?, priority=?"
                " WHERE id=?",
                (project.deserved, project.limit, project.over_quota_weight, project.priority,
                 project.id),
            )

    def delete_project(self, project_id: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM projects WHERE id=?", (project_id,))

    def count_workloads(self, project_id: int) -> int:
        rows = self._query("SELECT COUNT(*) FROM workloads WHERE project_id=?", (project_id,))
        return int(rows[0][0])

    # -- workloads -------------------------------------------------------------------------------

    def insert_workload(self, w: Workload, event: str) -> Workload:
        values = self._row_values(w)
        del values["seq"]
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.transaction() as db:
            cur = db.execute(f"INSERT INTO workloads ({cols}) VALUES ({marks})", list(values.values()))
            db.execute(
                "INSERT INTO events (workload_id, time, kind, message) VALUES (?, ?, ?, ?)",
                (w.id, time.time(), "Submitted", event),
            )
        w.seq = int(cur.lastrowid or 0)
        return w

    def insert_many(self, workloads: Sequence[Workload]) -> None:
        """Bulk insert (benchmarks); no events."""
        if not workloads:
            return
        cols = [c for c in WORKLOAD_COLUMNS if c != "seq"]
        rows = []
        for w in workloads:
            values = self._row_values(w)
            rows.append([values[c] for c in cols])
        marks = ", ".join("?" for _ in cols)
        with self.transaction() as db:
            db.executemany(f"INSERT INTO workloads ({', '.join(cols)}) VALUES ({marks})", rows)

    @staticmethod
    def _row_values(w: Workload) -> dict[str, Any]:
        values = {c: getattr(w, c) for c in WORKLOAD_COLUMNS}
        values["spec"] = json.dumps(w.spec)
        values["request"] = json.dumps(w.request)
        values["pods"] = json.dumps(w.pods)
        values["control"] = json.dumps(w.control.to_json())
        values["preemptible"] = int(w.preemptible)
        values["running_pods"] = sum(1 for p in w.pods if p.get("phase") == PodPhase.RUNNING)
        return values

    def save(self, w: Workload, event: tuple[str, str] | None = None) -> None:
        """Write back every mutable field of ``w`` (and an event) in one transaction."""
        values = self._row_values(w)
        for fixed in ("seq", "id", "name", "project_id", "project_name", "type", "created"):
            del values[fixed]
        sets = ", ".join(f"{c}=?" for c in values)
        with self.transaction() as db:
            db.execute(f"UPDATE workloads SET {sets} WHERE id=?", [*values.values(), w.id])
            if event is not None:
                db.execute(
                    "INSERT INTO events (workload_id, time, kind, message) VALUES (?, ?, ?, ?)",
                    (w.id, time.time(), event[0], event[1]),
                )

    def add_event(self, workload_id: str, kind: str, message: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO events (workload_id, time, kind, message) VALUES (?, ?, ?, ?)",
                (workload_id, time.time(), kind, message),
            )

    def events(self, workload_id: str) -> list[Event]:
        rows = self._query(
            "SELECT time, kind, message FROM events WHERE workload_id=? ORDER BY id", (workload_id,)
        )
        return [Event(*r) for r in rows]

    def workload(self, workload_id: str) -> Workload | None:
        rows = self._query(
            f"SELECT {', '.join(WORKLOAD_COLUMNS)} FROM workloads WHERE id=?", (workload_id,)
        )
        return _workload(rows[0]) if rows else None

    def workload_by_name(self, project_id: int, name: str) -> Workload | None:
        rows = self._query(
            f"SELECT {', '.join(WORKLOAD_COLUMNS)} FROM workloads WHERE project_id=? AND name=?",
            (project_id, name),
        )
        return _workload(rows[0]) if rows else None

    def active_workloads(self) -> list[Workload]:
        marks = ", ".join("?" for _ in ACTIVE_PHASES)
        rows = self._query(
            f"SELECT {', '.join(WORKLOAD_COLUMNS)} FROM workloads WHERE phase IN ({marks})"
            " ORDER BY seq",
            ACTIVE_PHASES,
        )
        return [_workload(r) for r in rows]

    def delete_workload(self, workload_id: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM workloads WHERE id=?", (workload_id,))
            db.execute("DELETE FROM events WHERE workload_id=?", (workload_id,))

    def list_json(self, q: WorkloadQuery, simulated: bool = False) -> tuple[str, int]:
        """The listing as a JSON array, built by SQLite (json_object) so thousands of rows cost
        milliseconds. Same documents as ``LocalBackend.workload_dict(brief=True)``; with
        ``q.rows`` each workload is an array of ``q.fields`` in that order."""
        rows, total = self._list((_brief_json(q.fields, simulated, q.rows),), q)
        return "[" + ",".join(r[0] for r in rows) + "]", total

    def _list(self, columns: Sequence[str], q: WorkloadQuery) -> tuple[list[Any], int]:
        """Rows matching ``q.filters`` (key, op, value) with op ``==``, ``!=`` or ``=@``."""
        where: list[str] = []
        args: list[Any] = []
        for key, op, value in q.filters:
            col = FILTERABLE[key]
            if op == "==":
                where.append(f"{col} = ?")
            elif op == "!=":
                where.append(f"{col} != ?")
            else:
                where.append(f"instr(lower({col}), lower(?)) > 0")
            args.append(value)
        if q.search:
            where.append("instr(lower(name), lower(?)) > 0")
            args.append(q.search)
        if q.projects is not None:  # the caller's visible projects (tessera.api.tenancy)
            names = sorted(q.projects)
            where.append(f"project_name IN ({','.join('?' * len(names))})" if names else "0")
            args += names
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        order = SORTABLE[q.sort_by]
        direction = "DESC" if q.descending else "ASC"
        total = int(self._query(f"SELECT COUNT(*) FROM workloads{clause}", args)[0][0])
        rows = self._query(
            f"SELECT {', '.join(columns)} FROM workloads{clause}"
            f" ORDER BY {order} {direction}, seq {direction} LIMIT ? OFFSET ?",
            [*args, q.limit, q.offset],
        )
        return rows, total
