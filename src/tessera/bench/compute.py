"""Compute share accuracy on the fake driver's timing model (issue 30; docs/compute-share.md).

    python -m tessera.bench.compute [--seconds 6] [--quick]

Every tenant is a real process (native/tests/cuspin: unsynchronised 1 ms kernels, at most 32 in
flight) with libtessera-cuda.so preloaded; shares are the fake GPU's ground truth (executed ns per
process) over 1 s windows. Scenarios: 2 tenants 30/70 fair and strict, 4 and 8 tenants with uneven
requests (fair), a bursty partner (on/off every 1 s). Fair windows compare each tenant's part of
the GPU time used with its entitlement (water-filling); strict windows compare its throughput
with its limit times the solo throughput. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tessera.isolation.build import NativeBuild, ensure_built
from tessera.testing.compute_share import SimGpu, entitlement, windows

Spec = tuple[str, float, float | None, int]
Samples = list[tuple[float, dict[str, int]]]


def _pctl(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def _run(root: Path, name: str, mode: str, specs: Sequence[Spec], seconds: float, build: NativeBuild,
         preload: bool = True, us: int = 1000, inflight: int = 32) -> tuple[SimGpu, Samples]:
    gpu = SimGpu(build, root / name, mode=mode, preload=preload)
    for key, r, lim, onoff in specs:
        gpu.add(key, r, lim, us=us, seconds=seconds + 30, onoff_ms=onoff, inflight=inflight)
    try:
        gpu.wait_running()
        time.sleep(0.5)
        samples = gpu.sample(seconds)
    finally:
        gpu.stop()
    return gpu, samples


def solo_throughput(root: Path, build: NativeBuild, seconds: float) -> float:
    """One tenant alone (library on, fair): the device time it gets per second, median of the
    1 s windows of three runs (the host's load moves it)."""
    rates = []
    for i in range(3):
        _gpu, s = _run(root, f"solo{i}", "fair", [("solo", 1.0, 1.0, 0)], seconds, build)
        rates += [w["solo"] / dt for dt, w in windows(s)]
    return statistics.median(rates)


def share_errors(root: Path, build: NativeBuild, seconds: float, solo: float) -> dict[str, list[float]]:
    scen = {
        "fair_30_70": ("fair", [("a", 0.3, None, 0), ("b", 0.7, None, 0)]),
        "strict_30_70": ("strict", [("a", 0.3, None, 0), ("b", 0.7, None, 0)]),
        "fair_4_uneven": ("fair", [("a", 0.1, None, 0), ("b", 0.2, None, 0), ("c", 0.3, None, 0),
                                   ("d", 0.4, None, 0)]),
        "fair_8_uneven": ("fair", [(k, r, None, 0) for k, r in zip("abcdefgh", (0.05, 0.05, 0.1, 0.1, 0.1, 0.15,
                                                                                  0.2, 0.25), strict=True)]),
    }
    out: dict[str, list[float]] = {}
    for name, (mode, specs) in scen.items():
        gpu, s = _run(root, name, mode, specs, seconds, build)
        ent = entitlement([(t.key, t.request, t.limit) for t in gpu.tenants])
        errs = []
        for dt, w in windows(s):
            used = sum(w.values())
            if mode == "strict":
                err = max(abs(w[k] / dt / solo - ent[k]) for k in w)
            else:
                err = max(abs(w[k] / used - ent[k]) for k in w) if used > 0 else 1.0
            errs.append(100 * err)
        out[name] = errs
    return out


def bursty(root: Path, build: NativeBuild, seconds: float, solo: float) -> tuple[list[float], list[float]]:
    """A (r 0.3, fair) backlogged; B (r 0.7) on and off every second (cuspin --onoff, which prints
    when its first on-second began). Windows are B's seconds, less their first 100 ms: errors
    while B is on, and A's throughput (against solo) in each second B is off."""
    gpu = SimGpu(build, root / "bursty", mode="fair")
    gpu.add("a", 0.3, seconds=seconds + 40)
    b = gpu.add("b", 0.7, seconds=seconds + 40, onoff_ms=1000)
    try:
        assert b.proc is not None and b.proc.stdout is not None
        line = b.proc.stdout.readline().split()
        start = int(line[1]) / 1000 if len(line) == 2 and line[0] == "start" else None
        gpu.wait_running()
        samples = gpu.sample(seconds + 2, every=0.05)
    finally:
        gpu.stop()
    if start is None:
        raise RuntimeError("cuspin --onoff did not say when it started")
    errs, conserve = [], []
    k = int((samples[0][0] - start) // 1) + 1
    while start + k + 1 <= samples[-1][0]:
        lo, hi = start + k + 0.1, start + k + 1.0
        inside = [(t, e) for t, e in samples if lo <= t <= hi]
        if len(inside) >= 2:
            (t0, e0), (t1, e1) = inside[0], inside[-1]
            a_rate = (e1["a"] - e0["a"]) / 1e9 / (t1 - t0)
            b_rate = (e1["b"] - e0["b"]) / 1e9 / (t1 - t0)
            if k % 2 == 0:  # B on
                if a_rate + b_rate > 0:
                    errs.append(100 * abs(a_rate / (a_rate + b_rate) - 0.3))
            else:
                conserve.append(a_rate / solo)
        k += 1
    return errs, conserve


def strict_alone(root: Path, build: NativeBuild, seconds: float, solo: float) -> float:
    _gpu, s = _run(root, "strict_alone", "strict", [("a", 0.3, None, 0)], seconds, build)
    rates = [w["a"] / dt / solo for dt, w in windows(s)]
    return 100 * abs(statistics.mean(rates) - 0.3)


def handoff(root: Path, build: NativeBuild, seconds: float, solo: float) -> float:
    _gpu, s = _run(root, "handoff", "fair", [("a", 0.5, None, 0), ("b", 0.5, None, 0)], seconds, build)
    return statistics.median(sum(w.values()) / dt for dt, w in windows(s)) / solo


def overhead(root: Path, build: NativeBuild, seconds: float, reps: int) -> float:
    """10 µs kernels, alone: launches completed per second with the library and the arbiter
    (fair, request 1) against without the library, interleaved runs, medians."""
    on: list[float] = []
    off: list[float] = []
    for i in range(reps):
        for pre, bucket in ((True, on), (False, off)):
            _gpu, s = _run(root, f"ovh{i}{int(pre)}", "fair", [("a", 1.0, 1.0, 0)], seconds, build, preload=pre,
                          us=10, inflight=256)
            bucket.append(statistics.median(w["a"] / dt for dt, w in windows(s)))
    return float(max(0.0, 1 - statistics.median(on) / statistics.median(off)))


def recovery(root: Path, build: NativeBuild, sig: int) -> float:
    """Two backlogged tenants; the holder B is killed (or stopped) while holding the lease: seconds
    until A holds it."""
    gpu = SimGpu(build, root / f"recover{sig}", mode="fair")
    gpu.add("a", 0.5, seconds=30)
    b = gpu.add("b", 0.5, seconds=30)
    try:
        gpu.wait_running()
        end = time.monotonic() + 10
        while gpu.holder() != "b" and time.monotonic() < end:
            time.sleep(0.0005)
        t0 = time.monotonic()
        assert b.proc is not None
        os.kill(b.proc.pid, sig)
        while gpu.holder() != "a" and time.monotonic() < t0 + 5:
            time.sleep(0.0002)
        return time.monotonic() - t0
    finally:
        gpu.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.compute")
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per scenario")
    ap.add_argument("--quick", action="store_true", help="3 s scenarios, 1 overhead repetition")
    args = ap.parse_args(argv)
    secs = 3.0 if args.quick else args.seconds
    build = ensure_built()
    with tempfile.TemporaryDirectory(prefix="tessera-compute-") as tmp:
        root = Path(tmp)
        solo = solo_throughput(root, build, secs)
        errs = share_errors(root, build, secs, solo)
        b_errs, conserve = bursty(root, build, secs, solo)
        errs["bursty_partner"] = b_errs
        alone = strict_alone(root, build, secs, solo)
        hand = handoff(root, build, secs, solo)
        ovh = overhead(root, build, max(2.0, secs / 2), 1 if args.quick else 3)
        rec = [recovery(root, build, signal.SIGKILL) for _ in range(3)] + [recovery(root, build, signal.SIGSTOP)]
    all_errs = [e for v in errs.values() for e in v]
    result = {
        "bench": "compute",
        "machine": f"{os.cpu_count()} cores, fake driver (FAKE_GPU_TIMESLICE_US 2000, switch 25 us)",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "quantum_ms": 20,
        "solo_throughput": round(solo, 4),
        "share_error_p95_pp": round(_pctl(all_errs, 95), 2),
        "share_error_p95_pp_by_scenario": {k: round(_pctl(v, 95), 2) for k, v in errs.items()},
        "windows": len(all_errs),
        "strict_alone_error_pp": round(alone, 2),
        "fair_conservation": round(min(conserve), 3) if conserve else None,
        "handoff_efficiency": round(hand, 4),
        "overhead_fraction": round(ovh, 4),
        "recovery_seconds": round(max(rec), 4),
        "recovery_seconds_each": [round(r, 4) for r in rec],
        "targets": {"share_error_p95_pp": 5, "strict_alone_error_pp": 3, "fair_conservation": 0.95,
                    "handoff_efficiency": 0.97, "overhead_fraction": 0.02, "recovery_seconds": 0.030},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
