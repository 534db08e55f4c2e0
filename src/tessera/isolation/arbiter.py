"""The per-GPU compute arbiter file (issue 30; docs/compute-share.md).

tessera-node and the embedded runner create one file per shared GPU and mount it into every
workload on that GPU; ``libtessera-cuda.so`` (native/isolation/arbiter.c) maps it and gates kernel
launches by lease. This module owns the node's side: creating the file, writing each workload's
request, limit and class into its entry, and reading the GPU time the arbiter charged each
workload (the per-workload GPU-time metric). The layout is native/isolation/compute.h: keep both
in step (tests/isolation/test_compute_share.py checks the library reads what this writes).
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x5455504D4F435354
VERSION = 1
HEADER = 256
BUCKETS = 128
BUCKET_NS = 100_000_000
SLOT_SIZE = 256 + 16 * BUCKETS
SLOTS = 64
MODES = {"off": 0, "fair": 1, "strict": 2}
MODE_NAMES = {v: k for k, v in MODES.items()}
STATUS_MULTI_GPU = 1
STATUS_FALLBACK = 2

_HEAD = struct.Struct("<QIIIIIIII")  # magic .. drain_us (40 bytes), then header_crc
_SLOT_CFG = struct.Struct("<64sIIII")  # key, request, limit, class, weight (80 bytes), then cfg_crc
_SLOT_RUN = struct.Struct("<Iqqqqqqq")  # status .. launches, at offset 84


class ArbiterError(Exception):
    """The arbiter file is missing, corrupt or full."""


@dataclass(frozen=True)
class Share:
    key: str
    request: float
    limit: float
    latency: bool = False


@dataclass(frozen=True)
class Usage:
    """What the arbiter charged one workload: GPU seconds over the last 1 s and 10 s, in total."""

    key: str
    request: float
    limit: float
    status: int
    share_1s: float
    share_10s: float
    total_seconds: float
    leases: int
    wait_seconds: float

    @property
    def multi_gpu(self) -> bool:
        return bool(self.status & STATUS_MULTI_GPU)


def _ppm(x: float) -> int:
    return round(x * 1_000_000)


def create(path: Path, *, mode: str = "fair", quantum_ms: float = 20.0, grace_ms: float = 5.0,
           drain_ms: float = 2.0) -> None:
    """Creates (or re-creates, keeping nothing) the arbiter file of one GPU."""
    if mode not in MODES:
        raise ArbiterError(f"compute mode {mode!r}: must be one of off, fair, strict")
    if not 5 <= quantum_ms <= 250:
        raise ArbiterError(f"compute quantum {quantum_ms} ms: must be within 5-250 ms")
    head = _HEAD.pack(MAGIC, VERSION, HEADER, SLOT_SIZE, SLOTS, int(quantum_ms * 1000), MODES[mode],
                      int(grace_ms * 1000), int(drain_ms * 1000))
    head += struct.pack("<I", zlib.crc32(head))
    data = head.ljust(HEADER, b"\0") + b"\0" * (SLOT_SIZE * SLOTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o666)
    os.replace(tmp, path)


class _locked:
    """The arbiter's byte-0 lock (the library's OFD lock conflicts with it), around a write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        self.fd = os.open(self.path, os.O_RDWR)
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        os.close(self.fd)


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise ArbiterError(f"arbiter {path} does not exist") from e
    if len(data) < HEADER + SLOT_SIZE * SLOTS or struct.unpack_from("<Q", data, 0)[0] != MAGIC:
        raise ArbiterError(f"arbiter {path} is corrupt")
    return data


def _stale_slot(data: bytes, idle_ns: int = 60_000_000_000) -> int | None:
    """The entry of a workload that has not wanted GPU time for a minute (gone), to reuse."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    best = None
    for i in range(SLOTS):
        demand = struct.unpack_from("<q", data, HEADER + i * SLOT_SIZE + 88)[0]
        if now - demand > idle_ns and (best is None or demand < best[1]):
            best = (i, demand)
    return None if best is None else best[0]


def set_share(path: Path, share: Share) -> None:
    """Writes (or rewrites) a workload's entry: request, limit, latency class."""
    if not 0 <= share.request <= share.limit <= 1:
        raise ArbiterError(f"compute share of {share.key}: need 0 <= request <= limit <= 1")
    key = share.key.encode()
    if not key or len(key) > 63:
        raise ArbiterError(f"workload key {share.key!r}: 1-63 bytes")
    with _locked(path) as fd:
        data = os.pread(fd, HEADER + SLOT_SIZE * SLOTS, 0)
        free = None
        target = None
        for i in range(SLOTS):
            off = HEADER + i * SLOT_SIZE
            k = data[off:off + 64].rstrip(b"\0")
            if k == key:
                target = i
                break
            if not k and free is None:
                free = i
        if target is None and free is None:
            free = _stale_slot(data)
        if target is None:
            if free is None:
                raise ArbiterError(f"arbiter {path} is full ({SLOTS} workloads wanting GPU time in the last minute)")
            target = free
            os.pwrite(fd, b"\0" * SLOT_SIZE, HEADER + target * SLOT_SIZE)
        cfg = _SLOT_CFG.pack(key.ljust(64, b"\0"), _ppm(share.request), _ppm(share.limit),
                             1 if share.latency else 0, 0)
        os.pwrite(fd, cfg + struct.pack("<I", zlib.crc32(cfg)), HEADER + target * SLOT_SIZE)


def remove_share(path: Path, key: str) -> None:
    with _locked(path) as fd:
        data = os.pread(fd, HEADER + SLOT_SIZE * SLOTS, 0)
        for i in range(SLOTS):
            off = HEADER + i * SLOT_SIZE
            if data[off:off + 64].rstrip(b"\0") == key.encode():
                os.pwrite(fd, b"\0" * SLOT_SIZE, off)


def usage(path: Path, now_ns: int | None = None) -> list[Usage]:
    """The charged GPU time of every workload on this GPU (1 s and 10 s windows, total)."""
    data = _read(path)
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now_ns is None else now_ns
    cur = now // BUCKET_NS
    out = []
    for i in range(SLOTS):
        off = HEADER + i * SLOT_SIZE
        key_b, req, lim, _klass, _w = _SLOT_CFG.unpack_from(data, off)
        key = key_b.rstrip(b"\0").decode(errors="replace")
        if not key:
            continue
        status, _demand, _credit, _lcredit, total, leases, wait, _launches = _SLOT_RUN.unpack_from(data, off + 84)
        w1 = w10 = 0
        for b in range(BUCKETS):
            idx, ns = struct.unpack_from("<qq", data, off + 256 + 16 * b)
            # The bucket in progress counts in part: whole buckets before it cover the rest.
            if cur - 10 < idx <= cur:
                w1 += ns
            if cur - 100 < idx <= cur:
                w10 += ns
        out.append(Usage(key, req / 1e6, lim / 1e6, status, w1 / 1e9, w10 / 10e9, total / 1e9, leases, wait / 1e9))
    return out


def mode_of(path: Path) -> str:
    data = _read(path)
    return MODE_NAMES.get(struct.unpack_from("<I", data, 28)[0], "off")


def write_config(path: Path, arbiters: list[Path], key: str) -> None:
    """The file the library reads in the workload (gpu-compute.conf): its arbiters and its key."""
    lines = ["# written by tessera: compute share (docs/compute-share.md)"]
    lines += [f"arbiter {a}" for a in arbiters]
    lines.append(f"workload {key}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
