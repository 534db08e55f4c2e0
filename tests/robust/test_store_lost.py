"""A store lost or broken at start never becomes an empty state while pods hold GPUs
(tessera.local.store_check): the real server, a real workload process, a truncated file."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from tessera.local.store_check import StoreLost, check_store, live_pods
from tessera.testing.embedded import EmbeddedServer, submit_body


def _running_pod(s: EmbeddedServer) -> int:
    with s.http() as c:
        c.post("/api/v1/org-unit/projects", json={
            "name": "p", "resources": {"gpu": {"deserved": 1}}}).raise_for_status()
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "held", "p", gpuRequestType="portion", gpuPortionRequest=0.5))
        r.raise_for_status()
        wid = r.json()["workloadId"]
        s.wait_phase(c, "trainings", wid, "Running")
        pods = c.get(f"/api/v1/workloads/trainings/{wid}/pods").json()["pods"]
    (pid,) = [p.pid for p in live_pods(s.data)]
    assert pods, pods
    return pid


def test_a_truncated_store_refuses_to_start_and_names_the_pods_holding_gpus(
        tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    pid = None
    try:
        pid = _running_pod(s)
        s.kill()  # a crash: the pod keeps running (its own session) and keeps its GPU
        db = s.data / "tessera.db"
        for extra in ("-wal", "-shm"):
            Path(f"{db}{extra}").unlink(missing_ok=True)
        db.write_bytes(b"")  # truncated to 0 bytes
        with pytest.raises(RuntimeError) as refused:
            s.start()
        log = str(refused.value)
        assert f"the store {db} is empty (0 bytes)" in log, log
        assert f"pid {pid}" in log and "Refusing to start" in log, log
        assert db.stat().st_size == 0, "the refused start wrote into the store"
    finally:
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
        s.stop()


def test_a_corrupt_or_foreign_store_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "tessera.db"
    db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    with pytest.raises(StoreLost, match=r"tessera\.db is not a readable SQLite database"):
        check_store(tmp_path)
    db.unlink()
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE other (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreLost, match=r"is not a tessera store \(no table events, meta, "
                       r"projects, workloads\).*mv .*tessera.db .*tessera.db.broken"):
        check_store(tmp_path)


def test_a_missing_store_refuses_while_pods_run_and_starts_empty_loudly_once_none_do(
        tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    pid = None
    try:
        pid = _running_pod(s)
        s.kill()
        for name in ("tessera.db", "tessera.db-wal", "tessera.db-shm"):
            (s.data / name).unlink(missing_ok=True)
        with pytest.raises(StoreLost, match=rf"is missing, but this data directory was used "
                           rf"before .*pid {pid}"):
            check_store(s.data)
        os.killpg(pid, signal.SIGKILL)
        pid = None
        s.start()
        log = (tmp_path / "server.log").read_text()
        assert "WARNING: the store" in log and "starting with an EMPTY state" in log, log
    finally:
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
        s.cleanup()


def test_a_first_start_and_a_healthy_store_say_nothing(tmp_path: Path) -> None:
    assert check_store(tmp_path) is None
    from tessera.local.store import Store

    Store(tmp_path / "tessera.db").close()
    (tmp_path / "credentials.json").write_text("{}")
    assert check_store(tmp_path) is None
