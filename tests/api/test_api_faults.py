"""Faults: crashing workloads, server SIGKILL and restart."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.shares import share


def _gpu0_bytes(c) -> int:  # type: ignore[no-untyped-def]
    return int(c.get("/api/v1/cluster").json()["nodes"][0]["gpus"][0]["allocatedBytes"])


def test_crash_is_failed_with_exit_code_and_share_freed(server: EmbeddedServer) -> None:
    with server.http() as c:
        c.post("/api/v1/org-unit/projects", json={"name": "f-crash",
                                                  "resources": {"gpu": {"deserved": 1}}})
        before = _gpu0_bytes(c)
        body = submit_body("crash", "f-crash", command="python3",
                           args="-c 'import sys, time; time.sleep(0.3); sys.exit(3)'",
                           gpuPortionRequest=0.25)
        wid = c.post("/api/v1/workloads/trainings", json=body).json()["workloadId"]
        server.wait_phase(c, "trainings", wid, "Running")
        assert _gpu0_bytes(c) == before + share(0.25)
        w = server.wait_phase(c, "trainings", wid, "Failed")
        assert w["exitCode"] == 3
        assert "exited with code 3" in w["phaseMessage"]
        assert w["gpus"]["allocated"] == 0
        assert _gpu0_bytes(c) == before


def test_sigkill_restart_keeps_records_and_reattaches(tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    try:
        with s.http() as c:
            c.post("/api/v1/org-unit/projects", json={"name": "team-a",
                                                      "resources": {"gpu": {"deserved": 1}}})
            ids = {}
            for name in ("survivor", "victim", "done"):
                args = "0.2" if name == "done" else "600"
                r = c.post("/api/v1/workloads/trainings", json=submit_body(
                    name, "team-a", args=args, gpuPortionRequest=0.2))
                ids[name] = r.json()["workloadId"]
            c.post("/api/v1/workloads/trainings", json=submit_body(
                "queued", "team-a", gpuPortionRequest=0.9))
            for name in ("survivor", "victim"):
                s.wait_phase(c, "trainings", ids[name], "Running")
            pods = c.get(f"/api/v1/workloads/trainings/{ids['victim']}/pods").json()["pods"]
            victim_pid = pods[0]["pid"]
            survivor_pid = c.get(
                f"/api/v1/workloads/trainings/{ids['survivor']}/pods").json()["pods"][0]["pid"]
        s.kill()
        os.killpg(victim_pid, signal.SIGKILL)
        time.sleep(0.5)
        s.start()
        with s.http() as c:
            names = {w["name"]: w for w in c.get("/api/v1/workloads").json()["workloads"]}
            assert set(names) == {"survivor", "victim", "done", "queued"}
            assert [p["name"] for p in c.get("/api/v1/org-unit/projects").json()["projects"]] == [
                "team-a"]
            survivor = s.wait_phase(c, "trainings", ids["survivor"], "Running")
            assert survivor["pods"][0]["pid"] == survivor_pid
            assert any(e["kind"] == "Reattached" for e in survivor["events"])
            victim = s.wait_phase(c, "trainings", ids["victim"], "Failed")
            assert victim["exitCode"] == 137 or "gone when the server restarted" in victim[
                "phaseMessage"]
            s.wait_phase(c, "trainings", ids["done"], "Completed")
            assert names["queued"]["phase"] == "Pending"
            assert c.get("/api/v1/cluster").json()["simulated"] is True
            held = [h["name"] for g in c.get("/api/v1/cluster").json()["nodes"][0]["gpus"]
                    for h in g["workloads"]]
            assert held == ["survivor"]
    finally:
        s.cleanup()


def test_restart_with_other_gpus_fails_workloads_on_missing_devices(tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    s.start()
    try:
        with s.http() as c:
            c.post("/api/v1/org-unit/projects", json={"name": "g", "resources": {"gpu": {
                "deserved": 1}}})
            wid = c.post("/api/v1/workloads/trainings", json=submit_body(
                "old-gpu", "g", gpuPortionRequest=0.5)).json()["workloadId"]
            s.wait_phase(c, "trainings", wid, "Running")
            pid = c.get(f"/api/v1/workloads/trainings/{wid}/pods").json()["pods"][0]["pid"]
        s.kill()
        s.start(simulate=["1xA100-40GB"])
        with s.http() as c:
            w = s.wait_phase(c, "trainings", wid, "Failed")
            assert "no longer on this machine" in w["phaseMessage"]
            again = c.post("/api/v1/workloads/trainings", json=submit_body(
                "new-gpu", "g", gpuPortionRequest=0.5)).json()["workloadId"]
            doc = s.wait_phase(c, "trainings", again, "Running")
            assert doc["pods"][0]["gpuDevices"][0]["requestBytes"] == share(
                0.5, "A100-40GB", 40 * 2**30)
        from tessera.local.runner import Runner

        watcher = Runner(tmp_path / "watch")
        for _ in range(200):
            if not watcher.group_alive(pid):
                break
            time.sleep(0.05)
        assert not watcher.group_alive(pid), "the pod on the vanished GPU was not stopped"
    finally:
        s.cleanup()
