"""The loans ledger of one physical GPU, as the reclaimer sees it (``native/isolation/loans.c``).

One file per GPU UUID (``DIR/GPU-....ledger``), written by ``libtessera-cuda.so`` in every
process of every workload on that GPU: per process, the workload ("share") it belongs to, the
share's request, limit and priority, what the process holds, and the memory it is waiting for
(a demand, set only for an allocation within the share's request). The reclaimer writes only the
reclaim records (what it decided to kill and why), before it kills, so a reclaimer restarted at
any instant never picks a second victim for memory already being freed.

Locking is the library's: an open-file-description lock on byte 64 guards the file; each live
process holds one on the first byte of its entry (a free lock = a dead process). Reading here
takes the same lock, so a picture is consistent.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"TSLOAN\x00\x01"
VERSION = 1
HEADER = struct.Struct("=8sIIIIQQQ")
ENTRY = struct.Struct("=iIiIQQQQQQ64sQQ")
RECORD = struct.Struct("=iIIIQQQ64s64s")
LOCK_BYTE = 64
RECORDS_OFFSET = 128
RECORDS = 16
ENTRIES_OFFSET = 4096
ENTRY_SIZE = 256
ENTRIES = 256
SIZE = ENTRIES_OFFSET + ENTRIES * ENTRY_SIZE
SUFFIX = ".ledger"

assert HEADER.size == 48 and ENTRY.size == 144 and RECORD.size == 168
assert RECORDS_OFFSET + RECORDS * RECORD.size <= ENTRIES_OFFSET


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
class Record:
    """A reclaim the reclaimer decided: written before the kill, cleared once the victim is gone."""

    slot: int
    victim_pid: int
    """Host pid (as the reclaimer sees it)."""
    victim_entry: int
    owner_entry: int
    bytes: int
    since_ns: int
    victim_start_ns: int
    victim_share: str
    owner_share: str


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
    records: tuple[Record, ...]
    """Pending reclaims."""

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
    def lock(self) -> Iterator[None]:
        while True:
            try:
                _flock(self.fd, fcntl.F_OFD_SETLKW, fcntl.F_WRLCK, LOCK_BYTE)
                break
            except InterruptedError:
                continue
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
        """The picture (call under ``lock()`` for consistency)."""
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
        records: list[Record] = []
        for slot in range(RECORDS):
            f = RECORD.unpack_from(self.map, RECORDS_OFFSET + slot * RECORD.size)
            if f[1] != 1:
                continue
            records.append(Record(slot=slot, victim_pid=f[0], victim_entry=f[2], owner_entry=f[3],
                                  bytes=f[4], since_ns=f[5], victim_start_ns=f[6],
                                  victim_share=_text(f[7]), owner_share=_text(f[8])))
        return Picture(uuid=self.uuid, capacity=capacity, physical=physical, headroom=headroom,
                       entries=tuple(entries), records=tuple(records))

    def write_record(self, victim_pid: int, victim: Entry, owner: Entry, nbytes: int) -> int:
        """Records a reclaim before it is carried out (under ``lock()``); returns its slot."""
        for slot in range(RECORDS):
            off = RECORDS_OFFSET + slot * RECORD.size
            if RECORD.unpack_from(self.map, off)[1] == 1:
                continue
            RECORD.pack_into(self.map, off, victim_pid, 1, victim.index, owner.index, nbytes,
                             time.time_ns(), victim.start_ns, victim.share.encode()[:63],
                             owner.share.encode()[:63])
            self.map.flush()
            return slot
        raise LedgerError(f"{self.path}: more than {RECORDS} reclaims pending")

    def clear_record(self, slot: int) -> None:
        off = RECORDS_OFFSET + slot * RECORD.size
        RECORD.pack_into(self.map, off, 0, 0, 0, 0, 0, 0, 0, b"", b"")


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
