"""Several processes, one limit: the shared region, killed processes, and reclaim."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tessera.isolation import read_region
from tests.isolation.conftest import CTX, CTX_V100, GiB, Probe, clean_env

MiB = 2**20

KEY = "GPU-66616b65-313c-4752-5d68-737e89949faa"  # the fake H100's UUID


def shared(native, region, **extra):
    return clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "8Gi",
                                    "TESSERA_GPU_SHARED_REGION": str(region), **extra})


def test_two_processes_share_one_limit(native, probe, tmp_path):
    region = tmp_path / "region"
    a = probe(shared(native, region)).start()  # each process's context is charged CTX
    b = probe(shared(native, region)).start()
    pa = a.alloc(5 * GiB)
    assert b(f"alloc {3 * GiB}")["rc"] == 2
    b.alloc(2 * GiB)
    assert a.info() == (0, 8 * GiB)
    usage = read_region(region)[KEY]
    assert usage.used_bytes == 8 * GiB
    assert usage.limit_bytes == 8 * GiB
    assert sorted(usage.processes.values()) == [2 * GiB + CTX, 5 * GiB + CTX]
    assert a(f"free {pa}")["rc"] == 0
    b.alloc(5 * GiB)
    assert read_region(region)[KEY].used_bytes == 8 * GiB


def test_process_killed_mid_allocation_is_reclaimed(native, probe, tmp_path):
    region = tmp_path / "region"
    hang = 3 * GiB
    a = probe(shared(native, region, FAKE_CUDA_HANG_ALLOC_SIZE=str(hang))).start()
    a.alloc(2 * GiB)
    a.send(f"alloc {hang}")  # charged, then stuck inside the driver call
    a.wait_stderr_line("fake-cuda: hang")
    assert read_region(region)[KEY].used_bytes == 5 * GiB + CTX
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    b = probe(shared(native, region)).start()
    assert b.info() == (8 * GiB - CTX, 8 * GiB)
    b.alloc(8 * GiB - CTX)
    assert read_region(region)[KEY].processes == {b.proc.pid: 8 * GiB}


def test_process_killed_while_holding_the_region_lock(native, probe, tmp_path):
    region = tmp_path / "region"
    a = probe(shared(native, region, TESSERA_ISOLATION_FAULT=f"stall-in-lock={GiB}")).start()
    a.send(f"alloc {GiB}")  # stops inside the lock, between two updates
    a.wait_stderr_line("tessera-fault: stalled in lock")
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    b = probe(shared(native, region, TESSERA_ISOLATION_LOG="warn")).start()
    c = probe(shared(native, region)).start()
    b.alloc(8 * GiB - 2 * CTX)  # the lock is recovered and the half-made charge is gone
    assert b("alloc 1")["rc"] == 2
    assert c.info() == (0, 8 * GiB)
    assert "died holding the shared region lock" in b.stderr()


def test_exited_process_is_reclaimed(native, probe, tmp_path):
    region = tmp_path / "region"
    a = probe(shared(native, region)).start()
    a.alloc(6 * GiB)
    a.close()
    b = probe(shared(native, region)).start()
    assert b.info() == (8 * GiB - CTX, 8 * GiB)


def test_limits_are_per_device_in_the_region(native, probe, tmp_path):
    region = tmp_path / "region"
    devices = ";".join(["Tesla V100-SXM2-16GB=16Gi"] * 4)
    env = clean_env(native, devices=devices, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi",
                                                      "TESSERA_GPU_SHARED_REGION": str(region)})
    a = probe(env).start(0)
    b = probe(env).start(1)
    a.alloc(2 * GiB - CTX_V100)
    b.alloc(2 * GiB - CTX_V100)  # another device: its own 2 GiB
    assert a("ctx 1")["rc"] == 2  # device 1 is full, held by b: not even a context fits
    usage = read_region(region)
    assert len(usage) == 2
    assert {u.used_bytes for u in usage.values()} == {2 * GiB}


def test_concurrent_threads_and_processes_lose_no_update(native, probe, tmp_path):
    region = tmp_path / "region"
    env = clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi", "TESSERA_GPU_CONTEXT_OVERHEAD": "1Mi",
                                   "TESSERA_GPU_SHARED_REGION": str(region)})
    a, b = probe(env), probe(env)
    for p in (a, b):
        assert p("init")["rc"] == 0
    # 2 processes x 4 threads, each holding up to 4 blocks of ~256 MiB: far more than 2 GiB
    for p in (a, b):
        p.send(f"stress 4 20000 {256 * 2**20}")
    outcomes = []
    for p in (a, b):
        line = p.proc.stdout.readline() if p.proc.stdout else ""
        outcomes.append(dict((k, int(v)) for k, v in (t.split("=") for t in line.split())))
    # no fairness is promised between processes: one may be refused throughout
    assert all(o["errors"] == 0 for o in outcomes), outcomes
    assert sum(o["ok"] for o in outcomes) > 0 and sum(o["refused"] for o in outcomes) > 0, outcomes
    # what is left is each process's (still retained) primary context
    assert read_region(region)[KEY].used_bytes == 2 * MiB
    assert read_region(region)[KEY].processes == {a.proc.pid: MiB, b.proc.pid: MiB}


def test_forked_child_has_its_own_slot_and_does_not_keep_the_parents_alive(native, probe, tmp_path):
    region = tmp_path / "region"
    parent = probe(shared(native, region)).start()
    parent.alloc(3 * GiB)
    child = parent(f"fork {GiB} 60000")["child"]
    try:
        deadline = time.monotonic() + 10
        while child not in read_region(region)[KEY].processes and time.monotonic() < deadline:
            time.sleep(0.02)
        usage = read_region(region)[KEY]
        assert usage.processes == {parent.proc.pid: 3 * GiB + CTX, child: GiB}
        os.kill(parent.proc.pid, signal.SIGKILL)  # the child lives on, holding the inherited fd
        parent.proc.wait()
        other = probe(shared(native, region)).start()
        # the parent's 3 GiB (and context) are back, the child's GiB is not; other's context is charged
        assert other.info() == (7 * GiB - CTX, 8 * GiB)
    finally:
        os.kill(child, signal.SIGKILL)


def test_many_processes_starting_together(native, tmp_path):
    region = tmp_path / "region"
    env = shared(native, region, TESSERA_GPU_CONTEXT_OVERHEAD="1Mi")
    script = f"init\nctx 0\nalloc {200 * 2**20}\ninfo\nexit\n"
    procs = [subprocess.Popen([str(native.program("cuprobe")), "dlsym"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(32)]
    outputs = [p.communicate(script, timeout=60) for p in procs]
    for out, err in outputs:
        lines = out.splitlines()
        assert lines[2].startswith("rc=0 ptr="), (out, err)
        assert err == ""
    last = Probe(native, env).start()
    try:
        assert last.info() == (8 * GiB - MiB, 8 * GiB)  # every exited process reclaimed
        assert read_region(region)[KEY].processes == {last.proc.pid: MiB}
    finally:
        last.close()


def test_stopped_lock_holder_bounds_the_wait_and_refuses(native, probe, tmp_path):
    """#12 item 5, #28 (no lock convoy): a process SIGSTOPped while holding the region lock (it
    neither runs nor dies, so the robust mutex never reports EOWNERDEAD) must not block the rest
    of the workload. Charges are lock-free, so a process already attached allocates as if nothing
    happened; only a process attaching afresh (taking a slot needs the lock) waits, bounded, then
    is refused with a clear error; once the holder is gone it allocates."""
    region = tmp_path / "region"
    b = probe(shared(native, region, TESSERA_ISOLATION_LOCK_TIMEOUT_MS="300")).start()
    a = probe(shared(native, region, TESSERA_ISOLATION_FAULT=f"stall-in-lock={GiB}")).start()
    a.send(f"alloc {GiB}")
    a.wait_stderr_line("tessera-fault: stalled in lock")
    os.kill(a.proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    b.alloc(GiB)  # attached already: no wait at all
    assert time.monotonic() - started < 0.3
    c = probe(shared(native, region, TESSERA_ISOLATION_LOCK_TIMEOUT_MS="300"))
    assert c("init")["rc"] == 0
    assert c("ctx 0")["rc"] == 2  # its first charge needs a slot: bounded wait, refused
    assert c("ctx 0")["rc"] == 2  # later waits are short
    waited = time.monotonic() - started
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    assert c("ctx 0")["rc"] == 0  # the dead holder's lock is recovered
    c.alloc(GiB)
    err = c.stderr()
    assert f"held for more than 300 ms by process {a.proc.pid}" in err, err
    assert "refused" in err
    assert waited < 8, waited
