"""The loans ledger of one physical GPU, as the reclaimer sees it (``native/isolation/loans.c``).

One file per GPU UUID (``DIR/GPU-....ledger``), written by ``libtessera-cuda.so`` in every
process of every workload on that GPU: per process, the workload ("share") it belongs to, the
share's request, limit and priority, what the process holds, and the memory it is waiting for
(a demand, set only for an allocation within the share's request).

Every tenant on the GPU can write every byte of this file, so nothing here is trusted alone
(issue #28 class 4): the reclaimer keeps what it decided to kill in its own :class:`Journal` (a
file no share container mounts), reads the ledger without any lock (a tenant could hold one),
and under tessera-node checks each entry against the agent's :class:`Authority`.

Locking is the library's: each live process holds an open-file-description lock on the first
byte of its entry (a free lock = a dead process). No lock guards the file as a whole any more;
byte 64 (the old ledger lock) is still honoured by :meth:`Ledger.lock` for old readers, and
decides nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera.node.usage import NodeUsage

MAGIC = b"TSLOAN\x00\x01"
VERSION = 1
HEADER = struct.Struct("=8sIIIIQQQ")
ENTRY = struct.Struct("=iIiIQQQQQQ64sQQ")
LOCK_BYTE = 64
ENTRIES_OFFSET = 4096
ENTRY_SIZE = 256
ENTRIES = 256
SIZE = ENTRIES_OFFSET + ENTRIES * ENTRY_SIZE
SUFFIX = ".ledger"

assert HEADER.size == 48 and ENTRY.size == 144


class LedgerError(RuntimeError):
    """The file is not a version-1 loans ledger."""


@dataclass(frozen=True)
class Entry:
    index: int
    pid: int
    """The process's pid in its own PID namespace (the container's)."""
    priority: int
    wait_ms: int
    request: int
    limit: int
    charged: int
    demand: int
    demand_since_ns: int
    start_ns: int
    share: str
    demands: int
    refused: int
    alive: bool

    @property
    def offset(self) -> int:
        return ENTRIES_OFFSET + self.index * ENTRY_SIZE


@dataclass(frozen=True)
class ShareLoan:
    share: str
    request: int
    limit: int
    charged: int
    priority: int

    @property
    def loaned(self) -> int:
        return max(0, self.charged - self.request)


@dataclass(frozen=True)
class Picture:
    uuid: str
    capacity: int
    physical: int
    headroom: int
    entries: tuple[Entry, ...]
    """Live entries only."""

    @property
    def used(self) -> int:
        return sum(e.charged for e in self.entries)

    def shares(self) -> dict[str, ShareLoan]:
        out: dict[str, ShareLoan] = {}
        for e in self.entries:
            s = out.get(e.share)
            charged = e.charged + (s.charged if s else 0)
            out[e.share] = ShareLoan(e.share, e.request, e.limit, charged, e.priority)
        return out


def _flock(fd: int, cmd: int, kind: int, start: int) -> bytes:
    return fcntl.fcntl(fd, cmd, struct.pack("hhqqi", kind, os.SEEK_SET, start, 1, 0) + b"\0" * 4)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


class Ledger:
    """An open ledger file. ``lock()`` for a consistent picture and to write records."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.uuid = self.path.name[: -len(SUFFIX)] if self.path.name.endswith(SUFFIX) else self.path.name
        self.fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(self.fd).st_size < SIZE:
                raise LedgerError(f"{self.path}: shorter than a loans ledger ({SIZE} bytes)")
            self.map = mmap.mmap(self.fd, SIZE)
        except BaseException:
            os.close(self.fd)
            raise
        st = os.fstat(self.fd)
        self.inode = st.st_ino
        self.device = st.st_dev

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)

    @contextlib.contextmanager
    def lock(self, timeout: float = 5.0) -> Iterator[None]:
        """Byte 64, the old ledger lock (decides nothing now); the wait is bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _flock(self.fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, LOCK_BYTE)
                break
            except (BlockingIOError, PermissionError, InterruptedError) as exc:
                if time.monotonic() >= deadline:
                    raise LedgerError(f"{self.path}: locked by another process for {timeout} s") from exc
                time.sleep(0.001)
        try:
            yield
        finally:
            _flock(self.fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, LOCK_BYTE)

    def _alive(self, offset: int) -> bool:
        try:
            out = _flock(self.fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, offset)
        except OSError:
            return True  # cannot tell: never treat as dead on doubt
        kind: int = struct.unpack_from("h", out)[0]
        return kind != fcntl.F_UNLCK

    def read(self) -> Picture:
        """The picture, read as the file is (no lock: a tenant could hold it; every field is
        written by its own process, so a torn read only mixes values that process wrote)."""
        magic, version, entry_size, max_entries, hwm, capacity, physical, headroom = \
            HEADER.unpack_from(self.map, 0)
        if magic != MAGIC:
            raise LedgerError(f"{self.path}: not a tessera loans ledger")
        if version != VERSION or entry_size != ENTRY_SIZE or max_entries != ENTRIES:
            raise LedgerError(f"{self.path}: incompatible layout (version {version})")
        entries: list[Entry] = []
        for i in range(min(hwm, ENTRIES)):
            off = ENTRIES_OFFSET + i * ENTRY_SIZE
            f = ENTRY.unpack_from(self.map, off)
            if not f[1]:
                continue
            if not self._alive(off):
                continue
            entries.append(Entry(index=i, pid=f[0], priority=f[2], wait_ms=f[3], request=f[4],
                                 limit=f[5], charged=f[6], demand=f[7], demand_since_ns=f[8],
                                 start_ns=f[9], share=_text(f[10]), demands=f[11], refused=f[12],
                                 alive=True))
        return Picture(uuid=self.uuid, capacity=capacity, physical=physical, headroom=headroom,
                       entries=tuple(entries))


def open_ledgers(directory: Path) -> dict[str, Ledger]:
    """Every ledger in ``directory`` by GPU UUID (files being created, or foreign, are skipped)."""
    out: dict[str, Ledger] = {}
    if not directory.is_dir():
        return out
    for p in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            led = Ledger(p)
        except (OSError, LedgerError, ValueError):
            continue
        out[led.uuid] = led
    return out


def owner_pid(ledger: Ledger, entry: Entry, proc: Path = Path("/proc")) -> int | None:
    """The host pid of the process that holds ``entry`` (its entry lock), found through
    ``/proc/PID/fdinfo``: the process has the ledger open and its open file description holds the
    lock on the entry's first byte. Works across PID namespaces (pods) and is immune to PID reuse.
    """
    want = f"{ledger.inode}"
    start = str(entry.offset)

    def holds(pid: int) -> bool:
        try:
            fds = os.listdir(proc / str(pid) / "fdinfo")
        except OSError:
            return False
        for fd in fds:
            try:
                text = (proc / str(pid) / "fdinfo" / fd).read_text()
            except OSError:
                continue
            if f"ino:\t{want}\n" not in text:
                continue
            for line in text.splitlines():
                if line.startswith("lock:") and line.endswith(f":{want} {start} {start}"):
                    return True
        return False

    if holds(entry.pid):  # same PID namespace (embedded mode, hostPID agents for host processes)
        return entry.pid
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if pid == entry.pid:
            continue
        try:
            status = (proc / str(pid) / "status").read_text()
        except OSError:
            continue
        ns = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        if ns and int(ns[-1]) == entry.pid and holds(pid):
            return pid
    return None


# ---- what the reclaimer trusts --------------------------------------------------------------------

@dataclass(frozen=True)
class JournalRecord:
    """A reclaim decided by the reclaimer: written before the kill, cleared once the victim is gone."""

    uuid: str
    victim_pid: int
    """Host pid (as the reclaimer sees it)."""
    victim_entry: int
    victim_start_ns: int
    victim_share: str
    owner_share: str
    bytes: int
    since_ns: int


def journal_path(directory: Path) -> Path:
    """The journal of the reclaimer of ``directory``: beside it, never inside (share containers
    mount the ledger directory, not its parent)."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}.reclaims.json"


