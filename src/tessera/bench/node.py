"""Benchmark of tessera-node on the fake driver: a metrics scrape with many containers, the
agent's memory, and (with the loan reclaimer) how long taking a loan back takes.

    python -m tessera.bench.node [--containers 100] [--gpus 8] [--scrapes 200]

One simulated machine (``--gpus`` fake H100s, shared process state), ``--containers`` shares
written as tessera-node writes them, each with one real process (cuprobe) holding memory under
the isolation library, and the agent as its own process (``tessera-node local``). Scrapes are
timed over HTTP from this process. The last line printed is one JSON object with
``reclaim_p50_seconds``, ``reclaim_p99_seconds`` (null until a reclaimer is built:
``tessera.node.reclaim``), ``scrape_seconds`` (median), ``scrape_p99_seconds``, ``containers``,
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


def run(containers: int, gpus: int, scrapes: int, say: Any) -> dict[str, Any]:
    from tessera.testing.cluster import free_ports

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
        return {
            "reclaim_p50_seconds": None, "reclaim_p99_seconds": None,
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
    args = parser.parse_args(argv)
    if args.containers < 1 or not 1 <= args.gpus <= 16 or args.scrapes < 1:
        print("error: --containers >= 1, --gpus 1..16, --scrapes >= 1", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    print(json.dumps(run(args.containers, args.gpus, args.scrapes, say)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
