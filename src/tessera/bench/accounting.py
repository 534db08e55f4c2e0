"""Time usage reports over 90 days of 10,000 workloads (docs/accounting.md).

    python -m tessera.bench.accounting [--workloads 10000] [--days 90]

Each workload binds once to a few times (fractions, whole GPUs, MIG fractions) with suspends in
between, in 200 projects of 20 departments, submitted by 1,000 users: about five intervals per
workload in the ledger's SQLite table, and the measured use of each interval (a random 10-90%
busy) as the meter keeps it, one row per workload and clock hour. Each report (by project, department, user, workload)
over the whole range is timed; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from tessera.api.tenancy.ledger import Ledger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.accounting")
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=90)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(31)
    t0 = 1_790_000_000.0
    span = args.days * 86400
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tessera.db"
        ledger = Ledger(path)
        rows = []
        for i in range(args.workloads):
            t = t0 + rng.uniform(0, span)
            project = f"proj-{i % 200}"
            for _ in range(rng.randint(1, 9)):
                end = t + rng.expovariate(1 / 7200)
                rows.append((f"w-{i}", f"job-{i}", project, f"user:u{rng.randrange(1000)}",
                             rng.choice((0.25, 0.5, 1.0, 2.0, 3 / 7)), t, min(end, t0 + span)))
                t = end + rng.expovariate(1 / 3600)
                if t > t0 + span:
                    break
        db = sqlite3.connect(str(path))
        db.executemany("INSERT INTO gpu_allocations (workload_id, workload, project, user, gpus,"
                       " start_time, end_time) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO project_departments (project, department) VALUES (?, ?)",
                       [(f"proj-{p}", f"dept-{p % 20}") for p in range(200)])
        db.commit()
        db.close()
        ledger.add_used([(w, name, project, user, start, end, gpus * (end - start)
                          * rng.uniform(0.1, 0.9))
                         for w, name, project, user, gpus, start, end in rows])
        with sqlite3.connect(str(path)) as db:
            used_rows = db.execute("SELECT COUNT(*) FROM gpu_used").fetchone()[0]
        timings = {}
        for by in ("project", "department", "user", "workload"):
            times, cpu = [], []
            for _ in range(args.repeat):
                start, start_cpu = time.perf_counter(), time.process_time()
                out = ledger.report(t0, t0 + span, by, now=t0 + span)
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            timings[f"{by}_seconds_median"] = round(statistics.median(times), 4)
            timings[f"{by}_cpu_seconds_median"] = round(statistics.median(cpu), 4)
            timings[f"{by}_rows"] = len(out)
        ledger.close()
    print(json.dumps({"workloads": args.workloads, "days": args.days, "intervals": len(rows),
                      "used_rows": used_rows,
                      **timings}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