class Journal:
    """Pending reclaims, in a file only the reclaimer writes (mode 0600, replaced atomically), so
    a reclaimer killed at any instant resumes with the same victims, and no tenant can write a
    record that gets a process killed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._records: list[JournalRecord] = []
        try:
            raw = json.loads(self.path.read_text())
            self._records = [JournalRecord(**r) for r in raw.get("records", [])]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            raise LedgerError(f"{self.path}: not a reclaim journal ({exc})") from exc

    def pending(self, uuid: str) -> list[JournalRecord]:
        return [r for r in self._records if r.uuid == uuid]

    def add(self, record: JournalRecord) -> None:
        self._records.append(record)
        self._save()

    def clear(self, record: JournalRecord) -> None:
        self._records = [r for r in self._records if r != record]
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps({"records": [asdict(r) for r in self._records]}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class Terms:
    """What the agent gave a share on one GPU, and what the share's own region says it holds."""

    request: int
    limit: int
    charged: int


@dataclass(frozen=True)
class Authority:
    """The agent's own picture (tessera.node.usage): which share each GPU process is in (by its
    cgroup and its region slot, never by what it wrote), each share's terms per GPU, and its
    priority."""

    share_of_pid: dict[int, str]
    terms: dict[tuple[str, str], Terms]
    """(share key, GPU UUID) -> terms."""
    priority: dict[str, int]

    @classmethod
    def from_usage(cls, usage: NodeUsage) -> Authority | None:
        """None when the agent knows no share (nothing to check entries against)."""
        from tessera.core.workloads import PRIORITY_CLASSES

        if not usage.shares:
            return None
        default = PRIORITY_CLASSES["train"].value
        priority: dict[str, int] = {}
        terms: dict[tuple[str, str], Terms] = {}
        for s in usage.shares:
            pc = PRIORITY_CLASSES.get(s.share.priority_class)
            priority[s.share.key] = pc.value if pc else default
            terms[(s.share.key, s.gpu_uuid)] = Terms(s.request_bytes, s.limit_bytes, s.charged_bytes)
        share_of_pid = {p.pid: p.share_key for p in usage.processes if p.share_key}
        return cls(share_of_pid=share_of_pid, terms=terms, priority=priority)
