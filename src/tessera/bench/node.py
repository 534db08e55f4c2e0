"""Benchmark of tessera-node on the fake driver: a metrics scrape with many containers, the
agent's memory, and (with the loan reclaimer) how long taking a loan back takes.

    python -m tessera.bench.node [--containers 100] [--gpus 8] [--scrapes 200]

One simulated machine (``--gpus`` fake H100s, shared process state), ``--containers`` shares
written as tessera-node writes them, each with one real process (cuprobe) holding memory under
the isolation library, and the agent as its own process (``tessera-node local``). Scrapes are
timed over HTTP from this process. The last line printed is one JSON object with
``reclaim_p50_seconds``, ``reclaim_p99_seconds`` (``--reclaims`` rounds on one fake L4 with the
reclaimer of ``tessera.node.reclaim`` running as in the agent: a borrower holds 16 GiB on loan,
an owner allocates 6 GiB within its request; the time from the owner's call until its
allocation returns, the borrower killed meanwhile), ``scrape_seconds`` (median), ``scrape_p99_seconds``, ``containers``,
``gpus``, ``rss_bytes`` (the agent's resident memory after the scrapes) and
``usage_read_seconds`` (one read of NVML and every region, as the agent reports it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tessera.isolation.build import ensure_built
from tessera.node.containers import Share, ShareDevice, config_dir, write_share

GiB = 2**30
H100 = "NVIDIA H100 80GB HBM3=81559Mi"


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


class _Probe:
    """One cuprobe process (a CUDA program on the fake driver): a command, its answer."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def __call__(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def reclaim_times(rounds: int) -> list[float]:
    """Seconds from an owner's allocation within its request until it returns, while a
    borrower's loan is taken back, over ``rounds`` rounds (a fresh borrower and owner each)."""
    from tessera.isolation import DeviceShare
    from tessera.isolation.config import LoansConfig, write_workload_files
    from tessera.node.reclaim import ReclaimerThread, prepare_directory

    native = ensure_built()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-reclaim-"))
    loans = prepare_directory(work / "loans")
    uuid = _uuid(0)
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(native.fake_dir),
           "FAKE_GPU_DEVICES": "NVIDIA L4=24Gi", "FAKE_GPU_UUIDS": uuid,
           "FAKE_GPU_STATE": str(work / "gpu.state"), "LD_PRELOAD": str(native.library)}
    thread = ReclaimerThread(loans, lambda r: None).start()
    times: list[float] = []
    try:
        for i in range(rounds):
            probes = []
            for name, request, limit in ((f"b{i}", 2 * GiB, 20 * GiB), (f"o{i}", 8 * GiB, 8 * GiB)):
                files = write_workload_files(
                    work / name, [DeviceShare(0, uuid, limit, request)],
                    loans=LoansConfig(loans, share=name, priority=50, wait_ms=10_000,
                                      headroom_bytes=GiB))
                p = _Probe([str(native.program("cuprobe")), "dlsym"],
                           {**env, "TESSERA_GPU_CONFIG": str(files.config_path)})
                probes.append(p)
                if not (p("init").startswith("rc=0") and p("ctx 0").startswith("rc=0")):
                    raise RuntimeError(f"round {i}: {name} could not start")
                # the borrower takes its loan before the owner (whose context is charged, so it
                # is on the ledger from its start) comes
                if len(probes) == 1 and not p(f"alloc {18 * GiB}").startswith("rc=0"):
                    raise RuntimeError(f"round {i}: the borrower's loan was refused")
            borrower, owner = probes
            t = time.perf_counter()
            answer = owner(f"alloc {6 * GiB}")
            times.append(time.perf_counter() - t)
            if not answer.startswith("rc=0") or borrower.proc.wait(timeout=10) == 0:
                raise RuntimeError(f"round {i}: the owner was not served ({answer})")
            for p in probes:
                p.stop()
    finally:
        thread.stop()
    return times


