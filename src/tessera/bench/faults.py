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

A trial that breaks one is counted and its first message kept.

* ``diskfull``: the data directory is a 1 MiB tmpfs (mounted for the trial; needs root, else
  the scenario is skipped with the reason printed). Workloads are submitted until the disk is
  full, then submits, suspends, deletes and a new token are tried on the full disk: each is
  acknowledged or
  refused with 507 (503 for other write errors) naming the data directory; never a 500 or a
  dropped connection; ``/healthz`` and reads keep working; a refused request leaves nothing
  behind (the live server lists exactly the acknowledged workloads, with the states the
  acknowledged requests gave them). Then the disk grows (remount), a submit is acknowledged
  again, the server is killed with SIGKILL and restarted, and the four checks above run.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
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
        self.problems: list[str] = []
        self.mounted = False
        self.expected: dict[str, str] = {}
        self.refused: list[str] = []
        self.new_token: str | None = None

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
        if self.mounted:
            unmount(self.server.data)
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


class CannotMount(RuntimeError):
    """The disk-full scenario cannot mount its small filesystem here (not root)."""


def mount_small(path: Path, size: str) -> None:
    """A tmpfs of ``size`` at ``path`` (the trial's data directory); raises CannotMount."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise CannotMount("mounting a small filesystem needs root (the disk-full scenario "
                          "makes the data directory a 1 MiB tmpfs)")
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700",
                          "tessera-faults", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise CannotMount(f"mount -t tmpfs failed: {out.stderr.strip() or out.returncode}")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def disk_full(trial: Trial, rng: random.Random) -> dict[str, Any]:
    """Fill the data directory through the API, then try every kind of write on the full disk.
    Returns what was seen; problems go to ``trial.problems``."""
    token = trial.server.token()
    codes: Counter[int] = Counter()
    expected: dict[str, str] = {}  # acknowledged workload -> the phase family it must be in
    refused: list[str] = []
    pad = "x" * 4000
    with httpx.Client(base_url=trial.server.url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as c:

        def submit(name: str) -> int:
            body = submit_body(name, "p", gpuPortionRequest=str(rng.choice((0.05, 0.1))))
            body["spec"]["environmentVariables"] = [{"name": "PAD", "value": pad}]
            try:
                r = c.post("/api/v1/workloads/trainings", json=body)
            except httpx.HTTPError as exc:
                trial.problems.append(f"submit {name}: connection failed ({exc!r})")
                return 0
            codes[r.status_code] += 1
            if r.status_code == 202:
                trial.acked.add(r.json()["workloadId"])
                expected[r.json()["workloadId"]] = "active"
            elif r.status_code in (503, 507):
                if "data directory" not in r.json().get("message", ""):
                    trial.problems.append(f"{r.status_code} without a clear message: {r.text}")
                refused.append(name)
            else:
                trial.problems.append(f"submit {name}: {r.status_code} {r.text[:200]}")
            return r.status_code

        i = 0
        while i < 5000 and submit(f"f{i}") == 202:
            i += 1
        if not refused:
            trial.problems.append("the disk never filled")
            return {"codes": dict(codes)}
        # On the full disk: more submits, and suspends and deletes of acknowledged workloads.
        for k in range(5):
            submit(f"full{k}")
        for wid in rng.sample(sorted(expected), min(6, len(expected))):
            verb = rng.choice(("suspend", "delete"))
            try:
                r = (c.post(f"/api/v1/workloads/trainings/{wid}/suspend") if verb == "suspend"
                     else c.delete(f"/api/v1/workloads/trainings/{wid}"))
            except httpx.HTTPError as exc:
                trial.problems.append(f"{verb} on a full disk: connection failed ({exc!r})")
                continue
            codes[r.status_code] += 1
            if r.status_code in (200, 202):
                expected[wid] = "suspended" if verb == "suspend" else "deleted"
            elif r.status_code not in (503, 507) or "data directory" not in r.text:
                trial.problems.append(f"{verb} on a full disk: {r.status_code} {r.text[:200]}")
        # A new token is a write to the token store (tessera.api.token_store, the same for
        # the REST API on Kubernetes): refused the same way, and the old token still works.
        try:
            r = httpx.post(f"{trial.server.url}/api/v1/token", timeout=30, json={
                "grantType": "client_credentials", **trial.server.credentials()})
            codes[r.status_code] += 1
            if r.status_code == 200:  # it fitted: it must work, now and after the restart
                trial.new_token = r.json()["accessToken"]
            if r.status_code not in (200, 507) or (
                    r.status_code == 507 and "data directory" not in r.text):
                trial.problems.append(f"token on a full disk: {r.status_code} {r.text[:200]}")
        except httpx.HTTPError as exc:
            trial.problems.append(f"token on a full disk: connection failed ({exc!r})")
        if c.get("/healthz").status_code != 200:
            trial.problems.append("/healthz failed on a full disk")
        _check_states(trial, c, expected, refused, "on the full disk")
        # More room: the server goes on by itself.
        out = subprocess.run(["mount", "-o", "remount,size=64m", str(trial.server.data)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            trial.problems.append(f"remount failed: {out.stderr.strip()}")
        if submit("after") != 202:
            trial.problems.append("a submit after space was freed was not acknowledged")
        refused = [n for n in refused if n != "after"]
    trial.server.kill()
    trial.expected, trial.refused = expected, refused
    return {"codes": dict(codes), "acknowledged_before_full": i}


def _check_states(trial: Trial, c: httpx.Client, expected: dict[str, str], refused: list[str],
                  when: str) -> None:
    """Exactly the acknowledged workloads exist, in the state acknowledged requests gave them."""
    listing = c.get("/api/v1/workloads", params={"limit": 10000}).json()["workloads"]
    by_id = {w["workloadId"]: w for w in listing}
    names = {w["name"] for w in listing}
    half = [n for n in refused if n in names]
    if half:
        trial.problems.append(f"{when}: {len(half)} refused submit(s) stored, e.g. {half[0]}")
    for wid, state in expected.items():
        w = by_id.get(wid)
        if state == "deleted":
            if w is not None and w["phase"] not in ("Deleting",):
                trial.problems.append(f"{when}: deleted {wid} still {w['phase']}")
        elif w is None:
            trial.problems.append(f"{when}: acknowledged {wid} missing")
        elif state == "active" and w["phase"] in ("Suspended", "Deleting", "Stopping"):
            trial.problems.append(f"{when}: {wid} {w['phase']} by a refused request")


def run_trial(scenario: str, index: int, rng: random.Random, root: Path) -> dict[str, Any]:
    point = None
    if scenario == "start" and index % 2 == 0:
        point = START_POINTS[(index // 2) % len(START_POINTS)]
    trial = Trial(root / f"{scenario}-{index}", point)
    if scenario == "diskfull":
        mount_small(trial.server.data, "1m")  # CannotMount: the caller reports the skip
        trial.mounted = True
    try:
        trial.start()
        with trial.client() as c:
            c.post("/api/v1/org-unit/projects", json={"name": "p", "resources": {"gpu": {
                "deserved": 4}}}).raise_for_status()
        extra: dict[str, Any] = {}
        if scenario == "diskfull":
            extra = disk_full(trial, rng)
            point = "disk-full"
        else:
            (burst if scenario == "burst" else start_crash)(trial, rng)
        trial.fault_point = None
        trial.start()
        state = settle(trial)
        problems = trial.problems + check(trial, state)
        if scenario == "diskfull":
            with trial.client() as c:
                before = len(trial.problems)
                _check_states(trial, c, trial.expected, trial.refused, "after the restart")
                problems += trial.problems[before:]
            if trial.new_token and httpx.get(
                    f"{trial.server.url}/api/v1/workloads", timeout=30,
                    headers={"Authorization": f"Bearer {trial.new_token}"}).status_code != 200:
                problems.append("a token issued (200) on the full disk does not work after "
                                "the restart")
        return {"scenario": scenario, "point": point or "random", "acked": len(trial.acked),
                "problems": problems, **extra}
    finally:
        trial.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.faults")
    parser.add_argument("--trials", type=int, default=100, help="kill -9 trials per scenario")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", default="burst,start,diskfull")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up servers and pods
    rng = random.Random(args.seed)
    summary: dict[str, Any] = {"bench": "faults", "gpus": GPUS, "seed": args.seed}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tessera-faults-") as tmp:
        for scenario in args.scenarios.split(","):
            failed, acked, first = 0, 0, None
            points: Counter[str] = Counter()
            skipped = None
            answers: Counter[str] = Counter()
            for i in range(args.trials):
                try:
                    result = run_trial(scenario, i, rng, Path(tmp))
                except CannotMount as exc:
                    skipped = str(exc)
                    print(f"{scenario}: skipped: {skipped}", file=sys.stderr, flush=True)
                    break
                acked += result["acked"]
                answers.update({str(k): v for k, v in result.get("codes", {}).items()})
                points[result["point"]] += 1
                if result["problems"]:
                    failed += 1
                    first = first or f"trial {i} ({result['point']}): {result['problems'][0]}"
                print(f"{scenario} trial {i}: {result['point']}, {result['acked']} acknowledged, "
                      f"{'; '.join(result['problems']) or 'ok'}", file=sys.stderr, flush=True)
            summary[scenario] = {"trials": 0 if skipped else args.trials,
                                 "kills": 0 if skipped else args.trials,
                                 "acknowledged": acked, "failed_trials": failed,
                                 "first_failure": first, "kill_points": dict(points)}
            if answers:
                summary[scenario]["answers"] = dict(sorted(answers.items()))
            if skipped:
                summary[scenario]["skipped"] = skipped
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["ok"] = all(summary[s]["failed_trials"] == 0 for s in args.scenarios.split(","))
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
