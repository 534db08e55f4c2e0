"""Finding 4 of issue 14: a server killed while starting a multi-pod workload never leaves pods
running untracked nor starts one twice. The crash is placed exactly with
``TESSERA_FAULT_POINT`` (tessera.local.faultpoints); the pods are found from /proc, not from the
server's records (tessera.testing.pod_processes)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tessera.testing.embedded import EmbeddedServer, submit_body
from tessera.testing.pod_processes import kill_all, pod_processes


def _crash_during_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        point: str) -> tuple[EmbeddedServer, str, list[int]]:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    with s.http() as c:
        c.post("/api/v1/org-unit/projects", json={"name": "p", "resources": {"gpu": {
            "deserved": 1}}}).raise_for_status()
    s.stop(stop_workloads=False)
    monkeypatch.setenv("TESSERA_FAULT_POINT", point)
    s.start()
    with s.http() as c:
        body = submit_body("gang", "p", gpuPortionRequest=0.25)
        body["spec"]["workers"] = 4
        wid = c.post("/api/v1/workloads/trainings", json=body).json()["workloadId"]
    assert s.proc is not None
    s.proc.wait(timeout=20)  # the server killed itself at the chosen point
    assert s.proc.returncode == -9
    before = sorted(p.pid for p in pod_processes(s.data))
    monkeypatch.delenv("TESSERA_FAULT_POINT")
    s.start()
    return s, wid, before


def _settled(s: EmbeddedServer, wid: str) -> list[dict[str, object]]:
    with s.http() as c:
        w = s.wait_phase(c, "trainings", wid, "Running")
    procs = pod_processes(s.data)
    assert sorted(Counter(p.index for p in procs).values()) == [1, 1, 1, 1], procs
    assert {p.workload_id for p in procs} == {wid}
    assert sorted(int(p["pid"]) for p in w["pods"]) == sorted(p.pid for p in procs)  # type: ignore[call-overload]
    return list(w["events"])


def test_crash_between_pods_kills_the_partial_start_and_starts_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, wid, before = _crash_during_start(tmp_path, monkeypatch, "start-between-pods:2")
    try:
        assert len(before) == 2  # two of four pods ran untracked when it died
        events = _settled(s, wid)
        kinds = [e["kind"] for e in events]
        assert "Requeued" in kinds and kinds.count("Started") == 1, events
        assert not {p.pid for p in pod_processes(s.data)} & set(before)
    finally:
        s.cleanup()
        kill_all(s.data)


def test_crash_after_all_pods_started_reattaches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, wid, before = _crash_during_start(tmp_path, monkeypatch, "start-launched")
    try:
        assert len(before) == 4
        events = _settled(s, wid)
        assert any(e["kind"] == "Reattached" for e in events), events
        assert sorted(p.pid for p in pod_processes(s.data)) == before
    finally:
        s.cleanup()
        kill_all(s.data)


def test_crash_after_the_intent_starts_nothing_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, wid, before = _crash_during_start(tmp_path, monkeypatch, "start-intent")
    try:
        assert before == []
        _settled(s, wid)
    finally:
        s.cleanup()
        kill_all(s.data)


def test_non_loopback_bind_needs_insecure(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "tessera.local.server", "--host", "0.0.0.0",
                        "--data-dir", str(tmp_path / "d"), "--simulate", "1xV100-16GB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--host 0.0.0.0" in r.stderr and "--insecure" in r.stderr
    assert not (tmp_path / "d" / "tessera.db").exists()


def test_a_stored_workload_no_process_can_take_fails_alone(tmp_path: Path) -> None:
    """A workload stored before validation refused NUL bytes (a database from an older
    version): its start fails that workload only; every other one is still scheduled, also
    after a restart."""
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    try:
        with s.http() as c:
            c.post("/api/v1/org-unit/projects", json={"name": "p", "resources": {"gpu": {
                "deserved": 1}}}).raise_for_status()
            wid = c.post("/api/v1/workloads/trainings", json=submit_body(
                "poison", "p", gpuPortionRequest=0.1)).json()["workloadId"]
            c.post(f"/api/v1/workloads/trainings/{wid}/suspend").raise_for_status()
            s.wait_phase(c, "trainings", wid, "Stopped")
        s.stop(stop_workloads=False)
        con = sqlite3.connect(str(s.data / "tessera.db"))
        control = json.loads(con.execute("SELECT control FROM workloads WHERE id=?",
                                         (wid,)).fetchone()[0])
        control["env"] = {"X": "a\x00b"}
        con.execute("UPDATE workloads SET control=?, phase='Pending' WHERE id=?",
                    (json.dumps(control), wid))
        con.commit()
        con.close()
        s.start()
        with s.http() as c:
            w = s.wait_phase(c, "trainings", wid, "Failed")
            assert "NUL" in w["phaseMessage"], w["phaseMessage"]
            good = c.post("/api/v1/workloads/trainings", json=submit_body(
                "good", "p", gpuPortionRequest=0.1)).json()
            s.wait_phase(c, "trainings", good["workloadId"], "Running")
    finally:
        s.cleanup()
