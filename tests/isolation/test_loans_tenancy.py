"""Issue #28 class 4: nothing a tenant writes into the node-wide loans ledger decides another
tenant's fate. Real processes with the library on the fake driver (one GPU shared through
FAKE_GPU_STATE), the real reclaimer; the "tenant" is this test writing the ledger file the way
any share container can (it is mounted read-write into every one of them)."""

from __future__ import annotations

import signal
import struct
import threading
import time
from pathlib import Path

import pytest

from tessera.node.ledger import (
    ENTRIES_OFFSET,
    ENTRY,
    ENTRY_SIZE,
    Authority,
    Ledger,
    Terms,
    owner_pid,
)
from tessera.node.reclaim import Reclaim, Reclaimer, ReclaimerThread, prepare_directory
from tests.isolation.conftest import GiB, fake_uuids
from tests.isolation.loans_helpers import CTX, GPU, started, workload


@pytest.fixture
def gpu(native, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    prepare_directory(tmp_path / "loans")
    return fake_uuids(native, GPU)[0]

RECORD = struct.Struct("=iIIIQQQ64s64s")  # the old in-ledger reclaim record (offset 128)


def _entry_of(led: Ledger, pid: int):  # type: ignore[no-untyped-def]
    return next(e for e in led.read().entries if e.pid == pid)


def test_a_forged_reclaim_record_kills_nobody(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """Before: a record in the ledger naming a live entry and its host pid was "resumed" by the
    reclaimer, which SIGKILLed that process. Records now live in the reclaimer's own journal."""
    victim = started(probe, workload(native, tmp_path, "victim", gpu, 4 * GiB, 8 * GiB))
    victim.alloc(GiB)
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 4 * GiB, 8 * GiB))
    owner.alloc(GiB)
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    e = _entry_of(led, victim.proc.pid)
    RECORD.pack_into(led.map, 128, victim.proc.pid, 1, e.index, 0, GiB, time.time_ns(), e.start_ns,
                     b"victim", b"owner")
    # ... and a demand, so the reclaimer looks at this ledger at all.
    off = ENTRIES_OFFSET + _entry_of(led, owner.proc.pid).index * ENTRY_SIZE
    struct.pack_into("=QQ", led.map, off + 48, GiB, time.time_ns())
    rec = Reclaimer(tmp_path / "loans")
    try:
        for _ in range(20):
            rec.poll()
    finally:
        rec.close()
        led.close()
    time.sleep(0.1)
    assert victim.proc.poll() is None, "killed on a record the tenant wrote"
    assert victim("info")["rc"] == 0


def test_a_held_ledger_lock_does_not_stall_reclaim(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """Before: the reclaimer waited for the ledger lock without bound; a tenant holding it
    stalled every reclaim on the GPU. Now it never takes that lock."""
    borrower = started(probe, workload(native, tmp_path, "borrower", gpu, 4 * GiB, 20 * GiB))
    borrower.alloc(18 * GiB - CTX)
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 10 * GiB, 10 * GiB))
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    done: list[Reclaim] = []
    with led.lock():  # the tenant holds it for as long as the owner waits
        owner.send(f"alloc {8 * GiB}")
        thread = ReclaimerThread(tmp_path / "loans", done.append).start()
        try:
            answer = owner.raw("", timeout=10)
        finally:
            stopper = threading.Thread(target=thread.stop)
            stopper.start()
            stopper.join(10)
    led.close()
    assert "rc=0" in answer, answer
    assert borrower.proc.wait(timeout=5) == -signal.SIGKILL
    assert [r.victim_share for r in done] == ["borrower"]


