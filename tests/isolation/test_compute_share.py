"""Compute share (issue 30): the fake GPU's timing model, the arbiter and the launch gate.

Real processes (native/tests/cuspin, launching asynchronously) with libtessera-cuda.so preloaded
on the fake driver; shares come from the fake GPU's ground truth (executed ns per process).
Assertions use 2 s windows and tolerances that absorb a loaded 2-core machine; the tight
accuracy targets live in `python -m tessera.bench.compute` (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from tessera.isolation import arbiter
from tessera.isolation.build import NativeBuild
from tessera.testing.compute_share import SimGpu, windows


def _rates(gpu: SimGpu, seconds: float = 2.0) -> dict[str, float]:
    gpu.wait_running()
    time.sleep(0.3)
    s = gpu.sample(seconds, every=0.1)
    t = s[-1][0] - s[0][0]
    return {k: (s[-1][1][k] - s[0][1].get(k, 0)) / 1e9 / t for k in s[-1][1]}


def test_fake_gpu_round_robins_contexts_like_the_driver(native: NativeBuild, tmp_path: Path) -> None:
    """Without the library two saturating tenants get about half each, whatever they asked for."""
    gpu = SimGpu(native, tmp_path, preload=False)
    gpu.add("a", 0.1, register=False)
    gpu.add("b", 0.9, register=False)
    try:
        r = _rates(gpu)
    finally:
        gpu.stop()
    assert 0.35 < r["a"] < 0.65 and 0.35 < r["b"] < 0.65, r
    assert r["a"] + r["b"] > 0.9, r  # one context at a time, but the device is never idle
    assert gpu.sim().switches > 0


def test_fake_gpu_graphs_replay_their_captured_kernels(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, preload=False)
    t = gpu.add("g", 1.0, us=800, seconds=0.5, api="graph", register=False)
    out, err = t.proc.communicate(timeout=60) if t.proc else ("", "")
    res = json.loads(out.strip().splitlines()[-1])
    # 4 captured kernels of 200 us per graph launch; `completed` counts kernels.
    assert res["completed"] > 0 and res["executed_ns"] == res["completed"] * 200_000, (res, err)


def test_fair_share_follows_requests_not_one_over_n(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="fair")
    gpu.add("a", 0.3)
    gpu.add("b", 0.7)
    try:
        r = _rates(gpu, 3.0)
    finally:
        gpu.stop()
    share_a = r["a"] / (r["a"] + r["b"])
    assert 0.18 < share_a < 0.42, r  # 0.3 (the driver alone gives 0.5); the bench measures the error
    used = {u.key: u for u in arbiter.usage(gpu.arbiter)}
    assert used["a"].leases > 0 and used["b"].leases > used["a"].leases


def test_strict_caps_a_workload_alone_on_the_gpu(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="strict")
    gpu.add("a", 0.3)
    try:
        r = _rates(gpu, 3.0)
        usage = {u.key: u for u in arbiter.usage(gpu.arbiter)}
    finally:
        gpu.stop()
    assert 0.2 < r["a"] < 0.36, r
    # The per-workload GPU-time metric follows the ground truth.
    assert abs(usage["a"].share_1s - r["a"]) < 0.12, (usage["a"], r)


@pytest.mark.parametrize("api", ["ptsz", "ex", "ex_ptsz", "coop", "graph", "gpa1", "gpa2"])
def test_every_launch_path_is_gated(native: NativeBuild, tmp_path: Path, api: str) -> None:
    """cuLaunchKernel_ptsz, cuLaunchKernelEx[_ptsz], cooperative launches, cuGraphLaunch, and
    entry points fetched through cuGetProcAddress v1/v2 (the default path is dlsym): strict 0.2
    alone holds each to about 0.2 where ungated it would take the whole GPU."""
    gpu = SimGpu(native, tmp_path, mode="strict")
    gpu.add("a", 0.2, api=api)
    try:
        r = _rates(gpu, 2.0)
        usage = {u.key: u for u in arbiter.usage(gpu.arbiter)}
    finally:
        gpu.stop()
    assert r["a"] < 0.3, (api, r)
    assert usage["a"].leases > 0


def test_stream_capture_is_neither_gated_nor_charged(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="fair")
    gpu.add("busy", 0.5)
    gpu.wait_running()
    arbiter.set_share(gpu.arbiter, arbiter.Share("cap", 0.5, 1.0))
    arbiter.write_config(tmp_path / "cap.conf", [gpu.arbiter], "cap")
    proc = subprocess.run([str(native.program("cuspin")), "--us", "1000", "--capture-while-waiting"],
                          env=gpu.env("cap"), capture_output=True, text=True, timeout=60)
    usage = {u.key: u for u in arbiter.usage(gpu.arbiter)}
    gpu.stop()
    assert proc.returncode == 0 and "captured" in proc.stdout, proc.stderr
    assert usage["cap"].leases == 0 and usage["cap"].total_seconds == 0


def _refused(native: NativeBuild, gpu: SimGpu, key: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(native.program("cuspin")), "--us", "100", "--seconds", "0.2"], env=gpu.env(key),
                          capture_output=True, text=True, timeout=60)


def _rewrite_header(path: Path, **fields: int) -> None:
    data = bytearray(path.read_bytes())
    offsets = {"version": 8, "quantum_us": 24}
    for name, value in fields.items():
        struct.pack_into("<I", data, offsets[name], value)
    struct.pack_into("<I", data, 40, zlib.crc32(bytes(data[:40])))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fault, message", [
    ("missing", "No such file or directory"),
    ("version", "wrong version 2 (this library reads version 1)"),
    ("corrupt", "corrupt (header checksum)"),
    ("short", "shorter than its header"),
    ("slot", "corrupt (checksum of workload w's entry)"),
    ("no-entry", "has no entry for workload w"),
    ("bad-config", "is unusable (unknown line)"),
])
def test_unusable_arbiter_refuses_kernels_with_one_line(native: NativeBuild, tmp_path: Path, fault: str,
                                                        message: str) -> None:
    gpu = SimGpu(native, tmp_path, mode="fair")
    arbiter.set_share(gpu.arbiter, arbiter.Share("w", 0.5, 1.0))
    arbiter.write_config(tmp_path / "w.conf", [gpu.arbiter], "w")
    if fault == "missing":
        gpu.arbiter.unlink()
    elif fault == "version":
        _rewrite_header(gpu.arbiter, version=2)
    elif fault == "corrupt":
        data = bytearray(gpu.arbiter.read_bytes())
        data[24] ^= 0xFF
        gpu.arbiter.write_bytes(bytes(data))
    elif fault == "short":
        gpu.arbiter.write_bytes(b"\0" * 100)
    elif fault == "slot":
        data = bytearray(gpu.arbiter.read_bytes())
        data[arbiter.HEADER + 64] ^= 0x01  # the request, under its checksum
        gpu.arbiter.write_bytes(bytes(data))
    elif fault == "no-entry":
        arbiter.remove_share(gpu.arbiter, "w")
    elif fault == "bad-config":
        (tmp_path / "w.conf").write_text(f"arbiter {gpu.arbiter}\nworkload w\nrequest 0.5\n")
    proc = _refused(native, gpu, "w")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if "refused" in ln and "fail closed" in ln]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_no_configuration_means_no_gating(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="strict")
    gpu.add("free", 0.1, register=False)  # no gpu-compute.conf for it
    try:
        r = _rates(gpu, 1.5)
    finally:
        gpu.stop()
    assert r["free"] > 0.8


def test_mode_off_passes_kernels_through(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="off")
    gpu.add("a", 0.1, 0.1)
    try:
        r = _rates(gpu, 1.5)
    finally:
        gpu.stop()
    assert r["a"] > 0.8


def test_multi_gpu_share_is_reported_not_enforced(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="strict")
    second = tmp_path / "gpu1.share"
    arbiter.create(second, mode="strict")
    for a in (gpu.arbiter, second):
        arbiter.set_share(a, arbiter.Share("m", 0.2, 0.2))
    arbiter.write_config(tmp_path / "m.conf", [gpu.arbiter, second], "m")
    t = gpu.add("m", 0.2, register=False)
    try:
        r = _rates(gpu, 1.5)
    finally:
        outs = gpu.stop()
    assert r["m"] > 0.8  # not gated ...
    assert "compute share not enforced: multi-GPU" in outs[0]  # ... and said so
    assert all(u.multi_gpu for a in (gpu.arbiter, second) for u in arbiter.usage(a))
    assert t.key == "m"


def test_processes_of_one_workload_share_one_budget(native: NativeBuild, tmp_path: Path) -> None:
    gpu = SimGpu(native, tmp_path, mode="strict")
    one = gpu.add("w", 0.3)
    two = gpu.add("w", 0.3, register=False)
    pids = [t.proc.pid for t in (one, two) if t.proc]
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                if all(gpu.sim().executed().get(p, 0) > 0 for p in pids):
                    break
            except (ValueError, OSError):
                pass  # the device file is being created
            time.sleep(0.05)
        t0, a = time.monotonic(), gpu.sim().executed()
        time.sleep(3.0)
        t1, b = time.monotonic(), gpu.sim().executed()
    finally:
        gpu.stop()
    rates = [(b[p] - a[p]) / 1e9 / (t1 - t0) for p in pids]
    assert all(r > 0 for r in rates) and 0.15 < sum(rates) < 0.38, rates


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_dead_or_stopped_holder_loses_the_lease(native: NativeBuild, tmp_path: Path, sig: int) -> None:
    gpu = SimGpu(native, tmp_path, mode="fair")
    gpu.add("a", 0.5, seconds=30)
    b = gpu.add("b", 0.5, seconds=30)
    try:
        gpu.wait_running()
        end = time.monotonic() + 10
        while gpu.holder() != "b" and time.monotonic() < end:
            time.sleep(0.0005)
        assert b.proc is not None
        os.kill(b.proc.pid, sig)
        t0 = time.monotonic()
        while gpu.holder() != "a" and time.monotonic() < t0 + 5:
            time.sleep(0.0005)
        took = time.monotonic() - t0
        assert gpu.holder() == "a"
        # a keeps the GPU afterwards (b never comes back while stopped or dead)
        s = gpu.sample(1.0)
        w = windows(s, 0.9)[0]
        assert w[1]["a"] / w[0] > 0.8
    finally:
        gpu.stop()
    assert took < 1.0  # the q + 10 ms target is measured by the benchmark (recovery_seconds)


def test_latency_class_priority_keeps_the_shares(native: NativeBuild, tmp_path: Path) -> None:
    """An inference (latency-class) workload preempts while within its request, so a backlogged
    one gets no more than about its request: the batch partner keeps its share."""
    gpu = SimGpu(native, tmp_path, mode="fair")
    gpu.add("infer", 0.3, latency=True)
    gpu.add("batch", 0.7)
    try:
        r = _rates(gpu, 3.0)
    finally:
        gpu.stop()
    share = r["infer"] / (r["infer"] + r["batch"])
    assert 0.18 < share < 0.42, r


def test_a_process_killed_inside_the_arbiter_lock_does_not_stall_the_gpu(native: NativeBuild,
                                                                         tmp_path: Path) -> None:
    """Decisions run under a lock on the arbiter file's first byte (an OFD lock in the library):
    the kernel drops it when its holder dies, so the tenants go on."""
    gpu = SimGpu(native, tmp_path, mode="fair")
    gpu.add("a", 0.5)
    gpu.add("b", 0.5)
    locker = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0); print('locked', flush=True); time.sleep(60)", str(gpu.arbiter)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        time.sleep(0.5)
        stalled = gpu.executed()
        time.sleep(0.5)
        assert sum(gpu.executed().values()) - sum(stalled.values()) < 0.2e9  # at most one lease runs on
        locker.kill()
        locker.wait()
        r = _rates(gpu, 1.0)
    finally:
        locker.kill()
        gpu.stop()
    assert r["a"] + r["b"] > 0.8, r
