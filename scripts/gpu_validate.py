"""Validate libtessera-cuda.so on a real NVIDIA GPU (H100/H200). Run by scripts/gpu-validate.sh.

Checks (each prints PASS/FAIL with numbers; results also go to a JSON file):
  1. PyTorch under a 50% limit: torch.cuda.mem_get_info() reports the limit as total, and
     allocating past it raises torch.OutOfMemoryError (not a crash, not success);
  2. the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM: cuMemCreate/cuMemMap)
     and with backend:cudaMallocAsync (stream-ordered pools, charged by what the pool reserves);
  2b. a CUDA graph capture and replay under the limit; the real context overhead measured, and
     the library's own measurement of it (no context-overhead configured) compared with it;
  3. nvidia-smi under the library reports the limit as memory.total;
  4. two processes sharing one limit through a region file: the second is refused what the
     first holds;
  5. overhead: cuMemAlloc+cuMemFree pair latency (native/tests/benchalloc, real driver) with and
     without the library, a cudaMalloc-heavy PyTorch loop (caching allocator off), and a
     training step, with and without the library.

    python scripts/gpu_validate.py --lib PATH --bench PATH [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20

TORCH_LIMIT_PROBE = textwrap.dedent("""
    import json, torch
    OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    free, total = torch.cuda.mem_get_info()
    held, chunk, oom, error = [], 256 * 2**20, False, None
    try:
        while len(held) * chunk < 4 * total:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except OOM:
        oom = True
    except Exception as exc:  # anything but an OOM is a failure of the library
        error = repr(exc)
    print(json.dumps({"free": free, "total": total, "allocated": len(held) * chunk,
                      "oom": oom, "error": error}))
""")

TORCH_HOLD = textwrap.dedent("""
    import sys, torch
    n = int(sys.argv[1])
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    print("held", flush=True)
    sys.stdin.readline()
""")

TORCH_TRY = textwrap.dedent("""
    import sys, torch
    OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    try:
        x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
        print("ok")
    except OOM:
        print("oom")
""")

TORCH_MALLOC_LOOP = textwrap.dedent("""
    import time, torch
    torch.empty(1, device="cuda")
    n = 2000
    for _ in range(100):
        torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print((time.perf_counter() - t0) / n * 1e6)
