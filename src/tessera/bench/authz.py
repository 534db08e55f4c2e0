"""Time authorization: the whole per-request path of the guard (the bearer token looked up in
SQLite, the caller's access rules compiled into its index, the permission checked on the
request's project), with 1,000 users and 10,000 access rules.

    python -m tessera.bench.authz [--users 1000] [--rules 10000] [--requests 20000]

Users have about ten rules each (researcher, viewer or department-admin on projects and
departments; a tenth of the rules name groups the users' tokens carry). Requests pick a random
user, permission and project. ``cold_p99_ms`` times each user's first request (its index
compiled), ``p99_ms`` the steady state (wall clock; ``cpu_p99_ms`` the thread's CPU time, which
other processes on a shared machine do not inflate). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from tessera.api.tenancy.service import Tenancy
from tessera.api.token_store import TokenStore

PERMISSIONS = ("workloads:read", "workloads:create", "workloads:delete", "projects:read",
               "projects:update", "reports:read")


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.authz")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rules", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=500)
    parser.add_argument("--departments", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args(argv)
    rng = random.Random(31)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        tenancy = Tenancy(directory, TokenStore(directory / "tessera.db"))
        store = tenancy.store
        projects = [f"proj-{i}" for i in range(args.projects)]
        departments = [f"dept-{i}" for i in range(args.departments)]
        for p in projects:
            store.set_project_department(p, rng.choice(departments))
        users = [f"user-{i}" for i in range(args.users)]
        groups = [f"group-{i}" for i in range(args.users // 10)]
        rows: set[tuple[str, str, str, str, str]] = set()
        while len(rows) < args.rules:
            subject = ("group", rng.choice(groups)) if rng.random() < 0.1 else \
                ("user", rng.choice(users))
            role = rng.choice(("researcher", "viewer", "researcher", "department-admin"))
            if role == "department-admin":
                rows.add((*subject, role, "department", rng.choice(departments)))
            else:
                rows.add((*subject, role, "project", rng.choice(projects)))
        store.add_rules_bulk(sorted(rows))
        rule_count = len(store.rules())
        tokens = {}
        for u in users:
            store.add_user(u, None, False, "local", "bench")
            tokens[u], _ = tenancy.issue("user", u, groups=(rng.choice(groups),))
        authz = tenancy.authz

        cpu: list[float] = []

        def request(user: str) -> float:
            permission, project = rng.choice(PERMISSIONS), rng.choice(projects)
            start, start_cpu = time.perf_counter(), time.thread_time()
            principal = tenancy.resolve(tokens[user])
            assert principal is not None
            authz.allowed(principal, permission, project)
            cpu.append(time.thread_time() - start_cpu)
            return time.perf_counter() - start

        cold = [request(u) for u in users]
        cpu.clear()
        warm = [request(rng.choice(users)) for _ in range(args.requests)]
        result = {
            "users": args.users, "rules": rule_count, "projects": args.projects,
            "departments": args.departments, "requests": args.requests,
            "p50_ms": round(_p(warm, 0.5), 4), "p99_ms": round(_p(warm, 0.99), 4),
            "max_ms": round(max(warm) * 1000, 3), "cpu_p99_ms": round(_p(cpu, 0.99), 4),
            "cold_p50_ms": round(_p(cold, 0.5), 4), "cold_p99_ms": round(_p(cold, 0.99), 4),
        }
        tenancy.store.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
