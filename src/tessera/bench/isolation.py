"""Overhead of the GPU memory isolation library on an allocate+free pair (fake driver).

Runs native/tests/benchalloc (cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB, entry points found with
dlopen + dlsym like the CUDA runtime) in four set-ups, interleaved, and reports the median ns per
pair (also, for a shared machine, the median of the per-round differences and the difference of
the fastest runs):
the fake driver alone, preloaded with no limit (pass-through), preloaded with a limit (private
accounting), and with a limit shared through a region file (the set-up workloads get).

    python -m tessera.bench.isolation [--pairs N] [--repeats R]

The last line printed is one JSON object. Target (issue 12): overhead under 200 ns per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tessera.isolation.build import NativeBuild, ensure_built

TARGET_NS = 200.0


def _env(build: NativeBuild, preload: bool, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TESSERA_", "FAKE_", "CUDA_")) and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = str(build.fake_dir)
    env["FAKE_GPU_DEVICES"] = "NVIDIA H100 80GB HBM3=81559Mi"
    if preload:
        env["LD_PRELOAD"] = str(build.library)
    env.update(extra)
    return env


def _run(build: NativeBuild, env: dict[str, str], pairs: int, size: int) -> float:
    out = subprocess.run([str(build.program("benchalloc")), str(pairs), str(size)], env=env,
                         capture_output=True, text=True, check=True).stdout
    fields = dict(token.split("=", 1) for token in out.split())
    return float(fields["ns_per_pair"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.isolation")
    parser.add_argument("--pairs", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", type=int, default=2**20)
    args = parser.parse_args(argv)
    build = ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        setups = {
            "baseline": _env(build, False, {}),
            "passthrough": _env(build, True, {}),
            "limited": _env(build, True, {"TESSERA_GPU_MEMORY_LIMIT": "8Gi"}),
            "shared_region": _env(build, True, {"TESSERA_GPU_MEMORY_LIMIT": "8Gi",
                                                "TESSERA_GPU_SHARED_REGION": str(Path(tmp) / "region")}),
        }
        samples: dict[str, list[float]] = {name: [] for name in setups}
        for _ in range(args.repeats):  # interleaved, so drift hits every set-up alike
            for name, env in setups.items():
                samples[name].append(_run(build, env, args.pairs, args.size))
    median = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in median.items():
        print(f"{name:>14}: {value:8.1f} ns/pair  (runs: {', '.join(f'{v:.0f}' for v in samples[name])})")
    overhead = median["shared_region"] - median["baseline"]
    # Noise on a shared machine only adds time: the fastest run of each set-up and the median of
    # the per-round differences (same round, same load) are recorded beside the medians.
    paired = statistics.median(s - b for s, b in zip(samples["shared_region"], samples["baseline"], strict=True))
    result = {
        "benchmark": "isolation",
        "pairs": args.pairs,
        "repeats": args.repeats,
        "size": args.size,
        "baseline_ns_per_pair": round(median["baseline"], 1),
        "passthrough_ns_per_pair": round(median["passthrough"], 1),
        "limited_ns_per_pair": round(median["limited"], 1),
        "shared_region_ns_per_pair": round(median["shared_region"], 1),
        "overhead_ns_per_pair": round(overhead, 1),
        "passthrough_overhead_ns_per_pair": round(median["passthrough"] - median["baseline"], 1),
        "overhead_paired_median_ns_per_pair": round(paired, 1),
        "overhead_fastest_ns_per_pair": round(min(samples["shared_region"]) - min(samples["baseline"]), 1),
        "target_ns_per_pair": TARGET_NS,
        "meets_target": overhead < TARGET_NS,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()}",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
