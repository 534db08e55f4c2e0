"""Fault suite for tessera-node's reclaimer: kill -9 the agent while it takes a loan back, start
it again, and check that it never reclaims twice.

``python -m tessera.bench.faults_node [--trials 100] [--seed 1]``

Each trial, in a fresh directory, on one simulated L4 (24 GiB; the fake driver of
``native/fakedriver``, the isolation library preloaded, the node-wide loans ledger): two
borrowers (request 1 GiB, limit 20 GiB) take 7 and 5 GiB, an owner (request 14 GiB) asks for
12 GiB within its request and waits. Then the real agent (``python -m tessera.node local``)
starts and is killed with SIGKILL:

* ``point`` trials (even): at the worst moment, after it wrote its reclaim record and before it
  sent the kill (``TESSERA_NODE_FAULT=die-mid-reclaim``);
* ``random`` trials (odd): 0-0.6 s after it started, wherever it is.

It is started again, and the checks are: the owner is served; exactly one borrower was killed
over the whole trial (the one the first agent chose: no second victim, none killed twice); the
other borrower still runs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GiB = 2**30
GPU = "NVIDIA L4=24Gi"
HEADROOM = 1 * GiB
CTX = 256 * 2**20


class Probe:
    """One cuprobe process (a CUDA program on the fake driver): a command, a one-line answer."""

    def __init__(self, program: Path, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen([str(program), "dlsym"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=dict(env), bufsize=1)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else ""

    def ok(self, line: str) -> bool:
        self.send(line)
        return self.answer(10).startswith("rc=0")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def clean_env(native: Any, *, preload: bool, extra: Mapping[str, str] | None = None
              ) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TESSERA_", "FAKE_", "CUDA_")) and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = str(native.fake_dir)
    env["FAKE_GPU_DEVICES"] = GPU
    if preload:
        env["LD_PRELOAD"] = str(native.library)
    env.update(extra or {})
    return env


def gpu_uuid(native: Any) -> str:
    out = subprocess.run([str(native.program("smi"))], env=clean_env(native, preload=False),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return out.splitlines()[0].split(", ")[2]


class Trial:
    def __init__(self, native: Any, root: Path, uuid: str) -> None:
        from tessera.node.reclaim import prepare_directory

        self.native, self.root, self.uuid = native, root, uuid
        self.loans = root / "loans"
        prepare_directory(self.loans)
        (root / "shares").mkdir()
        self.probes: list[Probe] = []
        self.agent: subprocess.Popen[bytes] | None = None

    def workload(self, name: str, request: int, limit: int) -> Probe:
        from tessera.isolation import DeviceShare
        from tessera.isolation.config import LoansConfig, write_workload_files

        loans = LoansConfig(self.loans, share=name, priority=0, wait_ms=30_000,
                            headroom_bytes=HEADROOM)
        files = write_workload_files(self.root / name, [DeviceShare(0, self.uuid, limit, request)],
                                     loans=loans, context_overhead_bytes=CTX)
        # One GPU for every process (FAKE_GPU_STATE): the driver's free memory is the node's, as on
        # a real GPU (the library asks it before holding a within-request allocation back).
        p = Probe(self.native.program("cuprobe"), clean_env(
            self.native, preload=True, extra={"TESSERA_GPU_CONFIG": str(files.config_path),
                                              "FAKE_GPU_STATE": str(self.root / "gpu.state")}))
        self.probes.append(p)
        if not (p.ok("init") and p.ok("ctx 0")):
            raise RuntimeError(f"{name}: the probe did not start")
        return p

    def start_agent(self, fault: str | None) -> subprocess.Popen[bytes]:
        from tessera.testing.embedded import free_port

        env = clean_env(self.native, preload=False,
                        extra={"TESSERA_NODE_FAULT": fault} if fault else None)
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "tessera.node", "local", f"--shares-dir={self.root / 'shares'}",
             f"--metrics-port={free_port()}", f"--loans-dir={self.loans}", "--sync-interval=0.2"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.agent

    def cleanup(self) -> None:
        for p in self.probes:
            p.kill()
        if self.agent is not None and self.agent.poll() is None:
            self.agent.kill()
            self.agent.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def run_trial(native: Any, uuid: str, index: int, rng: random.Random, root: Path
              ) -> dict[str, Any]:
    mode = "point" if index % 2 == 0 else "random"
    trial = Trial(native, root / f"t{index}", uuid)
    problems: list[str] = []
    try:
        first = trial.workload("first", GiB, 20 * GiB)
        if not first.ok(f"alloc {7 * GiB}"):
            raise RuntimeError("first could not borrow")
        second = trial.workload("second", GiB, 20 * GiB)
        if not second.ok(f"alloc {5 * GiB}"):
            raise RuntimeError("second could not borrow")
        owner = trial.workload("owner", 14 * GiB, 14 * GiB)
        owner.send(f"alloc {12 * GiB}")  # within its request: waits for a reclaim
        if mode == "point":
            dying = trial.start_agent("die-mid-reclaim")
            if dying.wait(timeout=60) != -signal.SIGKILL:
                problems.append("the agent did not die at the reclaim point")
            if first.proc.poll() is not None or second.proc.poll() is not None:
                problems.append("a borrower was killed although the agent died before the kill")
        else:
            dying = trial.start_agent(None)
            time.sleep(rng.uniform(0.0, 0.6))
            dying.kill()
            dying.wait()
        killed_before = [n for n, p in (("first", first), ("second", second))
                         if p.proc.poll() is not None]
        trial.start_agent(None)
        answer = owner.answer(30)
        if not answer.startswith("rc=0"):
            problems.append(f"the owner was not served ({answer or 'no answer'})")
        time.sleep(1.0)  # a few more reclaimer passes
        killed = [n for n, p in (("first", first), ("second", second))
                  if p.proc.poll() is not None]
        if len(killed) != 1:
            problems.append(f"{len(killed)} borrowers killed ({killed}); exactly one must be")
        if killed_before and killed != killed_before:
            problems.append(f"after the restart {killed} were killed; before it {killed_before}")
        for n, p in (("first", first), ("second", second)):
            if p.proc.poll() is not None and p.proc.returncode != -signal.SIGKILL:
                problems.append(f"{n} ended with {p.proc.returncode}, not SIGKILL")
        return {"mode": mode, "killed_before_restart": len(killed_before), "problems": problems}
    finally:
        trial.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.faults_node")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tessera.isolation.build import ensure_built

    native = ensure_built()
    uuid = gpu_uuid(native)
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    failed, first, modes, before = 0, None, {"point": 0, "random": 0}, 0
    with tempfile.TemporaryDirectory(prefix="tessera-faults-node-") as tmp:
        for i in range(args.trials):
            result = run_trial(native, uuid, i, rng, Path(tmp))
            modes[result["mode"]] += 1
            before += result["killed_before_restart"]
            if result["problems"]:
                failed += 1
                first = first or f"trial {i} ({result['mode']}): {result['problems'][0]}"
            print(f"trial {i}: {result['mode']}, "
                  f"{'; '.join(result['problems']) or 'ok'}", file=sys.stderr, flush=True)
    summary = {"bench": "faults_node", "gpu": GPU, "seed": args.seed,
               "reclaim": {"trials": args.trials, "kills": args.trials, "modes": modes,
                           "victim_killed_before_the_agent_died": before,
                           "failed_trials": failed, "first_failure": first},
               "seconds": round(time.monotonic() - t0, 1)}
    summary["ok"] = failed == 0
    print(json.dumps(summary))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
