"""The loan reclaimer: takes GPU memory on loan back for a workload that needs its request.

A process of a workload allocating within its request on a GPU that is short because other
workloads hold loans records a demand in that GPU's ledger (:mod:`tessera.node.ledger`) and waits
(``wait-ms``, default 10 s). The reclaimer watches every ledger in its directory and, for each
demand, kills borrowing GPU processes — lowest priority first, then the workload with the largest
loan, then the newest process — until the owner fits. Only processes of workloads above their
request are ever chosen; a workload within its request is never touched. Only the GPU process is
killed, never its pod or workload (a workspace keeps running, as Run:ai does for notebooks).

Restart safety: each kill is written to the reclaimer's own journal (:class:`Journal`, a file
beside the ledger directory that no share container mounts) before it is sent. A reclaimer
started again finds the records: a victim still alive is sent the kill again (the same process,
never a new victim), a victim gone clears its record. Memory being freed by a pending reclaim
counts as free, so the same demand is never reclaimed twice, and decisions are made from the live
ledger only, so nothing is killed for a loan (or a demand) that no longer exists.

Trust (issue #28 class 4): every tenant can write every byte of a ledger. Nothing a tenant writes
decides another tenant's fate: the reclaimer never takes the ledger's lock (a tenant could hold
it) and reads the file as it is; its records live in its own journal (a forged record kills
nobody); and under tessera-node (:class:`Authority`, from the agent's own picture of the node)
an entry counts only when its lock holder is a process the agent places in the share the entry
names, with the request, limit and priority the agent gave that share, and a victim's share must
be above its request by its own accounting region too (which only that share writes), not only
by the ledger.

Used by ``tessera up`` (embedded mode) and by tessera-node (the agent loads
:func:`make_reclaimer` as its plugin).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    SUFFIX,
    Authority,
    Entry,
    Journal,
    JournalRecord,
    Ledger,
    LedgerError,
    ShareLoan,
    journal_path,
    owner_pid,
)

if TYPE_CHECKING:
    from tessera.node.plugins import NodeActions
    from tessera.node.usage import NodeUsage

log = logging.getLogger("tessera.node.reclaim")

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
    journal: Journal | None = None
    """Where decided reclaims are kept (default: beside ``directory``, see :func:`journal_path`)."""
    authority: Authority | None = None
    """The agent's own view of shares and processes; None: the ledger is trusted as written
    (embedded mode: one user, nobody to protect from)."""
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    reclaims: int = 0
    _unresolved: set[tuple[str, int, int]] = field(default_factory=set)
    _stuck: set[tuple[str, int, int]] = field(default_factory=set)
    _scanned: float = 0.0
    _distrusted: set[tuple[str, int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.journal is None:
            self.journal = Journal(journal_path(self.directory))

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

    def _quiet(self, led: Ledger) -> bool:
        """No demand and no pending reclaim (a cheap pre-check)."""
        assert self.journal is not None
        if self.journal.pending(led.uuid):
            return False
        m = led.map
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
                # Never under the ledger's lock: any tenant can hold it. Read as it is.
                done += self._reclaim(led)
            except (OSError, LedgerError, ValueError) as exc:
                log.warning("loans ledger %s: %s", led.path, exc)
        self.reclaims += len(done)
        return done

    def _trusted(self, led: Ledger, entries: tuple[Entry, ...]) -> tuple[list[Entry], dict[int, int]]:
        """The entries the reclaimer may act on, with the host pids of those it may kill (entry
        index -> pid). Without an authority: every live entry, as written. With one: an entry
        whose lock holder the agent places in the share the entry names (a possible victim), or
        one the agent does not list at all (NVML lists a process only once it holds memory: an
        owner waiting for its first allocation) of a share the agent knows (a possible owner,
        never a victim); its request, limit and priority are the ones the agent gave that share
        on this GPU. An entry whose process the agent places in another share is ignored."""
        auth = self.authority
        out: list[Entry] = []
        pids: dict[int, int] = {}
        for e in entries:
            if auth is None:
                out.append(e)
                continue
            pid = self.resolve(led, e)
            terms = auth.terms.get((e.share, led.uuid))
            placed = auth.share_of_pid.get(pid) if pid is not None else None
            if pid is None or terms is None or (placed is not None and placed != e.share):
                key = (led.uuid, e.index, e.start_ns)
                if key not in self._distrusted:
                    self._distrusted.add(key)
                    log.warning("GPU %s: ledger entry %d says share %r (pid %d in its namespace) but the "
                                "agent places its process in %r; ignored", led.uuid, e.index, e.share,
                                e.pid, placed)
                continue
            out.append(dataclasses.replace(e, request=terms.request, limit=terms.limit,
                                           priority=auth.priority.get(e.share, e.priority)))
            if placed is not None:
                pids[e.index] = pid
        return out, pids

    def _borrowing_by_region(self, share: str, uuid: str) -> bool:
        """Above its request by the share's own accounting region (None authority: not asked)."""
        if self.authority is None:
            return True
        terms = self.authority.terms.get((share, uuid))
        return terms is not None and terms.charged > terms.request

    def _reclaim(self, led: Ledger) -> list[Reclaim]:
        assert self.journal is not None
        pic = led.read()
        entries, pids = self._trusted(led, pic.entries)
        live = {e.index: e for e in entries}
        freeing = 0
        pending: set[int] = set()
        for r in self.journal.pending(pic.uuid):
            victim = live.get(r.victim_entry)
            if victim is None or victim.start_ns != r.victim_start_ns:
                self.journal.clear(r)  # the victim is gone: its memory is free
                continue
            # Decided earlier (perhaps by a reclaimer that died before the kill): the same process.
            if self.resolve(led, victim) == r.victim_pid:
                self.kill(r.victim_pid, f"reclaim of GPU memory on loan on {pic.uuid} (resumed)")
            pending.add(victim.index)
            freeing += victim.charged
        shares: dict[str, ShareLoan] = {}
        for e in entries:
            prev = shares.get(e.share)
            shares[e.share] = ShareLoan(e.share, e.request, e.limit,
                                        e.charged + (prev.charged if prev else 0), e.priority)
        charged = {k: v.charged for k, v in shares.items()}
        for e in entries:
            if e.index in pending:
                charged[e.share] -= e.charged
        used = sum(e.charged for e in entries) - freeing
        out: list[Reclaim] = []
        for owner in sorted((e for e in entries if e.demand > 0), key=lambda e: e.demand_since_ns):
            mine = shares[owner.share]
            if charged[owner.share] + owner.demand > mine.request:
                continue  # never reclaim for memory above a request
            need = used + owner.demand - pic.capacity
            while need > 0:
                candidates = [e for e in entries
                              if e.index not in pending and e.share != owner.share and e.charged > 0
                              and (self.authority is None or e.index in pids)
                              and charged[e.share] > shares[e.share].request
                              and self._borrowing_by_region(e.share, pic.uuid)]
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
                pid = pids.get(victim.index) or self.resolve(led, victim)
                if pid is None:
                    key = (pic.uuid, victim.index, victim.start_ns)
                    if key not in self._unresolved:
                        self._unresolved.add(key)
                        log.warning("GPU %s: cannot find the host process of ledger entry %d "
                                    "(pid %d in its namespace, %s); not killed", pic.uuid,
                                    victim.index, victim.pid, victim.share)
                    continue
                loan = charged[victim.share] - shares[victim.share].request
                self.journal.add(JournalRecord(uuid=pic.uuid, victim_pid=pid, victim_entry=victim.index,
                                               victim_start_ns=victim.start_ns,
                                               victim_share=victim.share, owner_share=owner.share,
                                               bytes=victim.charged, since_ns=time.time_ns()))
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
        # The agent's own picture decides what the reclaimer may act on (replaced whole: atomic).
        self.thread.reclaimer.authority = Authority.from_usage(usage)
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
