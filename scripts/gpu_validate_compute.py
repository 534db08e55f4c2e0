"""The checks of scripts/gpu-validate-compute.sh (design §6; docs/compute-share.md). NOT RUN YET.

Each tenant is a gpuspin process with libtessera-cuda.so preloaded and its own entry in one
arbiter file for GPU 0. On a real GPU there is no ground truth per process, so shares are kernel
completions per window normalised by the solo rate of the same kernel length. NVML's
`nvidia-smi pmon` is recorded as a cross-check only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

from tessera.isolation import arbiter


def uuid0() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Tenants:
    def __init__(self, args: argparse.Namespace, name: str, mode: str) -> None:
        self.args = args
        self.dir = Path(args.work) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.arb = self.dir / f"{uuid0()}.share"
        arbiter.create(self.arb, mode=mode)
        self.mode = mode
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def add(self, key: str, request: float, limit: float | None, us: float, seconds: float, *,
            onoff: int = 0, graph: bool = False, preload: bool = True) -> None:
        lim = limit if limit is not None else (1.0 if self.mode == "fair" else request)
        arbiter.set_share(self.arb, arbiter.Share(key, request, lim))
        conf = self.dir / f"{key}.conf"
        arbiter.write_config(conf, [self.arb], key)
        env = dict(os.environ, TESSERA_GPU_COMPUTE_CONFIG=str(conf))
        if preload:
            env["LD_PRELOAD"] = self.args.library
        argv = [self.args.spin, "--us", str(us), "--seconds", str(seconds)]
        if onoff:
            argv += ["--onoff", str(onoff)]
        if graph:
            argv.append("--graph")
        self.procs[key] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)

    def series(self) -> dict[str, list[tuple[float, int]]]:
        out = {}
        for key, p in self.procs.items():
            o, _e = p.communicate()
            pts = []
            for line in o.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] != "start":
                    pts.append((float(parts[0]), int(parts[1])))
            out[key] = pts
        return out


def rates(pts: list[tuple[float, int]], width: float = 1.0, skip: float = 1.0) -> list[float]:
    out, i = [], 0
    pts = [p for p in pts if p[0] >= skip]
    while i < len(pts):
        j = i
        while j < len(pts) and pts[j][0] - pts[i][0] < width - 1e-3:
            j += 1
        if j >= len(pts):
            break
        out.append((pts[j][1] - pts[i][1]) / (pts[j][0] - pts[i][0]))
        i = j
    return out


def solo(args: argparse.Namespace, us: float, graph: bool = False, preload: bool = True) -> float:
    t = Tenants(args, f"solo{us}{graph}{preload}", "fair")
    t.add("s", 1.0, 1.0, us, 5, graph=graph, preload=preload)
    return statistics.median(rates(t.series()["s"]))


def check(results: dict[str, object], name: str, ok: bool, detail: object) -> None:
    results[name] = {"pass": ok, "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--spin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res: dict[str, object] = {}
    pmon = subprocess.Popen(["nvidia-smi", "pmon", "-s", "u", "-d", "1"], stdout=subprocess.PIPE, text=True)
    for us in (100, 1000, 5000, 20000):
        base = solo(args, us)
        for mode in ("fair", "strict"):
            t = Tenants(args, f"share{us}{mode}", mode)
            t.add("a", 0.3, None, us, 8)
            t.add("b", 0.7, None, us, 8)
            s = t.series()
            ra, rb = rates(s["a"]), rates(s["b"])
            errs = [abs(a / (a + b) - 0.3) * 100 if mode == "fair" else abs(a / base - 0.3) * 100
                    for a, b in zip(ra, rb, strict=False) if a + b > 0]
            p95 = sorted(errs)[int(0.95 * (len(errs) - 1))] if errs else 100.0
            check(res, f"share_30_70_{mode}_{us}us", p95 <= 5, {"p95_pp": round(p95, 2), "windows": len(errs)})
    base = solo(args, 1000)
    t = Tenants(args, "strict_alone", "strict")
    t.add("a", 0.3, None, 1000, 8)
    r = statistics.mean(rates(t.series()["a"])) / base
    check(res, "strict_alone", abs(r - 0.3) <= 0.03, {"share": round(r, 3)})
    t = Tenants(args, "handoff", "fair")
    t.add("a", 0.5, None, 1000, 8)
    t.add("b", 0.5, None, 1000, 8)
    s = t.series()
    comb = statistics.median([a + b for a, b in zip(rates(s["a"]), rates(s["b"]), strict=False)]) / base
    check(res, "handoff", comb >= 0.97, {"combined_vs_solo": round(comb, 3)})
    t = Tenants(args, "conserve", "fair")
    t.add("a", 0.3, None, 1000, 9)
    t.add("b", 0.7, None, 1000, 9, onoff=1000)
    s = t.series()
    ra = rates(s["a"], 1.0, 1.0)
    off = [x / base for k, x in enumerate(ra) if k % 2 == 0]  # B off in its odd seconds (approx.)
    check(res, "fair_conserve", bool(off) and max(off) >= 0.95, {"a_vs_solo_while_b_off": [round(x, 3) for x in off]})
    on, plain = solo(args, 10, preload=True), solo(args, 10, preload=False)
    check(res, "overhead_10us", 1 - on / plain < 0.02, {"with": on, "without": plain})
    gbase = solo(args, 1000, graph=True)
    t = Tenants(args, "graphs", "strict")
    t.add("g", 0.3, None, 1000, 8, graph=True)
    g = statistics.mean(rates(t.series()["g"])) / gbase
    check(res, "graphs_strict", abs(g - 0.3) <= 0.05, {"share": round(g, 3)})
    t = Tenants(args, "kill", "fair")
    t.add("a", 0.5, None, 1000, 20)
    t.add("b", 0.5, None, 1000, 20)
    time.sleep(3)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        lease = int.from_bytes(t.arb.read_bytes()[64:72], "little") & 0xFFFF
        holder = t.arb.read_bytes()[256 + (lease - 1) * arbiter.SLOT_SIZE:][:1] if lease else b""
        if holder == b"b":
            break
    t0 = time.monotonic()
    t.procs["b"].send_signal(signal.SIGKILL)
    gap = None
    while time.monotonic() < t0 + 2:
        lease = int.from_bytes(t.arb.read_bytes()[64:72], "little") & 0xFFFF
        if lease and t.arb.read_bytes()[256 + (lease - 1) * arbiter.SLOT_SIZE:][:1] == b"a":
            gap = time.monotonic() - t0
            break
    t.procs["a"].kill()
    t.series()
    check(res, "kill_holder", gap is not None and gap < 0.030, {"seconds": gap})
    pmon.terminate()
    res["nvidia_smi_pmon"] = (pmon.communicate()[0] or "")[-4000:]
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v["pass"] for k, v in res.items() if isinstance(v, dict)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
