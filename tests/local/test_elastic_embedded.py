"""Elastic trainings resized while they run, in embedded mode (docs/scheduling.md#elastic-and-
semi-preemptible-workloads, tessera.local.elastic): a real server, real worker processes that
record their environment and stay alive until SIGTERM, on two simulated GPUs in halves.

It starts at its minimum when only that fits, grows by single pods into idle GPUs (each new pod
with torchrun's elastic settings and the same GPU-share limit as the first), keeps its size over
a server restart, and is shrunk by single pods, newest first, for another project's workload
below its fair share, its other pods running on untouched, and never below its minimum. A server
killed just after growing it re-attaches the new pod rather than starting it twice."""

from __future__ import annotations

import json
import shlex
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.cli.workload_commands import elastic_line
from tessera.local.elastic import retry_after
from tessera.testing.embedded import EmbeddedServer
from tessera.testing.pod_processes import pod_processes
from tests.waiting import wait_until

WORKER = r'''
import json, os, signal, sys, time
me = f"{os.environ['TESSERA_WORKLOAD_NAME']}-{os.environ['TESSERA_POD_INDEX']}-{os.getpid()}"
path = os.path.join(sys.argv[1], me)
def bye(*_):
    open(path + ".term", "w").close()
    while os.path.exists(os.path.join(sys.argv[1], "linger")):  # slow to stop
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
env = {k: v for k, v in os.environ.items() if k.startswith(("PET_", "TESSERA_", "CUDA_", "LD_"))
       or k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
with open(path + ".tmp", "w") as f:
    json.dump({**env, "pid": os.getpid()}, f)
os.replace(path + ".tmp", path + ".json")
finish = os.path.join(sys.argv[1], me.rpartition("-")[0] + ".finish")
while not os.path.exists(finish):  # its work done: exits 0 by itself
    time.sleep(0.1)
'''
TRAININGS = "/api/v1/workloads/trainings"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    # grace 10 s: a shrunk pod that is slow to stop stays Stopping that long (the workers here
    # exit at SIGTERM at once unless told to linger)
    s = EmbeddedServer(tmp_path_factory.mktemp("elastic"), simulate=["2xV100-16GB"], grace=10.0)
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_GROW_RETRY_SECONDS", "1")  # a failed grow is tried again after 1 s, not 30
    s.start()
    try:
        with s.http() as c:
            for name, deserved in (("a", 0.5), ("b", 1.5)):
                r = c.post("/api/v1/org-unit/projects",
                           json={"name": name, "resources": {"gpu": {"deserved": deserved}}})
                assert r.status_code == 201, r.text
        yield s
    finally:
        s.cleanup()
        mp.undo()


@pytest.fixture
def http(server: EmbeddedServer) -> Iterator[httpx.Client]:
    with server.http() as c:
        yield c