def run(containers: int, gpus: int, scrapes: int, say: Any, reclaims: int = 30) -> dict[str, Any]:
    from tessera.testing.processes import free_ports

    native = ensure_built()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-node-"))
    shares_dir = work / "shares"
    env = {
        "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(native.fake_dir),
        "FAKE_GPU_DEVICES": ";".join([H100] * gpus),
        "FAKE_GPU_UUIDS": ",".join(_uuid(i) for i in range(gpus)),
        "FAKE_GPU_STATE": str(work / "gpu.state"),
    }
    procs: list[subprocess.Popen[str]] = []
    agent: subprocess.Popen[str] | None = None
    try:
        t0 = time.monotonic()
        for c in range(containers):
            uuid = _uuid(c % gpus)
            share = Share(key=f"{c:016x}", namespace=f"team-{c % 10}", pod=f"pod-{c}",
                          uid=f"uid-{c}", containers=("main",),
                          devices=(ShareDevice(uuid, GiB // 2, GiB),), workload=f"w-{c}",
                          project=f"team-{c % 10}")
            write_share(shares_dir, share, host_paths=True)
            conf = config_dir(shares_dir, share.key, "main") / "gpu-isolation.conf"
            p = subprocess.Popen([str(native.program("cuprobe")), "dlsym"],
                                 env={**env, "LD_PRELOAD": str(native.library),
                                      "TESSERA_GPU_CONFIG": str(conf),
                                      "CUDA_VISIBLE_DEVICES": uuid, "FAKE_GPU_SM_UTIL": "5"},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(f"init\nctx 0\nalloc {GiB // 4}\n")
            p.stdin.flush()
            answers = [p.stdout.readline() for _ in range(3)]
            if not all(a.startswith("rc=0") for a in answers):
                raise RuntimeError(f"container {c}: {answers}")
            procs.append(p)
        say(f"{containers} containers on {gpus} GPUs started in {time.monotonic() - t0:.1f} s")
        (port,) = free_ports(1)
        profile = os.environ.get("TESSERA_BENCH_PROFILE")  # cProfile output of the agent
        agent = subprocess.Popen(
            [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []),
             "-m", "tessera.node", "local", f"--shares-dir={shares_dir}",
             f"--metrics-port={port}", "--node-name=bench", "--sync-interval=1"],
            env={**env, "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        with httpx.Client() as http:
            while True:
                try:
                    body = http.get(url, timeout=5).text
                    if body.count("tessera_container_gpu_memory_charged_bytes{") >= containers:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not report every container within 60 s")
                time.sleep(0.2)
            times = []
            for _ in range(scrapes):
                t = time.perf_counter()
                body = http.get(url, timeout=5).text
                times.append(time.perf_counter() - t)
        read = next(float(x.rsplit(" ", 1)[1]) for x in body.splitlines()
                    if x.startswith("tessera_node_usage_read_seconds{"))
        rss = _rss(agent.pid)
        reclaim = reclaim_times(reclaims) if reclaims else []
        if reclaim:
            say(f"{len(reclaim)} loans reclaimed: p50 {statistics.median(reclaim) * 1000:.0f} ms")
        return {
            "reclaim_p50_seconds": round(statistics.median(reclaim), 4) if reclaim else None,
            "reclaim_p99_seconds": round(_percentile(reclaim, 0.99), 4) if reclaim else None,
            "reclaims": len(reclaim),
            "scrape_seconds": round(statistics.median(times), 5),
            "scrape_p99_seconds": round(_percentile(times, 0.99), 5),
            "containers": containers, "gpus": gpus, "rss_bytes": rss,
            "usage_read_seconds": round(read, 5), "scrape_bytes": len(body),
        }
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(10)
        for p in procs:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.node")
    parser.add_argument("--containers", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--reclaims", type=int, default=30, help="loan reclaims to time (0: none)")
    args = parser.parse_args(argv)
    if args.containers < 1 or not 1 <= args.gpus <= 16 or args.scrapes < 1 or args.reclaims < 0:
        print("error: --containers >= 1, --gpus 1..16, --scrapes >= 1, --reclaims >= 0",
              file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    print(json.dumps(run(args.containers, args.gpus, args.scrapes, say, args.reclaims)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
