"""Ground truth from the fake driver's timing model (native/fakedriver/fake_timing.c).

Each simulated GPU is a file FAKE_GPU_SIM_DIR/gpu<i>.sim holding, per context (one per process),
the nanoseconds of kernel work queued and executed. Tests and benchmarks read the executed time
per process to compute exact shares per window. Layout: fake_timing.c's sim_file / sim_ctx.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SIM_MAGIC = 0x314D5354
_CTX_OFFSET = 192
_CTX = struct.Struct("<iiqqqq")


@dataclass(frozen=True)
class SimContext:
    pid: int
    live: bool
    submitted_ns: int
    executed_ns: int
    launches: int


@dataclass(frozen=True)
class SimDevice:
    now_ns: int
    busy_ns: int
    switch_ns: int
    switches: int
    contexts: tuple[SimContext, ...]

    def executed(self) -> dict[int, int]:
        return {c.pid: c.executed_ns for c in self.contexts}


def read(path: Path) -> SimDevice:
    data = path.read_bytes()
    magic, _version, nctx, ctx_size = struct.unpack_from("<IIII", data, 0)
    if magic != SIM_MAGIC:
        raise ValueError(f"{path}: not a fake GPU sim file")
    now, = struct.unpack_from("<q", data, 32)
    busy, switch_total, switches = struct.unpack_from("<qqq", data, 56)
    ctxs = []
    for i in range(nctx):
        pid, state, sub, exe, launches, _dropped = _CTX.unpack_from(data, _CTX_OFFSET + i * ctx_size)
        if pid:
            ctxs.append(SimContext(pid, state == 1, sub, exe, launches))
    return SimDevice(now, busy, switch_total, switches, tuple(ctxs))


def sim_path(sim_dir: Path, gpu: int = 0) -> Path:
    return sim_dir / f"gpu{gpu}.sim"
