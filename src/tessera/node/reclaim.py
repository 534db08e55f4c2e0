"""The loan reclaimer: takes GPU memory on loan back for a workload that needs its request.

A process of a workload allocating within its request on a GPU that is short because other
workloads hold loans records a demand in that GPU's ledger (:mod:`tessera.node.ledger`) and waits
(``wait-ms``, default 10 s). The reclaimer watches every ledger in its directory and, for each
demand, kills borrowing GPU processes — lowest priority first, then the workload with the largest
loan, then the newest process — until the owner fits. Only processes of workloads above their
request are ever chosen; a workload within its request is never touched. Only the GPU process is
killed, never its pod or workload (a workspace keeps running, as Run:ai does for notebooks).

Restart safety: each kill is written to the ledger (a reclaim record) before it is sent. A
reclaimer started again finds the records: a victim still alive is sent the kill again (the same
process, never a new victim), a victim gone clears its record. Memory being freed by a pending
reclaim counts as free, so the same demand is never reclaimed twice, and decisions are made from
the live ledger only, so nothing is killed for a loan (or a demand) that no longer exists.

Used by ``tessera up`` (embedded mode) and by tessera-node (the agent loads
:func:`make_reclaimer` as its plugin).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tessera.core.units import format_bytes
from tessera.node.ledger import (
    ENTRIES,
    ENTRIES_OFFSET,
    ENTRY,
    ENTRY_SIZE,
    RECORD,
    RECORDS,
    RECORDS_OFFSET,
    SUFFIX,
    Entry,
    Ledger,
    LedgerError,
    owner_pid,
)

if TYPE_CHECKING:
    from tessera.node.plugins import NodeActions
    from tessera.node.usage import NodeUsage

log = logging.getLogger("tessera.node.reclaim")

DEFAULT_WAIT_MS = 10_000
FAULT_ENV = "TESSERA_NODE_FAULT"
"""Tests only: ``die-mid-reclaim`` makes the process kill itself (SIGKILL) after a reclaim's
record is written and before its victim is killed."""


@dataclass(frozen=True)
class Reclaim:
    """One borrowing process killed so an owner gets memory within its request."""

    gpu_uuid: str
    victim_share: str
    victim_pid: int
    victim_priority: int
    loan_bytes: int
    """The victim workload's loan on this GPU when it was chosen."""
    process_bytes: int
    """What the killed process held on the GPU (all of it is freed)."""
    owner_share: str
    demand_bytes: int
    killed: bool

    def message(self, owner: str | None = None, victim: str | None = None) -> str:
        return (f"GPU memory loan of {format_bytes(self.loan_bytes)} reclaimed for "
                f"{owner or self.owner_share} on {self.gpu_uuid}: process {self.victim_pid} of "
                f"{victim or self.victim_share} (holding {format_bytes(self.process_bytes)}) "
                f"was killed")


def kill_process(pid: int, why: str) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    log.warning("killed process %d: %s", pid, why)
    return True