class Workers:
    """The worker processes' records: ``name -> pod index -> env`` (the latest process each)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "records"
        self.dir.mkdir()
        self.script = root / "worker.py"
        self.script.write_text(WORKER)

    def env(self, name: str) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for f in sorted(self.dir.glob(f"{name}-*.json"), key=lambda f: f.stat().st_mtime):
            rec = json.loads(f.read_text())
            out[int(rec["TESSERA_POD_INDEX"])] = rec
        return out

    def terminated(self, name: str) -> set[int]:
        return {int(f.name.split("-")[-2]) for f in self.dir.glob(f"{name}-*.term")}

    def body(self, name: str, project: str, portion: float, workers: int = 1,
             min_workers: int | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "command": sys.executable, "args": shlex.join([str(self.script), str(self.dir)]),
            "workers": workers, "compute": {"gpuDevicesRequest": 1, "gpuRequestType": "portion",
                                            "gpuPortionRequest": portion}}
        if min_workers is not None:
            spec["minWorkers"] = min_workers
        return {"name": name, "projectId": project, "spec": spec}


@pytest.fixture
def workers(tmp_path: Path) -> Workers:
    return Workers(tmp_path)


def submit(http: httpx.Client, body: dict[str, Any]) -> str:
    r = http.post(TRAININGS, json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["workloadId"])


def get(http: httpx.Client, wid: str) -> dict[str, Any]:
    doc: dict[str, Any] = http.get(f"{TRAININGS}/{wid}").json()
    return doc


def running(http: httpx.Client, wid: str) -> dict[int, int]:
    """Pod index -> pid of its running pods."""
    return {p["index"]: p["pid"] for p in get(http, wid)["pods"] if p["phase"] == "Running"}


def events(http: httpx.Client, wid: str, kind: str) -> list[str]:
    return [e["message"] for e in get(http, wid)["events"] if e["kind"] == kind]


def delete_all(server: EmbeddedServer, http: httpx.Client, *wids: str) -> None:
    """Give the GPUs back for the next test: delete, then wait until each is gone."""
    for wid in wids:
        http.delete(f"{TRAININGS}/{wid}")
    wait_until("deleted workloads gone", lambda: all(
        http.get(f"{TRAININGS}/{w}").status_code == 404 for w in wids), timeout=20)


def ledger(server: EmbeddedServer, wid: str) -> list[float]:
    """The GPU accounting intervals of ``wid``, in order: GPUs held in each."""
    db = sqlite3.connect(str(server.data / "tessera.db"))
    try:
        return [g for (g,) in db.execute(
            "SELECT gpus FROM gpu_allocations WHERE workload_id=? ORDER BY rowid", (wid,))]
    finally:
        db.close()


def test_starts_at_its_minimum_grows_into_idle_gpus_and_keeps_its_size_over_a_restart(
        server: EmbeddedServer, http: httpx.Client, workers: Workers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    filler = submit(http, workers.body("filler", "b", 0.5, workers=3))
    wait_until("filler runs", lambda: len(running(http, filler)) == 3, timeout=20)
    e = submit(http, workers.body("grow", "a", 0.5, workers=4, min_workers=1))
    # Only one half GPU is idle: it starts with its minimum, pod 0.
    wait_until("its first pod records its env", lambda: 0 in workers.env("grow"), timeout=20)
    assert list(running(http, e)) == [0]
    first = workers.env("grow")[0]
    port = first["PET_RDZV_ENDPOINT"].rpartition(":")[2]
    assert first["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{port}" and int(port) > 0
    assert (first["PET_NNODES"], first["PET_RDZV_BACKEND"], first["PET_RDZV_ID"]) == ("1:4", "c10d", e)
    assert first["PET_RDZV_CONF"] == "is_host=1" and first["PET_NPROC_PER_NODE"] == "1"
    assert first["PET_MAX_RESTARTS"] == "100" and first["TESSERA_MIN_WORKERS"] == "1"
    # torchrun gives its workers their ranks; the fixed-size variables would be wrong here.
    assert not {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"} & set(first)

    # Room appears: the running workload grows by single pods, pod 0 untouched.
    pid0 = running(http, e)[0]
    delete_all(server, http, filler)
    wait_until("grown to 4", lambda: len(running(http, e)) == 4, timeout=20)
    wait_until("every pod recorded", lambda: len(workers.env("grow")) == 4, timeout=20)
    assert running(http, e)[0] == pid0 and not workers.terminated("grow")
    envs = workers.env("grow")
    for i in (1, 2, 3):
        assert envs[i]["PET_RDZV_ENDPOINT"] == first["PET_RDZV_ENDPOINT"]
        assert envs[i]["PET_RDZV_CONF"] == "is_host=0" and envs[i]["PET_NNODES"] == "1:4"
        # The same GPU share and isolation limit as a first pod: half of a 16 GB GPU.
        for k in ("TESSERA_ISOLATION", "TESSERA_SHARE_LIMIT_BYTES", "TESSERA_SHARE_REQUEST_BYTES",
                  "LD_PRELOAD"):
            assert envs[i].get(k) == first.get(k), k
        assert envs[i]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert first["TESSERA_ISOLATION"] == "on"
    grown = " ".join(events(http, e, "Grown"))
    assert "(to 4 of 4, minimum 1)" in grown
    doc = get(http, e)
    assert doc["runningPods"] == 4 and doc["gpus"]["allocated"] == 2.0
    # Accounting follows the running members: intervals of 0.5 GPU, then more, ending at 2.
    held = ledger(server, e)
    assert held[0] == 0.5 and held[-1] == 2.0 and held == sorted(held)

    # tessera down (workloads left running) and up: the resized workload is re-attached whole.
    # The new server will crash (SIGKILL) right after launching a further pod of an elastic
    # workload, before that is stored (tessera.local.faultpoints).
    pids = running(http, e)
    server.stop(stop_workloads=False)
    monkeypatch.setenv("TESSERA_FAULT_POINT", "grow-launched")
    server.start()
    with server.http() as again:
        assert running(again, e) == pids
        assert "re-attached to 4 running pod(s)" in " ".join(events(again, e, "Reattached"))
        # tessera describe's line, from the server's own document
        assert (elastic_line(get(again, e)) or "").startswith("Elastic:     4 of 1 to 4 pod(s) running")
        # b takes a half back (its newest pod, 3, goes), then gives it back: e grows into it
        # again, and the server dies just after starting pod 3 anew.
        b1 = submit(again, workers.body("b-grow", "b", 0.5))
        wait_until("b-grow runs", lambda: get(again, b1)["phase"] == "Running", timeout=20)
        assert running(again, e) == {i: pids[i] for i in (0, 1, 2)}
        again.delete(f"{TRAININGS}/{b1}")
    assert server.proc is not None
    server.proc.wait(timeout=20)
    assert server.proc.returncode == -9
    monkeypatch.delenv("TESSERA_FAULT_POINT")
    launched = {p.index: p.pid for p in pod_processes(server.data) if p.workload_id == e}
    assert sorted(launched) == [0, 1, 2, 3] and launched[3] != pids[3]
    server.start()  # the pod whose start was cut short is re-attached, not started twice
    with server.http() as again:
        wait_until("pod 3 re-attached", lambda: running(again, e) == launched, timeout=20)
        assert "re-attached to it (pid" in " ".join(events(again, e, "Reattached"))
        assert {p.index: p.pid for p in pod_processes(server.data) if p.workload_id == e} == launched
        assert get(again, e)["gpus"]["allocated"] == 2.0
        delete_all(server, again, e)


def test_shrinks_for_another_project_below_its_fair_share_never_below_its_minimum(
        server: EmbeddedServer, http: httpx.Client, workers: Workers) -> None:
    # a (deserved 0.5) runs an elastic training on all four halves: over its quota.
    e = submit(http, workers.body("shrink", "a", 0.5, workers=4, min_workers=2))
    wait_until("it runs all four", lambda: len(workers.env("shrink")) == 4, timeout=20)
    before = running(http, e)
    # b (deserved 1.5) asks for a half: the newest pod, 3, is given back; the rest run on.
    w1 = submit(http, workers.body("b1", "b", 0.5))
    wait_until("b1 runs", lambda: get(http, w1)["phase"] == "Running", timeout=20)
    assert running(http, e) == {i: before[i] for i in (0, 1, 2)}
    assert workers.terminated("shrink") == {3}
    (shrunk,) = events(http, e, "Shrunk")
    assert shrunk.startswith("shrunk by 1 elastic pod(s) (to 3 of 4, minimum 2) to make room "
                             "for b1 of project b, which is below its fair share")
    assert get(http, e)["gpus"]["allocated"] == 1.5 and ledger(server, e)[-1] == 1.5
    # A second half: pod 2 goes, down to the minimum.
    w2 = submit(http, workers.body("b2", "b", 0.5))
    wait_until("b2 runs", lambda: get(http, w2)["phase"] == "Running", timeout=20)
    assert running(http, e) == {i: before[i] for i in (0, 1)}
    assert workers.terminated("shrink") == {2, 3}
    # A third: a could give one more pod and stay at its fair share (0.5), but not below its
    # minimum; and evicted whole, a would drop below its deserved quota: b3 waits, told why.
    w3 = submit(http, workers.body("b3", "b", 0.5))
    wait_until("b3 is told why it waits", lambda: get(http, w3)["phaseMessage"] != (
        "waiting for the next scheduling cycle"), timeout=20)
    doc = get(http, w3)
    assert doc["phase"] == "Pending" and "reclaim found no over-share workloads" in doc["phaseMessage"]
    assert running(http, e) == {i: before[i] for i in (0, 1)} and len(events(http, e, "Shrunk")) == 2
    assert workers.terminated("shrink") == {2, 3}
    delete_all(server, http, e, w1, w2, w3)


def test_elasticity_on_a_training_that_cannot_resize_is_refused(
        server: EmbeddedServer, http: httpx.Client, workers: Workers) -> None:
    # `tessera training jax submit --workers 3 --min-workers 1` sends TESSERA_FRAMEWORK=jax:
    # JAX's processes share one fixed count (JAX_NUM_PROCESSES), so it cannot resize.
    body = workers.body("j", "a", 0.5, workers=3, min_workers=1)
    body["spec"]["environmentVariables"] = [{"name": "TESSERA_FRAMEWORK", "value": "jax"}]
    r = http.post(TRAININGS, json=body)
    assert r.status_code == 422 and "spec.minWorkers" in r.text
    assert "elastic (below workers, 3) needs a launcher that re-forms its group" in r.text
    db = sqlite3.connect(str(server.data / "tessera.db"))
    try:  # nothing stored
        assert db.execute("SELECT count(*) FROM workloads WHERE name='j'").fetchone() == (0,)
    finally:
        db.close()


def test_a_failed_grow_is_reported_and_undone_and_a_last_pod_ending_while_another_is_shrunk_completes(
        server: EmbeddedServer, http: httpx.Client, workers: Workers) -> None:
    # Three halves taken by b (within its fair share): e starts with its minimum, and the
    # cycle's reason its second pod waits shows in the API and describe's Elastic line.
    filler = submit(http, workers.body("filler2", "b", 0.5, workers=3))
    wait_until("filler runs", lambda: len(running(http, filler)) == 3, timeout=20)
    e = submit(http, workers.body("fin", "a", 0.5, workers=2, min_workers=1))
    wait_until("its pod 0 runs", lambda: 0 in workers.env("fin"), timeout=20)
    wait_until("told why pod 1 waits", lambda: (get(http, e).get("elasticWaiting") or "").startswith(
        "1 elastic pod(s) wait: would exceed fair share of a by 0.5 GPU"), timeout=20)
    doc = get(http, e)
    assert (elastic_line(doc) or "").startswith(
        "Elastic:     1 of 1 to 2 pod(s) running (grows into idle GPUs, shrinks back to 1); "
        "1 elastic pod(s) wait: ")
    pid0 = running(http, e)[0]

    # Pod 1's log file cannot be opened (a directory took its path): the grow fails, told why;
    # e keeps pod 0, no record of pod 1 is left and its half is not counted; retried in 1 s.
    blocker = server.data / "logs" / f"{e}-1.log"
    blocker.mkdir()
    delete_all(server, http, filler)
    wait_until("GrowFailed", lambda: events(http, e, "GrowFailed"), timeout=20)
    failed = events(http, e, "GrowFailed")[0]
    assert failed.startswith("could not start pod(s) 1: ") and f"{e}-1.log" in failed, failed
    assert failed.endswith("; tried again in 1 s"), failed
    doc = get(http, e)
    assert doc["phase"] == "Running" and [p["index"] for p in doc["pods"]] == [0]
    assert running(http, e) == {0: pid0} and doc["gpus"]["allocated"] == 0.5
    assert all(g == 0.5 for g in ledger(server, e))  # its accounting never counted pod 1
    assert [p.index for p in pod_processes(server.data) if p.workload_id == e] == [0]
    wait_until("describe says growth is paused", lambda: "a grow failed to start (event "
               "GrowFailed): tried again in " in (elastic_line(get(http, e)) or ""), timeout=10)
    blocker.rmdir()  # the next try starts pod 1
    wait_until("grown to 2", lambda: len(running(http, e)) == 2, timeout=20)
    assert running(http, e)[0] == pid0 and get(http, e)["gpus"]["allocated"] == 1.0
    # Its SIGTERM handler is set before it writes its record: a pod shrunk before that (a
    # loaded machine starting Python slowly) would die without the ".term" file looked for below.
    # (The failed try started no process: its log file could not be opened.)
    wait_until("pod 1 recorded", lambda: 1 in workers.env("fin"), timeout=20)
    assert get(http, e)["elasticWaiting"] is None

    # b takes the idle halves, then asks for one more: e's pod 1 is shrunk away and is slow to
    # stop; meanwhile pod 0 ends its work (exit 0). Once pod 1 is gone, every pod of e has
    # completed: e completes (it stayed Running with no pod before commit c496c39).
    w2 = submit(http, workers.body("b2", "b", 0.5, workers=2))
    wait_until("b2 runs", lambda: len(running(http, w2)) == 2, timeout=20)
    (workers.dir / "linger").touch()
    w3 = submit(http, workers.body("b3", "b", 0.5))
    try:
        wait_until("pod 1 is told to stop", lambda: workers.terminated("fin") == {1}, timeout=20)
    except AssertionError as exc:  # say what the cycle told b3
        raise AssertionError(f"{exc}; b3: {get(http, w3)['phaseMessage']}") from exc
    assert get(http, e)["elasticWaiting"] == "not resized while pod(s) start or stop"
    (workers.dir / "fin-0.finish").touch()
    wait_until("pod 0 completed", lambda: [p["phase"] for p in get(http, e)["pods"]] == [
        "Completed", "Stopping"], timeout=20)
    (workers.dir / "linger").unlink()
    wait_until("e completed", lambda: get(http, e)["phase"] == "Completed", timeout=10)
    assert get(http, e)["gpus"]["allocated"] == 0.0
    wait_until("b3 runs", lambda: get(http, w3)["phase"] == "Running", timeout=20)
    delete_all(server, http, w2, w3)


def test_the_grow_retry_delay_setting_is_checked() -> None:
    assert retry_after({}) == 30.0 and retry_after({"TESSERA_GROW_RETRY_SECONDS": "1.5"}) == 1.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match=r"TESSERA_GROW_RETRY_SECONDS: must be a number of "
                                             r"seconds, at least 0, not '"):
            retry_after({"TESSERA_GROW_RETRY_SECONDS": bad})
