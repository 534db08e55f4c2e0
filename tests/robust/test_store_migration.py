"""A data directory written by the previous release (control state as ``_``-keys of the user's
spec, no schema version) is migrated when the server opens it, in one transaction
(tessera.local.store_schema): its workloads come back intact, the running one re-attached to
its real process, and no ``_``-key is left in any spec. The old database is written here with
the previous release's own SQL, not with today's store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tessera.api.backend import WorkloadSubmission
from tessera.api.validation import check_submission
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest
from tessera.local.gpus import discover
from tessera.local.store import Store
from tessera.local.store_schema import StoreTooNew
from tessera.testing.embedded import EmbeddedServer, submit_body

OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE projects (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
    deserved REAL NOT NULL DEFAULT 0, gpu_limit REAL, over_quota_weight REAL NOT NULL DEFAULT 1,
    priority INTEGER NOT NULL DEFAULT 50, created REAL NOT NULL);
CREATE TABLE workloads (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
    project_id INTEGER NOT NULL, project_name TEXT NOT NULL, type TEXT NOT NULL,
    phase TEXT NOT NULL, phase_message TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL,
    request TEXT NOT NULL, preemptible INTEGER NOT NULL, priority_class TEXT NOT NULL,
    priority INTEGER NOT NULL, workers INTEGER NOT NULL DEFAULT 1,
    min_workers INTEGER NOT NULL DEFAULT 1, gpus_requested REAL NOT NULL DEFAULT 0,
    gpus_allocated REAL NOT NULL DEFAULT 0, node TEXT NOT NULL DEFAULT '',
    devices TEXT NOT NULL DEFAULT '', exit_code INTEGER, created REAL NOT NULL, started REAL,
    completed REAL, pods TEXT NOT NULL DEFAULT '[]', request_text TEXT NOT NULL DEFAULT '',
    running_pods INTEGER NOT NULL DEFAULT 0, UNIQUE (project_id, name));
CREATE INDEX workloads_phase ON workloads (phase);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, workload_id TEXT NOT NULL, time REAL NOT NULL,
    kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX events_workload ON events (workload_id);
CREATE TABLE gpu_allocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, workload_id TEXT NOT NULL, workload TEXT NOT NULL,
    project TEXT NOT NULL, user TEXT NOT NULL DEFAULT '', gpus REAL NOT NULL,
    start_time REAL NOT NULL, end_time REAL);
CREATE TRIGGER accounting_update AFTER UPDATE OF gpus_allocated ON workloads
WHEN NEW.gpus_allocated != OLD.gpus_allocated BEGIN
  UPDATE gpu_allocations SET end_time = 0 WHERE workload_id = NEW.id AND end_time IS NULL;
  INSERT INTO gpu_allocations (workload_id, workload, project, user, gpus, start_time)
  SELECT NEW.id, NEW.name, NEW.project_name,
         COALESCE(json_extract(NEW.spec, '$._submittedBy'), ''), NEW.gpus_allocated, 0
  WHERE NEW.gpus_allocated > 0;
END;
"""
"""The previous release's tables, as its store and accounting created them."""
QUARTER = {"kind": "portion", "devices": 1, "portion": "0.25", "portionLimit": None,
           "memory": None, "memoryLimit": None, "models": []}


def _old_row(db: sqlite3.Connection, wid: str, phase: str, spec: dict[str, Any],
             pods: list[dict[str, Any]] = (), **columns: Any) -> None:  # type: ignore[assignment]
    values = {"id": wid, "name": wid, "project_id": 1, "project_name": "p", "type": "Training",
              "phase": phase, "spec": json.dumps(spec), "request": json.dumps(QUARTER),
              "preemptible": 1, "priority_class": "train", "priority": 50,
              "gpus_requested": 0.25, "created": time.time() - 60, "pods": json.dumps(list(pods)),
              "request_text": "0.25 GPU", **columns}
    db.execute(f"INSERT INTO workloads ({', '.join(values)}) VALUES "
               f"({', '.join('?' * len(values))})", list(values.values()))


def _old_store(path: Path, rows: int = 0) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path))
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO projects (name, deserved, created) VALUES ('p', 1, 0)")
    for i in range(rows):
        _old_row(db, f"w{i}", "Completed", {"image": "", "_argv": ["echo", str(i)],
                                            "_env": {"I": str(i)}, "_submittedBy": "user:a"})
    db.commit()
    return db


def _start_ticks(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2:].split()[19])