@dataclass
class Reclaimer:
    directory: Path
    kill: Callable[[int, str], bool] = kill_process
    resolve: Callable[[Ledger, Entry], int | None] = owner_pid
    interval: float = 0.005
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    reclaims: int = 0
    _unresolved: set[tuple[str, int, int]] = field(default_factory=set)
    _stuck: set[tuple[str, int, int]] = field(default_factory=set)
    _scanned: float = 0.0

    # ---- the ledgers ----------------------------------------------------------------------------
    def scan(self) -> None:
        """Opens ledgers that appeared (a GPU's first workload creates its file)."""
        self._scanned = time.monotonic()
        if not self.directory.is_dir():
            return
        for path in self.directory.glob(f"*{SUFFIX}"):
            uuid = path.name[: -len(SUFFIX)]
            if uuid in self.ledgers:
                continue
            try:
                self.ledgers[uuid] = Ledger(path)
            except (OSError, LedgerError, ValueError):
                continue  # being created: the next scan opens it

    def close(self) -> None:
        for led in self.ledgers.values():
            led.close()
        self.ledgers.clear()

    @staticmethod
    def _quiet(led: Ledger) -> bool:
        """No demand and no pending reclaim (read without the lock; a cheap pre-check)."""
        m = led.map
        for slot in range(RECORDS):
            if RECORD.unpack_from(m, RECORDS_OFFSET + slot * RECORD.size)[1] == 1:
                return False
        hwm = min(int.from_bytes(m[20:24], "little"), ENTRIES)
        for i in range(hwm):
            f = ENTRY.unpack_from(m, ENTRIES_OFFSET + i * ENTRY_SIZE)
            if f[1] and f[7]:
                return False
        return True

    # ---- one pass ------------------------------------------------------------------------------
    def poll(self) -> list[Reclaim]:
        if time.monotonic() - self._scanned > (0.5 if self.ledgers else 0.05):
            self.scan()
        done: list[Reclaim] = []
        for led in list(self.ledgers.values()):
            try:
                if self._quiet(led):
                    continue
                with led.lock():
                    done += self._reclaim(led)
            except (OSError, LedgerError, ValueError) as exc:
                log.warning("loans ledger %s: %s", led.path, exc)
        self.reclaims += len(done)
        return done

    def _reclaim(self, led: Ledger) -> list[Reclaim]:
        pic = led.read()
        live = {e.index: e for e in pic.entries}
        freeing = 0
        pending: set[int] = set()
        for r in pic.records:
            victim = live.get(r.victim_entry)
            if victim is None or victim.start_ns != r.victim_start_ns:
                led.clear_record(r.slot)  # the victim is gone: its memory is free
                continue
            # Decided earlier (perhaps by a reclaimer that died before the kill): the same process.
            if self.resolve(led, victim) == r.victim_pid:
                self.kill(r.victim_pid, f"reclaim of GPU memory on loan on {pic.uuid} (resumed)")
            pending.add(victim.index)
            freeing += victim.charged
        shares = pic.shares()
        charged = {s: v.charged for s, v in shares.items()}
        for e in pic.entries:
            if e.index in pending:
                charged[e.share] -= e.charged
        used = pic.used - freeing
        out: list[Reclaim] = []
        for owner in sorted((e for e in pic.entries if e.demand > 0), key=lambda e: e.demand_since_ns):
            mine = shares[owner.share]
            if charged[owner.share] + owner.demand > mine.request:
                continue  # never reclaim for memory above a request
            need = used + owner.demand - pic.capacity
            while need > 0:
                candidates = [e for e in pic.entries
                              if e.index not in pending and e.share != owner.share and e.charged > 0
                              and charged[e.share] > shares[e.share].request]
                if not candidates:
                    key = (pic.uuid, owner.index, owner.demand_since_ns)
                    if key not in self._stuck:
                        self._stuck.add(key)
                        log.warning("GPU %s: %s waits for %s within its request but no workload "
                                    "holds a loan to take back", pic.uuid, owner.share,
                                    format_bytes(owner.demand))
                    break
                victim = min(candidates, key=lambda e: (
                    e.priority, -(charged[e.share] - shares[e.share].request), -e.start_ns))
                pending.add(victim.index)
                pid = self.resolve(led, victim)
                if pid is None:
                    key = (pic.uuid, victim.index, victim.start_ns)
                    if key not in self._unresolved:
                        self._unresolved.add(key)
                        log.warning("GPU %s: cannot find the host process of ledger entry %d "
                                    "(pid %d in its namespace, %s); not killed", pic.uuid,
                                    victim.index, victim.pid, victim.share)
                    continue
                loan = charged[victim.share] - shares[victim.share].request
                led.write_record(pid, victim, owner, victim.charged)
                if os.environ.get(FAULT_ENV) == "die-mid-reclaim":  # tests: kill -9 right here
                    os.kill(os.getpid(), signal.SIGKILL)
                reclaim = Reclaim(gpu_uuid=pic.uuid, victim_share=victim.share, victim_pid=pid,
                                  victim_priority=victim.priority, loan_bytes=loan,
                                  process_bytes=victim.charged, owner_share=owner.share,
                                  demand_bytes=owner.demand, killed=False)
                killed = self.kill(pid, reclaim.message())
                out.append(Reclaim(**{**reclaim.__dict__, "killed": killed}))
                charged[victim.share] -= victim.charged
                used -= victim.charged
                need -= victim.charged
            used += owner.demand
            charged[owner.share] += owner.demand
        return out

    # ---- in a thread ---------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_reclaim: Callable[[Reclaim], None]) -> None:
        while not stop.is_set():
            try:
                for r in self.poll():
                    with contextlib.suppress(Exception):
                        on_reclaim(r)
            except Exception:
                log.exception("reclaimer pass failed")
            stop.wait(self.interval)
        self.close()


class ReclaimerThread:
    """A :class:`Reclaimer` polling in a daemon thread; reclaims go to ``on_reclaim``."""

    def __init__(self, directory: Path, on_reclaim: Callable[[Reclaim], None],
                 reclaimer: Reclaimer | None = None) -> None:
        self.reclaimer = reclaimer or Reclaimer(directory)
        self.on_reclaim = on_reclaim
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.reclaimer.run, args=(self._stop, on_reclaim),
                                        name="tessera-reclaimer", daemon=True)

    def start(self) -> ReclaimerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def prepare_directory(directory: Path) -> Path:
    """The ledger directory: every workload's processes create and write their GPU's file."""
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(directory, 0o1777)
    return directory


class AgentReclaimer:
    """tessera-node's plugin (:mod:`tessera.node.plugins`): the reclaimer runs in its own thread
    (a reclaim must not wait for the agent's sync interval); each sync posts the Events and
    counts the reclaims done since the last one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._done: list[Reclaim] = []
        self._lock = threading.Lock()
        self.thread: ReclaimerThread | None = None

    def _record(self, r: Reclaim) -> None:
        with self._lock:
            self._done.append(r)

    def sync(self, usage: NodeUsage, actions: NodeActions) -> None:
        if self.thread is None:
            try:
                prepare_directory(self.directory)
            except OSError as exc:
                log.warning("loans directory %s: %s; loans are not reclaimed", self.directory, exc)
            self.thread = ReclaimerThread(self.directory, self._record).start()
        with self._lock:
            done, self._done = self._done, []
        by_key = {v.share.key: v.share for v in usage.shares}
        for r in done:
            victim = by_key.get(r.victim_share)
            owner = by_key.get(r.owner_share)
            msg = r.message(owner=f"{owner.namespace}/{owner.pod}" if owner else None,
                            victim=f"{victim.namespace}/{victim.pod}" if victim else None)
            actions.event(victim, "GPUMemoryLoanReclaimed", msg)
            if owner is not None:
                actions.event(owner, "GPUMemoryLoanReturned", msg, warning=False)
            if victim is not None:
                actions.counters.add_loan_reclaimed((victim.namespace, victim.pod, "",
                                                     victim.workload, victim.project, r.gpu_uuid))


def make_reclaimer(options: dict[str, str]) -> AgentReclaimer:
    """The agent's plugin factory (``tessera.node.agent.load_plugin``)."""
    return AgentReclaimer(Path(options.get("loans-dir", "/var/lib/tessera/loans")))
