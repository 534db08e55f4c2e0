"""Embedded mode: submit→Running latency and ``tessera list`` with 10,000 workloads.

``python -m tessera.bench.api [--submits 60] [--workloads 10000] [--repeats 5]``

1. A real server on simulated GPUs (2xH100-80GB); ``--submits`` workloads of 0.02 GPU are
   submitted one at a time over HTTP, and each is polled (every 2 ms) until it is Running. The
   latency is from just before the POST to the first poll that sees Running, so it includes the
   scheduling cycle, the process start and the store writes.
2. The server is stopped, ``--workloads`` finished workload records are written to its store in
   bulk (through ``tessera.local.store``, not the API, to keep the set-up short), the server is
   started again and the real CLI (``tessera list -A``, a fresh Python process each time) lists
   them all; the wall time of the whole command is measured. The API's own time for the same
   listing is measured too.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tessera.testing.embedded import EmbeddedServer, submit_body


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_submit(server: EmbeddedServer, count: int) -> list[float]:
    latencies: list[float] = []
    with server.http() as c:
        c.post("/api/v1/org-unit/projects", json={
            "name": "bench", "resources": {"gpu": {"deserved": 2}}})
        for i in range(count):
            t0 = time.perf_counter()
            r = c.post("/api/v1/workloads/trainings", json=submit_body(
                f"s{i}", "bench", gpuPortionRequest="0.02"))
            r.raise_for_status()
            wid = r.json()["workloadId"]
            while True:
                w = c.get(f"/api/v1/workloads/trainings/{wid}").json()
                if w["phase"] == "Running":
                    break
                if w["phase"] not in ("Pending",):
                    raise RuntimeError(f"s{i} became {w['phase']}: {w['phaseMessage']}")
                time.sleep(0.002)
            latencies.append(time.perf_counter() - t0)
        for page in range(0, count, 500):
            for w in c.get("/api/v1/workloads", params={
                    "limit": 500, "offset": page}).json()["workloads"]:
                c.delete(f"/api/v1/workloads/trainings/{w['workloadId']}")
    return latencies


def fill_store(server: EmbeddedServer, count: int) -> None:
    from tessera.local.records import Control, Phase
    from tessera.local.store import Store, Workload

    store = Store(server.data / "tessera.db")
    project = store.project("bench") or store.create_project("bench", 2, None, 1, 50)
    now = time.time()
    rows = []
    request = {"kind": "portion", "devices": 1, "portion": "0.25", "portionLimit": None,
               "memory": None, "memoryLimit": None, "models": []}
    for i in range(count):
        rows.append(Workload(
            seq=0, id=str(uuid.uuid4()), name=f"w{i:05d}", project_id=project.id,
            project_name=project.name, type="Training",
            phase=Phase.COMPLETED if i % 3 else Phase.FAILED,
            phase_message="all pods exited with code 0" if i % 3 else "pod 0: exited with code 1",
            spec={}, control=Control(argv=["python", "train.py", f"--seed={i}"]),
            request=request, preemptible=True, priority_class="train", priority=50,
            workers=1, min_workers=1, gpus_requested=0.25, gpus_allocated=0.0, node="",
            devices="", exit_code=0 if i % 3 else 1, created=now - count + i,
            started=now - count + i, completed=now - count + i + 1, request_text="0.25 GPU",
        ))
    store.insert_many(rows)
    store.close()


def bench_list(server: EmbeddedServer, repeats: int, expect: int) -> tuple[list[float], list[float]]:
    cli_times: list[float] = []
    api_times: list[float] = []
    server.cli("list", "-A")
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "list", "-A"],
                              env=server.env, capture_output=True, text=True)
        cli_times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        rows = proc.stdout.count("\n") - 2
        if rows < expect:
            raise RuntimeError(f"tessera list showed {rows} rows, expected {expect}")
    with server.http() as c:
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = c.get("/api/v1/workloads", params={"limit": 10000})
            r.raise_for_status()
            api_times.append(time.perf_counter() - t0)
    return cli_times, api_times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.api")
    parser.add_argument("--submits", type=int, default=60)
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-bench-api-") as tmp:
        server = EmbeddedServer(Path(tmp), simulate=["2xH100-80GB"], interval=0.25)
        server.start()
        try:
            latencies = bench_submit(server, args.submits)
            server.stop()
            fill_store(server, args.workloads)
            server.start()
            cli_times, api_times = bench_list(server, args.repeats, args.workloads)
        finally:
            server.cleanup()
    ms = [x * 1000 for x in latencies]
    print(f"submit->Running over {len(ms)} submits: p50 {statistics.median(ms):.1f} ms, "
          f"p90 {_percentile(ms, 0.9):.1f} ms, max {max(ms):.1f} ms")
    print(f"tessera list -A with {args.workloads} workloads: median "
          f"{statistics.median(cli_times):.3f} s (whole CLI process), API alone "
          f"{statistics.median(api_times):.3f} s")
    print(json.dumps({
        "benchmark": "api",
        "submits": len(ms),
        "submit_to_running_p50_ms": round(statistics.median(ms), 1),
        "submit_to_running_p90_ms": round(_percentile(ms, 0.9), 1),
        "submit_to_running_max_ms": round(max(ms), 1),
        "list_workloads": args.workloads,
        "list_cli_median_s": round(statistics.median(cli_times), 3),
        "list_api_median_s": round(statistics.median(api_times), 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
