"""Fault suite: kill -9 the embedded server at chosen and at random points, restart it, and check
that nothing was lost, nothing runs twice and no GPU is over-committed.

``python -m tessera.bench.faults [--trials 100] [--seed 1] [--scenarios burst,start]``

Each trial uses a real server (``python -m tessera.local.server`` on simulated GPUs, 4 x
V100-16GB) in a fresh data directory:

* ``burst``: 8 threads submit workloads (one to four pods, portions of 0.05-0.3) over HTTP as
  fast as they can; the server is killed with SIGKILL at a random moment 0-1 s after the
  first submit was acknowledged, while requests are in flight.
* ``start``: gangs of four pods are submitted and the server is killed while it starts them:
  at a chosen point (``TESSERA_FAULT_POINT``: after the start's intent is stored, between two
  pods, after all pods run but before they are confirmed) or at a random moment.

After the kill the server is started again in the same directory and, once it has run its
cycles, the invariants are checked:

1. no acknowledged write lost: every workload the API answered 202 for exists;
2. no device over-committed: the bytes the API shows on each GPU, and the bytes the pod
   processes actually running on it were given (their ``TESSERA_SHARE_*`` environment, read
   from /proc), are within the device's memory;
3. no duplicate or untracked pod: every pod process of this server (found from /proc) is a pod
   the API shows as running, and no workload's pod index runs twice;
4. every workload placed or explained: each active workload is Running, or Pending with the
   reason the cycle gave.

A trial that breaks one is counted and its first message kept. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tessera.testing.embedded import EmbeddedServer, submit_body
from tessera.testing.pod_processes import kill_all, pod_processes

GPUS = "4xV100-16GB"
START_POINTS = ("start-intent", "start-between-pods:1", "start-between-pods:2", "start-launched")
INITIAL_REASON = "waiting for the next scheduling cycle"


class Trial:
    def __init__(self, root: Path, fault_point: str | None = None) -> None:
        self.server = EmbeddedServer(root, simulate=[GPUS], grace=0.5, interval=0.05)
        self.fault_point = fault_point
        self.acked: set[str] = set()

    def start(self) -> None:
        if self.fault_point:
            os.environ["TESSERA_FAULT_POINT"] = self.fault_point
        try:
            self.server.start()
        finally:
            os.environ.pop("TESSERA_FAULT_POINT", None)

    def client(self) -> httpx.Client:
        return self.server.http()

    def cleanup(self) -> None:
        if self.server.proc is not None and self.server.proc.poll() is None:
            self.server.kill()
        kill_all(self.server.data)
        shutil.rmtree(self.server.root, ignore_errors=True)


def _body(rng: random.Random, name: str) -> dict[str, Any]:
    body = submit_body(name, "p", gpuPortionRequest=str(rng.choice((0.05, 0.1, 0.2, 0.3))))
    body["spec"]["workers"] = rng.choice((1, 1, 2, 4))
    return body


def burst(trial: Trial, rng: random.Random) -> None:
    """Concurrent submits; SIGKILL mid-burst."""
    stop = threading.Event()
    lock = threading.Lock()
    token = trial.server.token()

    def submitter(k: int) -> None:
        local = random.Random(rng.random())
        with httpx.Client(base_url=trial.server.url, timeout=5,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    r = c.post("/api/v1/workloads/trainings", json=_body(local, f"b{k}-{i}"))
                except httpx.HTTPError:
                    return
                if r.status_code == 202:
                    with lock:
                        trial.acked.add(r.json()["workloadId"])

    with ThreadPoolExecutor(8) as pool:
        for k in range(8):
            pool.submit(submitter, k)
        deadline = time.monotonic() + 20
        while not trial.acked and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        trial.server.kill()
        stop.set()


def start_crash(trial: Trial, rng: random.Random) -> None:
    """Gangs of four pods; the server dies while starting them (a chosen point or at random)."""
    with trial.client() as c:
        for i in range(3):
            body = submit_body(f"g{i}", "p", gpuPortionRequest=str(rng.choice((0.1, 0.25))))
            body["spec"]["workers"] = 4
            try:
                r = c.post("/api/v1/workloads/trainings", json=body)
            except httpx.HTTPError:
                break  # it died at the chosen point
            if r.status_code == 202:
                trial.acked.add(r.json()["workloadId"])
    assert trial.server.proc is not None
    if trial.fault_point:
        try:
            trial.server.proc.wait(timeout=10)  # it kills itself at the point
        except Exception:
            trial.server.kill()
    else:
        time.sleep(rng.uniform(0.0, 0.15))
        trial.server.kill()


def settle(trial: Trial, timeout: float = 20) -> dict[str, Any]:
    """Wait until the restarted server has given every pending workload a reason and every
    pod process is accounted for; return the workloads (by id) and the cluster document."""
    deadline = time.monotonic() + timeout
    with trial.client() as c:
        while True:
            listing = c.get("/api/v1/workloads", params={"limit": 10000}).json()["workloads"]
            pending = [w for w in listing if w["phase"] == "Pending"
                       and w["phaseMessage"] in ("", INITIAL_REASON)]
            moving = [w for w in listing if w["phase"] in ("Stopping", "Deleting")]
            if (not pending and not moving) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        workloads = {w["workloadId"]: w for w in listing}
        pods = {wid: c.get(f"/api/v1/workloads/trainings/{wid}/pods").json()["pods"]
                for wid, w in workloads.items() if w["phase"] == "Running"}
        cluster = c.get("/api/v1/cluster").json()
    return {"workloads": workloads, "pods": pods, "cluster": cluster}


def check(trial: Trial, state: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    workloads, pods, cluster = state["workloads"], state["pods"], state["cluster"]
    lost = trial.acked - set(workloads)
    if lost:
        problems.append(f"lost {len(lost)} acknowledged workload(s)")
    memory = {}
    for g in cluster["nodes"][0]["gpus"]:
        memory[g["uuid"]] = g["memoryBytes"]
        if g["allocatedBytes"] > g["memoryBytes"]:
            problems.append(f"GPU {g['index']} over-committed in the API: {g['allocatedBytes']}")
    procs = pod_processes(trial.server.data)
    used: Counter[str] = Counter()
    for p in procs:
        uuids = p.env.get("TESSERA_SHARE_UUIDS", "").split(",")
        amounts = p.env.get("TESSERA_SHARE_REQUEST_BYTES", "").split(",")
        for u, b in zip(uuids, amounts, strict=False):
            if u and b:
                used[u] += int(b)
    for u, total in used.items():
        if total > memory.get(u, 0):
            problems.append(f"GPU {u} over-committed by running processes: {total} bytes")
    tracked = {(wid, int(p["index"])): int(p["pid"]) for wid, ps in pods.items() for p in ps
               if p.get("phase") == "Running" and p.get("pid")}
    seen = Counter((p.workload_id, p.index) for p in procs)
    dup = [k for k, n in seen.items() if n > 1]
    if dup:
        problems.append(f"{len(dup)} pod(s) running twice, e.g. {dup[0]}")
    untracked = [p for p in procs if tracked.get((p.workload_id, p.index)) != p.pid]
    if untracked:
        problems.append(f"{len(untracked)} untracked pod process(es), e.g. pid {untracked[0].pid} "
                        f"of {untracked[0].workload_id}")
    for w in workloads.values():
        if w["phase"] == "Pending" and w["phaseMessage"] in ("", INITIAL_REASON):
            problems.append(f"{w['name']} pending with no reason")
    return problems


def run_trial(scenario: str, index: int, rng: random.Random, root: Path) -> dict[str, Any]:
    point = None
    if scenario == "start" and index % 2 == 0:
        point = START_POINTS[(index // 2) % len(START_POINTS)]
    trial = Trial(root / f"{scenario}-{index}", point)
    try:
        trial.start()
        with trial.client() as c:
            c.post("/api/v1/org-unit/projects", json={"name": "p", "resources": {"gpu": {
                "deserved": 4}}}).raise_for_status()
        (burst if scenario == "burst" else start_crash)(trial, rng)
        trial.fault_point = None
        trial.start()
        problems = check(trial, settle(trial))
        return {"scenario": scenario, "point": point or "random", "acked": len(trial.acked),
                "problems": problems}
    finally:
        trial.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.faults")
    parser.add_argument("--trials", type=int, default=100, help="kill -9 trials per scenario")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", default="burst,start")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up servers and pods
    rng = random.Random(args.seed)
    summary: dict[str, Any] = {"bench": "faults", "gpus": GPUS, "seed": args.seed}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tessera-faults-") as tmp:
        for scenario in args.scenarios.split(","):
            failed, acked, first = 0, 0, None
            points: Counter[str] = Counter()
            for i in range(args.trials):
                result = run_trial(scenario, i, rng, Path(tmp))
                acked += result["acked"]
                points[result["point"]] += 1
                if result["problems"]:
                    failed += 1
                    first = first or f"trial {i} ({result['point']}): {result['problems'][0]}"
                print(f"{scenario} trial {i}: {result['point']}, {result['acked']} acknowledged, "
                      f"{'; '.join(result['problems']) or 'ok'}", file=sys.stderr, flush=True)
            summary[scenario] = {"trials": args.trials, "kills": args.trials,
                                 "acknowledged": acked, "failed_trials": failed,
                                 "first_failure": first, "kill_points": dict(points)}
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["ok"] = all(summary[s]["failed_trials"] == 0 for s in args.scenarios.split(","))
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