""")

TORCH_TRAIN_STEP = textwrap.dedent("""
    import time, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 4096, device="cuda")
    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    n = 100
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    print((time.perf_counter() - t0) / n * 1e3)
""")


def physical_total() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * MiB


def env_with(lib: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env.pop("LD_PRELOAD", None)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0")
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    env.update(extra)
    return env


def py(code: str, env: dict[str, str], *args: str, timeout: int = 300) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def check_torch_limit(lib: Path, limit: int, alloc_conf: str | None) -> dict[str, Any]:
    extra = {"TESSERA_GPU_MEMORY_LIMIT": str(limit)}
    if alloc_conf:
        extra["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    r = json.loads(py(TORCH_LIMIT_PROBE, env_with(lib, **extra)))
    r["limit"] = limit
    r["pass"] = (r["total"] == limit and r["free"] <= limit and r["oom"] and r["error"] is None
                 and r["allocated"] <= limit and r["allocated"] >= limit - 2 * GiB)
    return r


TORCH_GRAPH = textwrap.dedent("""
    import json, torch
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    x = torch.randn(128, 2048, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    error = None
    try:
        with torch.cuda.graph(g):
            y = model(x)
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    except Exception as exc:
        error = repr(exc)
    print(json.dumps({"error": error, "reserved": torch.cuda.memory_reserved()}))
""")

CONTEXT_PROBE = textwrap.dedent("""
    import json, pynvml, torch
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetMemoryInfo(h).used
    torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
    after = pynvml.nvmlDeviceGetMemoryInfo(h).used
    print(json.dumps({"context_bytes": after - before, "name": torch.cuda.get_device_name(0)}))
""")


def check_graph(lib: Path, limit: int) -> dict[str, Any]:
    """A CUDA graph capture and replay under the limit (PyTorch's default allocator allocates the
    graph's buffers before capture, through the hooked calls)."""
    r = json.loads(py(TORCH_GRAPH, env_with(lib, TESSERA_GPU_MEMORY_LIMIT=str(limit))))
    r["pass"] = r["error"] is None and r["reserved"] <= limit
    return r


LIBRARY_MEASURED = re.compile(r"a CUDA context holds (\d+) bytes \(measured from ([^)]*)\)")


def check_context_overhead(lib: Path, limit: int) -> dict[str, Any]:
    """The real context overhead (NVML used before/after PyTorch's first context, no library)
    next to the library's per-model default, and what the library measures itself when no
    context-overhead is configured (docs/isolation.md, Context memory): it must find a figure
    (not fall back to the default) within a factor of two of NVML's."""
    r = json.loads(py(CONTEXT_PROBE, env_with(None)))
    name = r["name"]
    default_mib = next((mib for token, mib in (("H100", 512), ("H200", 512), ("B200", 512), ("A100", 448),
                                               ("L40", 448), ("L4", 448), ("A10", 448), ("V100", 320),
                                               ("T4", 320)) if token in name), 512)
    r["library_default_bytes"] = default_mib * MiB
    done = subprocess.run([sys.executable, "-c", "import torch; torch.empty(1, device='cuda'); print('ok')"],
                          env=env_with(lib, TESSERA_GPU_MEMORY_LIMIT=str(limit), TESSERA_ISOLATION_LOG="info"),
                          capture_output=True, text=True, timeout=300)
    found = LIBRARY_MEASURED.search(done.stderr)
    r["library_measured_bytes"] = int(found.group(1)) if found else None
    r["library_measured_from"] = found.group(2) if found else done.stderr[-500:]
    r["pass"] = (r["context_bytes"] > 0 and found is not None
                 and r["context_bytes"] / 2 <= int(found.group(1)) <= r["context_bytes"] * 2)
    return r


def check_smi(lib: Path, limit: int) -> dict[str, Any]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], env=env_with(lib, TESSERA_GPU_MEMORY_LIMIT=str(limit)),
                         capture_output=True, text=True, check=True)
    total_mib, used_mib = (int(v) for v in out.stdout.split(","))
    return {"total_mib": total_mib, "used_mib": used_mib, "limit_mib": limit // MiB,
            "stderr": out.stderr, "pass": total_mib == limit // MiB and out.stderr == ""}


def check_two_processes(lib: Path, limit: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = env_with(lib, TESSERA_GPU_MEMORY_LIMIT=str(limit),
                       TESSERA_GPU_SHARED_REGION=str(Path(tmp) / "region"))
        holder = subprocess.Popen([sys.executable, "-c", TORCH_HOLD, str(int(limit * 0.6))], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdin is not None
            first = holder.stdout.readline().strip()
            second_big = py(TORCH_TRY, env, str(int(limit * 0.6)))
            second_small = py(TORCH_TRY, env, str(int(limit * 0.2)))
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=60)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
    return {"first": first, "second_60pct": second_big, "second_20pct": second_small,
            "pass": first == "held" and second_big == "oom" and second_small == "ok"}


def median_of(runs: int, fn: Any) -> float:
    values = sorted(fn() for _ in range(runs))
    return values[len(values) // 2]


def overhead(lib: Path, bench: Path, limit: int) -> dict[str, Any]:
    plain, hooked = env_with(None), env_with(lib, TESSERA_GPU_MEMORY_LIMIT=str(limit))

    def pair(env: dict[str, str]) -> float:
        out = subprocess.run([str(bench), "20000", str(2 * MiB)], env=env, capture_output=True,
                             text=True, check=True).stdout
        return float(dict(t.split("=") for t in out.split())["ns_per_pair"])

    result: dict[str, Any] = {
        "driver_pair_ns": {"without": median_of(5, lambda: pair(plain)), "with": median_of(5, lambda: pair(hooked))},
    }
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    result["torch_malloc_loop_us"] = {
        "without": median_of(3, lambda: float(py(TORCH_MALLOC_LOOP, {**plain, **nocache}))),
        "with": median_of(3, lambda: float(py(TORCH_MALLOC_LOOP, {**hooked, **nocache}))),
    }
    result["train_step_ms"] = {
        "without": median_of(3, lambda: float(py(TORCH_TRAIN_STEP, plain))),
        "with": median_of(3, lambda: float(py(TORCH_TRAIN_STEP, hooked))),
    }
    for key in ("driver_pair_ns", "torch_malloc_loop_us", "train_step_ms"):
        r = result[key]
        r["overhead_pct"] = round((r["with"] - r["without"]) / r["without"] * 100, 2)
    result["pass"] = (result["train_step_ms"]["overhead_pct"] < 3
                      and result["torch_malloc_loop_us"]["overhead_pct"] < 5)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", type=Path, required=True)
    parser.add_argument("--bench", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("FAIL: nvidia-smi not found: this script needs an NVIDIA GPU and driver", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print("FAIL: PyTorch is not installed in this Python", file=sys.stderr)
        return 2
    total = physical_total()
    limit = total // 2
    results: dict[str, Any] = {"physical_total": total, "limit": limit}
    checks = {
        "torch_limit": lambda: check_torch_limit(args.lib, limit, None),
        "torch_limit_expandable_segments": lambda: check_torch_limit(args.lib, limit, "expandable_segments:True"),
        "torch_limit_cuda_malloc_async": lambda: check_torch_limit(args.lib, limit, "backend:cudaMallocAsync"),
        "cuda_graph_capture": lambda: check_graph(args.lib, limit),
        "context_overhead": lambda: check_context_overhead(args.lib, limit),
        "nvidia_smi": lambda: check_smi(args.lib, limit),
        "two_processes_one_limit": lambda: check_two_processes(args.lib, limit),
        "overhead": lambda: overhead(args.lib, args.bench, limit),
    }
    ok = True
    for name, fn in checks.items():
        try:
            results[name] = fn()
        except Exception as exc:
            results[name] = {"pass": False, "error": repr(exc)}
        ok &= bool(results[name]["pass"])
        print(f"{'PASS' if results[name]['pass'] else 'FAIL'} {name}: {json.dumps(results[name])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps({"gpu_validation": "pass" if ok else "fail", **results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