def test_an_old_data_directory_comes_back_intact_and_running_pods_reattach(
        tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    data = s.data.resolve()
    gpu = discover(["1xV100-16GB"], seed=str(data)).node.gpus[0]
    exit_file = data / "run" / "running-0.exit"
    (data / "run").mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True,
                            env={**os.environ, "TESSERA_EXIT_FILE": str(exit_file)})
    since = time.time() - 30
    try:
        db = _old_store(data / "tessera.db")
        _old_row(db, "running", "Running",
                 {"image": "", "_argv": ["sleep", "300"], "_env": {"X": "1"},
                  "_submittedBy": "user:alice", "_masterPort": 29500},
                 [{"index": 0, "phase": "Running", "node": "vm", "devices": [0],
                   "uuids": [gpu.uuid], "requestBytes": [gpu.schedulable // 4],
                   "limitBytes": [gpu.schedulable // 4], "exclusive": False, "pid": proc.pid,
                   "startTicks": _start_ticks(proc.pid), "log": str(data / "running-0.log"),
                   "exitFile": str(exit_file), "exitCode": None, "env": {"X": "1"},
                   "holds": True}],
                 gpus_allocated=0.25, node="vm", devices="0", started=time.time() - 30)
        _old_row(db, "pending", "Pending",
                 {"image": "", "_argv": ["sleep", "300"], "_env": {"Y": "2"},
                  "_submittedBy": "user:bob", "_pendingSince": since})
        _old_row(db, "done", "Completed", {"image": "", "_argv": ["python", "train.py"],
                                           "_env": {}, "_submittedBy": "user:carol"},
                 exit_code=0, completed=time.time())
        db.commit()
        db.close()

        s.start()
        with s.http() as c:
            running = s.wait_phase(c, "trainings", "running", "Running")
            assert [p["pid"] for p in running["pods"]] == [proc.pid]
            assert any(e["kind"] == "Reattached" for e in running["events"]), running["events"]
            assert proc.poll() is None
            assert running["spec"]["command"] == "sleep" and running["spec"]["args"] == "300"
            assert running["spec"]["environmentVariables"] == [{"name": "X", "value": "1"}]
            pending = s.wait_phase(c, "trainings", "pending", "Running")
            assert pending["pods"][0]["env"]["Y"] == "2"
            done = c.get("/api/v1/workloads/trainings/done").json()
            assert (done["phase"], done["spec"]["command"], done["spec"]["args"]) == (
                "Completed", "python", "train.py")
            for w in (running, pending, done):
                assert not [k for k in w["spec"] if k.startswith("_")], w["spec"]
            listed = {w["name"]: w for w in c.get("/api/v1/workloads").json()["workloads"]}
            assert listed["pending"]["pendingSince"] == time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
            refused = c.post("/api/v1/workloads/trainings", json={
                **submit_body("sneaky", "p"), "spec": {"command": "true", "_argv": ["x"]}})
            assert refused.status_code == 422 and "spec._argv" in refused.text, refused.text
        con = sqlite3.connect(str(data / "tessera.db"))
        try:
            assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() \
                == ("2",)
            assert all('"_' not in spec for (spec,) in con.execute("SELECT spec FROM workloads"))
            users = dict(con.execute("SELECT workload_id, user FROM gpu_allocations"))
            assert users.get("pending") == "user:bob", users  # the new trigger reads control
        finally:
            con.close()
    finally:
        s.cleanup()
        proc.kill()
        proc.wait()


def test_a_migration_killed_midway_leaves_the_old_layout_and_runs_again(
        tmp_path: Path) -> None:
    path = tmp_path / "tessera.db"
    _old_store(path, rows=3).close()
    crashed = subprocess.run(
        [sys.executable, "-c", f"from pathlib import Path; from tessera.local.store import "
         f"Store; Store(Path({str(path)!r}))"],
        env={**os.environ, "TESSERA_FAULT_POINT": "store-migrate-row:2"}, timeout=60)
    assert crashed.returncode == -signal.SIGKILL  # killed after the 2nd of 3 rows moved
    con = sqlite3.connect(str(path))
    try:
        assert "control" not in {r[1] for r in con.execute("PRAGMA table_info(workloads)")}
        assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() is None
        assert all("_argv" in json.loads(spec) for (spec,) in con.execute(
            "SELECT spec FROM workloads"))
    finally:
        con.close()
    store = Store(path)
    try:
        for i in range(3):
            w = store.workload(f"w{i}")
            assert w is not None and w.spec == {"image": ""}
            assert (w.control.argv, w.control.env, w.control.submitted_by) == (
                ["echo", str(i)], {"I": str(i)}, "user:a")
    finally:
        store.close()
    con = sqlite3.connect(str(path))
    con.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreTooNew, match=r"tessera\.db was written by a newer tessera "
                       r"\(store schema 3; this release reads up to 2\)"):
        Store(path)


def test_a_spec_key_that_would_set_the_loops_state_is_refused() -> None:
    s = WorkloadSubmission("w", "p", "Training", GpuRequest.fraction("0.5"), ["true"],
                           spec={"command": "true", "_starting": "x"})
    with pytest.raises(InvalidRequest) as refused:
        check_submission(s)
    assert refused.value.field == "spec._starting" and "reserved" in refused.value.rule
