"""Loans of dynamic fractions: real processes with the isolation library on the fake driver, one
simulated GPU, the node-wide ledger and the reclaimer (tessera.node.reclaim)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild
from tessera.node.ledger import Ledger
from tessera.node.reclaim import Reclaim, Reclaimer, ReclaimerThread, prepare_directory
from tests.isolation.conftest import GiB, clean_env, fake_uuids
from tests.isolation.loans_helpers import CTX, GPU, HEADROOM, started, workload

CAPACITY = 23 * GiB


@pytest.fixture
def gpu(native: NativeBuild, tmp_path: Path) -> str:
    prepare_directory(tmp_path / "loans")
    return fake_uuids(native, GPU)[0]


def test_a_loan_comes_only_from_memory_nobody_is_guaranteed(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    a = started(probe, workload(native, tmp_path, "a", gpu, 8 * GiB, 20 * GiB))
    b = started(probe, workload(native, tmp_path, "b", gpu, 10 * GiB, 20 * GiB))
    b.alloc(1 * GiB)  # b is on the ledger: its 10 GiB request is guaranteed
    # a may borrow what nobody is guaranteed: 23 - 10 (b) = 13 GiB in all.
    a.alloc(13 * GiB - CTX)  # with its context
    assert a(f"alloc {1 * GiB}")["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY: b's request is kept
    # b within its request: fits (a's loan came from unreserved memory only)
    b.alloc(9 * GiB - CTX)
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    with led.lock():
        pic = led.read()
    led.close()
    assert pic.capacity == CAPACITY and pic.headroom == HEADROOM
    shares = pic.shares()
    assert shares["a"].charged == 13 * GiB and shares["a"].loaned == 5 * GiB
    assert shares["b"].charged == 10 * GiB and shares["b"].loaned == 0


def test_owner_waits_and_the_borrower_is_killed(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    borrower = started(probe, workload(native, tmp_path, "borrower", gpu, 4 * GiB, 20 * GiB))
    borrower.alloc(18 * GiB - CTX)  # with its context: 14 GiB on loan: nobody else is on the GPU yet
    third = started(probe, workload(native, tmp_path, "third", gpu, 2 * GiB, 2 * GiB))
    third.alloc(2 * GiB - CTX)  # within its request, fits: 20 of 23 GiB used
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 10 * GiB, 10 * GiB))
    owner.send(f"alloc {8 * GiB}")  # within its request, 3 GiB free: waits for a reclaim
    time.sleep(0.2)
    assert owner.proc.poll() is None and borrower.proc.poll() is None  # waiting, nobody killed yet
    done: list[Reclaim] = []
    thread = ReclaimerThread(tmp_path / "loans", done.append).start()
    try:
        answer = owner.raw("", timeout=10)  # the alloc's answer (the empty line is ignored)
    finally:
        thread.stop()
    assert "rc=0" in answer, answer
    assert borrower.proc.wait(timeout=5) == -signal.SIGKILL
    assert third.proc.poll() is None  # within its request: never touched
    assert len(done) == 1
    r = done[0]
    assert (r.victim_share, r.owner_share, r.loan_bytes, r.killed) == ("borrower", "owner", 14 * GiB, True)
    assert r.victim_pid == borrower.proc.pid
    assert "GPU memory loan of 14 GiB reclaimed for owner on GPU-" in r.message()
    assert third("info")["rc"] == 0  # still answering


def test_the_lowest_priority_loses_its_loan_first(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    low = started(probe, workload(native, tmp_path, "low", gpu, GiB, 20 * GiB, priority=10))
    low.alloc(5 * GiB)  # 4 GiB on loan
    high = started(probe, workload(native, tmp_path, "high", gpu, GiB, 20 * GiB, priority=100))
    high.alloc(7 * GiB)  # 6 GiB on loan: the larger loan, but the higher priority
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {14 * GiB - CTX}")  # the rest of its 14 GiB beside its context: needs one reclaim
    done: list[Reclaim] = []
    thread = ReclaimerThread(tmp_path / "loans", done.append).start()
    try:
        assert "rc=0" in owner.raw("", timeout=10)
    finally:
        thread.stop()
    assert low.proc.wait(timeout=5) == -signal.SIGKILL
    assert high.proc.poll() is None and [r.victim_share for r in done] == ["low"]


def test_equal_priority_the_largest_loan_goes_first(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    small = started(probe, workload(native, tmp_path, "small", gpu, GiB, 20 * GiB))
    small.alloc(5 * GiB)  # 4 GiB on loan
    large = started(probe, workload(native, tmp_path, "large", gpu, GiB, 20 * GiB))
    large.alloc(7 * GiB)  # 6 GiB on loan
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {14 * GiB - CTX}")
    thread = ReclaimerThread(tmp_path / "loans", lambda r: None).start()
    try:
        assert "rc=0" in owner.raw("", timeout=10)
    finally:
        thread.stop()
    assert large.proc.wait(timeout=5) == -signal.SIGKILL
    assert small.proc.poll() is None


def test_a_reclaimer_killed_mid_reclaim_resumes_with_the_same_victim(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    first = started(probe, workload(native, tmp_path, "first", gpu, GiB, 20 * GiB))
    first.alloc(7 * GiB)
    second = started(probe, workload(native, tmp_path, "second", gpu, GiB, 20 * GiB))
    second.alloc(5 * GiB)
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {14 * GiB - CTX}")
    time.sleep(0.2)  # the demand is on the ledger
    # A reclaimer that writes its decision and dies before the kill (kill -9 of the agent there).
    dying = Reclaimer(tmp_path / "loans", kill=lambda pid, why: False)
    decided = dying.poll()
    dying.close()
    assert [r.victim_share for r in decided] == ["first"] and first.proc.poll() is None
    # The agent's next life: the same process is killed, no second victim is chosen.
    again = Reclaimer(tmp_path / "loans")
    try:
        deadline = time.monotonic() + 10
        while first.proc.poll() is None and time.monotonic() < deadline:
            assert again.poll() == []  # resumed, not decided anew
        assert "rc=0" in owner.raw("", timeout=10)
        for _ in range(20):
            assert again.poll() == []
    finally:
        again.close()
    assert first.proc.wait(timeout=5) == -signal.SIGKILL
    assert second.proc.poll() is None


def test_a_loan_gone_before_the_restart_is_not_taken_again(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    first = started(probe, workload(native, tmp_path, "first", gpu, GiB, 20 * GiB))
    first.alloc(7 * GiB)
    second = started(probe, workload(native, tmp_path, "second", gpu, GiB, 20 * GiB))
    second.alloc(5 * GiB)
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {14 * GiB - CTX}")
    time.sleep(0.2)
    dying = Reclaimer(tmp_path / "loans", kill=lambda pid, why: False)
    assert [r.victim_share for r in dying.poll()] == ["first"]
    dying.close()
    first.close()  # the borrower ends by itself before the agent comes back: its loan is gone
    first.proc.wait(timeout=5)
    again = Reclaimer(tmp_path / "loans")
    try:
        assert "rc=0" in owner.raw("", timeout=10)  # served by the memory the borrower freed
        for _ in range(20):
            assert again.poll() == []
    finally:
        again.close()
    assert second.proc.poll() is None  # nobody was killed for a loan that no longer exists


def test_a_held_ledger_lock_stops_nobody(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """#28 class 4: no lock is shared between tenants any more. Whoever holds byte 64 of the
    ledger (the old ledger lock: a tenant, stopped or not) decides nothing: another workload's
    allocations go on at once (before: each one waited the lock timeout and was refused)."""
    env = workload(native, tmp_path, "w", gpu, 4 * GiB, 8 * GiB)
    w = started(probe, env)  # its context is on the ledger: the file exists
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    try:
        with led.lock():  # held by this test process for as long as the allocations run
            started_at = time.monotonic()
            w.alloc(GiB)
            w.alloc(GiB)
            assert time.monotonic() - started_at < 2
    finally:
        led.close()
    assert "locked" not in w.stderr()


def test_equal_priority_and_loan_the_newest_process_goes_first(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    old = started(probe, workload(native, tmp_path, "old", gpu, GiB, 20 * GiB))
    old.alloc(6 * GiB)
    time.sleep(0.05)  # a later start time
    new = started(probe, workload(native, tmp_path, "new", gpu, GiB, 20 * GiB))
    new.alloc(6 * GiB)  # the same loan and priority: only the age differs
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {12 * GiB}")  # within its request (its context is charged too)
    thread = ReclaimerThread(tmp_path / "loans", lambda r: None).start()
    try:
        assert "rc=0" in owner.raw("", timeout=10)
    finally:
        thread.stop()
    assert new.proc.wait(timeout=5) == -signal.SIGKILL
    assert old.proc.poll() is None


def _agent(native, tmp_path, fault: str | None):  # type: ignore[no-untyped-def]
    """``tessera-node local`` (its reclaimer is the plugin of the real agent) on the fake GPU."""
    import subprocess
    import sys

    from tessera.testing.embedded import free_port

    env = clean_env(native, preload=False, devices=GPU)
    if fault:
        env["TESSERA_NODE_FAULT"] = fault
    (tmp_path / "shares").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "tessera.node", "local",
                             f"--shares-dir={tmp_path / 'shares'}", f"--metrics-port={free_port()}",
                             f"--loans-dir={tmp_path / 'loans'}", "--sync-interval=0.2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill_9_of_the_agent_mid_reclaim(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    first = started(probe, workload(native, tmp_path, "first", gpu, GiB, 20 * GiB))
    first.alloc(7 * GiB)
    second = started(probe, workload(native, tmp_path, "second", gpu, GiB, 20 * GiB))
    second.alloc(5 * GiB)
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 14 * GiB, 14 * GiB))
    owner.send(f"alloc {12 * GiB}")
    # The agent decides, writes its record, and is killed -9 before the kill is sent.
    dying = _agent(native, tmp_path, "die-mid-reclaim")
    assert dying.wait(timeout=30) == -signal.SIGKILL
    assert first.proc.poll() is None and second.proc.poll() is None  # nobody killed yet
    # Started again: the same victim is killed, no second one, the owner is served.
    agent = _agent(native, tmp_path, None)
    try:
        assert "rc=0" in owner.raw("", timeout=15)
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
        time.sleep(1.0)  # a few more reclaimer passes
        assert second.proc.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)