def test_a_rewritten_entry_gets_no_innocent_process_killed(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """Under tessera-node the reclaimer checks each entry against the agent's own picture (which
    share a process is in, the share's request and priority, what its own region says it holds).
    A tenant rewrites an innocent workload's entry (charged 20 GiB, priority lowest) so it looks
    like the biggest, cheapest borrower. Before: that process was killed. Now the real borrower is."""
    borrower = started(probe, workload(native, tmp_path, "borrower", gpu, 4 * GiB, 20 * GiB))
    borrower.alloc(14 * GiB - CTX)  # 10 GiB on loan
    innocent = started(probe, workload(native, tmp_path, "innocent", gpu, 6 * GiB, 6 * GiB))
    innocent.alloc(2 * GiB - CTX)  # within its request
    owner = started(probe, workload(native, tmp_path, "owner", gpu, 10 * GiB, 10 * GiB))
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    ie = _entry_of(led, innocent.proc.pid)
    off = ENTRIES_OFFSET + ie.index * ENTRY_SIZE
    fields = list(ENTRY.unpack_from(led.map, off))
    fields[2] = -1_000_000  # priority
    fields[4] = 0  # request
    fields[6] = 20 * GiB  # charged
    ENTRY.pack_into(led.map, off, *fields)
    # What tessera-node knows from its own sources (cgroups/regions, the shares it configured).
    pids = {p.proc.pid: name for p, name in ((borrower, "borrower"), (innocent, "innocent"), (owner, "owner"))}
    authority = Authority(
        share_of_pid={pid: name for pid, name in pids.items()},
        terms={("borrower", gpu): Terms(4 * GiB, 20 * GiB, 14 * GiB),
               ("innocent", gpu): Terms(6 * GiB, 6 * GiB, 2 * GiB),
               ("owner", gpu): Terms(10 * GiB, 10 * GiB, CTX)},
        priority={"borrower": 50, "innocent": 50, "owner": 50})
    led.close()
    owner.send(f"alloc {8 * GiB}")  # within its request; 23 - 16 - ctx free: waits for a reclaim
    rec = Reclaimer(tmp_path / "loans", authority=authority, resolve=owner_pid)
    done: list[Reclaim] = []
    thread = ReclaimerThread(tmp_path / "loans", done.append, reclaimer=rec).start()
    try:
        assert "rc=0" in owner.raw("", timeout=10)
    finally:
        thread.stop()
    assert borrower.proc.wait(timeout=5) == -signal.SIGKILL
    assert innocent.proc.poll() is None, "an innocent process was killed on a forged entry"
    assert [r.victim_share for r in done] == ["borrower"]


def test_an_entry_claiming_another_share_is_ignored(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """An entry whose lock holder the agent places in another share than the entry names is
    not acted on (neither victim nor owner)."""
    borrower = started(probe, workload(native, tmp_path, "borrower", gpu, 4 * GiB, 20 * GiB))
    borrower.alloc(14 * GiB - CTX)
    rec = Reclaimer(tmp_path / "loans", authority=Authority(
        share_of_pid={borrower.proc.pid: "someone-else"},
        terms={("borrower", gpu): Terms(4 * GiB, 20 * GiB, 14 * GiB)}, priority={}))
    rec.scan()
    led = rec.ledgers[gpu]
    trusted, _ = rec._trusted(led, led.read().entries)
    rec.close()
    assert trusted == []


def test_an_inflated_loan_in_the_ledger_refuses_nobody_elses_loan(native, tmp_path, gpu, probe):  # type: ignore[no-untyped-def]
    """A tenant writes its entry up to 20 GiB charged (a 10 GiB loan it does not hold). Before:
    every other workload's loan was refused (23 - 20 GiB kept back: a got 3 GiB). Others' loans
    are now bounded by what the driver says the device holds beside the deciding workload, so a
    still borrows what nobody is guaranteed or really holds."""
    a = started(probe, workload(native, tmp_path, "a", gpu, 8 * GiB, 20 * GiB))
    b = started(probe, workload(native, tmp_path, "b", gpu, 10 * GiB, 20 * GiB))
    b.alloc(1 * GiB)
    led = Ledger(tmp_path / "loans" / f"{gpu}.ledger")
    off = ENTRIES_OFFSET + _entry_of(led, b.proc.pid).index * ENTRY_SIZE
    fields = list(ENTRY.unpack_from(led.map, off))
    fields[6] = 20 * GiB  # charged: a loan of 10 GiB above b's request, held by nobody
    ENTRY.pack_into(led.map, off, *fields)
    led.close()
    a.alloc(11 * GiB - CTX)  # 3 GiB on loan: b really holds 1.5 GiB, within its 10 GiB request
    assert a(f"alloc {1 * GiB}")["rc"] == 2  # b's request (and what it really holds) stays kept back
