"""A simulated GPU shared by cuspin tenants under the compute-share arbiter (tests and bench).

Each tenant is a real process running native/tests/cuspin with libtessera-cuda.so preloaded on
the fake driver's timing model; the arbiter file is the one tessera-node writes
(tessera.isolation.arbiter). Shares are computed from the fake GPU's ground truth (executed
nanoseconds per process), never from what the arbiter believes it charged.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tessera.isolation import arbiter
from tessera.isolation.build import NativeBuild
from tessera.testing import fake_gpu_sim


@dataclass
class Tenant:
    key: str
    request: float
    limit: float
    proc: subprocess.Popen[str] | None = None
    latency: bool = False


@dataclass
class SimGpu:
    build: NativeBuild
    root: Path
    mode: str = "fair"
    quantum_ms: float = 20.0
    preload: bool = True
    tenants: list[Tenant] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.arbiter = self.root / "gpu0.share"
        arbiter.create(self.arbiter, mode=self.mode, quantum_ms=self.quantum_ms)

    def env(self, key: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "LD_LIBRARY_PATH": str(self.build.fake_dir),
            "FAKE_CUDA_KERNEL_TIME": "grid",
            "FAKE_GPU_SIM_DIR": str(self.root),
            "TESSERA_GPU_COMPUTE_CONFIG": str(self.root / f"{key}.conf") if key else str(self.root / "none.conf"),
        })
        env.pop("LD_PRELOAD", None)
        if self.preload:
            env["LD_PRELOAD"] = str(self.build.library)
        env.update(extra or {})
        return env

    def add(self, key: str, request: float, limit: float | None = None, *, us: int = 1000, seconds: float = 10.0,
            inflight: int = 32, api: str = "launch", onoff_ms: int = 0, latency: bool = False,
            extra_env: dict[str, str] | None = None, register: bool = True) -> Tenant:
        lim = (1.0 if self.mode == "fair" else request) if limit is None else limit
        if register:
            arbiter.set_share(self.arbiter, arbiter.Share(key, request, lim, latency))
            arbiter.write_config(self.root / f"{key}.conf", [self.arbiter], key)
        args = [str(self.build.program("cuspin")), "--us", str(us), "--inflight", str(inflight), "--seconds",
                str(seconds), "--api", api, "--report-ms", "100000"]
        if onoff_ms:
            args += ["--onoff", str(onoff_ms)]
        proc = subprocess.Popen(args, env=self.env(key, extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        t = Tenant(key, request, lim, proc, latency)
        self.tenants.append(t)
        return t

    def sim(self) -> fake_gpu_sim.SimDevice:
        return fake_gpu_sim.read(fake_gpu_sim.sim_path(self.root))

    def executed(self) -> dict[str, int]:
        try:
            by_pid = self.sim().executed()
        except (ValueError, struct.error, FileNotFoundError):
            return {}  # the first process is still creating the device file
        return {t.key: by_pid.get(t.proc.pid, 0) for t in self.tenants if t.proc}

    def wait_running(self, timeout: float = 30.0) -> None:
        """Until every tenant has executed some work (process start is slow on a loaded machine)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(fake_gpu_sim.sim_path(self.root)):
                ex = self.executed()
                if len(ex) == len(self.tenants) and all(v > 0 for v in ex.values()):
                    return
            for t in self.tenants:
                if t.proc and t.proc.poll() is not None:
                    raise RuntimeError(f"tenant {t.key} exited early: {t.proc.stderr.read() if t.proc.stderr else ''}")
            time.sleep(0.02)
        raise TimeoutError("tenants did not start")

    def sample(self, seconds: float, every: float = 0.1) -> list[tuple[float, dict[str, int]]]:
        out = []
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            out.append((now, self.executed()))
            if now >= end:
                return out
            time.sleep(every)

    def holder(self) -> str | None:
        data = self.arbiter.read_bytes()
        slot = (int.from_bytes(data[64:72], "little") & 0xFFFF) - 1
        if slot < 0:
            return None
        off = arbiter.HEADER + slot * arbiter.SLOT_SIZE
        return data[off:off + 64].rstrip(b"\0").decode()

    def stop(self) -> list[str]:
        outs = []
        for t in self.tenants:
            if t.proc is None:
                continue
            if t.proc.poll() is None:
                try:
                    t.proc.send_signal(signal.SIGCONT)
                    t.proc.kill()
                except ProcessLookupError:
                    pass
            o, e = t.proc.communicate()
            outs.append(o + e)
        return outs


def windows(samples: list[tuple[float, dict[str, int]]], width: float = 1.0) -> list[tuple[float, dict[str, float]]]:
    """Non-overlapping windows of `width` seconds: (wall seconds, executed seconds per tenant)."""
    out = []
    i = 0
    while i < len(samples):
        t0, a = samples[i]
        j = i
        while j < len(samples) and samples[j][0] - t0 < width - 1e-3:
            j += 1
        if j >= len(samples):
            break
        t1, b = samples[j]
        out.append((t1 - t0, {k: (b.get(k, 0) - a.get(k, 0)) / 1e9 for k in b}))
        i = j
    return out


def entitlement(tenants: list[tuple[str, float, float]]) -> dict[str, float]:
    """Water-filling over backlogged tenants (key, request, limit): requests first, spare time
    split equally among tenants under their limit (the arbiter's fair rule)."""
    e = {k: min(r, lim) for k, r, lim in tenants}
    total = sum(e.values())
    if total > 1:
        e = {k: v / total for k, v in e.items()}
    spare = max(0.0, 1 - sum(e.values()))
    lim_of = {k: lim for k, _r, lim in tenants}
    for _ in range(len(tenants)):
        open_ = [k for k in e if e[k] < lim_of[k] - 1e-12]
        if spare <= 1e-9 or not open_:
            break
        each = spare / len(open_)
        for k in open_:
            add = min(each, lim_of[k] - e[k])
            e[k] += add
            spare -= add
    return e
