"""Read a workload's shared region (usage per device), e.g. for the node agent's metrics.

Layout version 1, written by native/isolation/region.c (see the comment there and
docs/isolation.md). Reading takes no lock: each 8-byte counter is read whole, and the totals are
kept consistent by the writers. Processes that died since the last writer's sweep still count
until a process of the workload touches the region again.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"TSRGN\x00\x00\x01"
_HEADER = struct.Struct("=8s8I")
DEVICES_OFFSET = 128
_DEVICE = struct.Struct("=64sQQ")
SLOTS_OFFSET = 4096
_SLOT_HEAD = struct.Struct("=iI")


@dataclass(frozen=True)
class DeviceUsage:
    key: str          # device UUID (or "index-<i>" when the UUID was unknown)
    limit_bytes: int
    used_bytes: int
    processes: dict[int, int]  # pid (in the workload's namespace) -> bytes it holds


class RegionFormatError(ValueError):
    """The file is not a version-1 tessera shared region."""


def read_region(path: Path) -> dict[str, DeviceUsage]:
    """Usage per device key; an empty (never used) region gives an empty dict."""
    data = Path(path).read_bytes()
    if len(data) == 0 or data[:8] == b"\x00" * 8:
        return {}
    if len(data) < SLOTS_OFFSET:
        raise RegionFormatError(f"{path}: too short for a shared region ({len(data)} bytes)")
    (magic, version, slots_offset, max_devices, max_slots, slot_size, n_devices, slot_hwm,
     _mutex_size) = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != 1 or slots_offset != SLOTS_OFFSET:
        raise RegionFormatError(f"{path}: not a version-1 tessera shared region")
    if len(data) < slots_offset + max_slots * slot_size:
        raise RegionFormatError(f"{path}: truncated shared region")
    devices: list[tuple[str, int, int]] = []
    for i in range(min(n_devices, max_devices)):
        raw_key, limit, used = _DEVICE.unpack_from(data, DEVICES_OFFSET + i * _DEVICE.size)
        devices.append((raw_key.split(b"\x00", 1)[0].decode(errors="replace"), limit, used))
    per_device: list[dict[int, int]] = [{} for _ in devices]
    for s in range(min(slot_hwm, max_slots)):
        base = slots_offset + s * slot_size
        pid, in_use = _SLOT_HEAD.unpack_from(data, base)
        if not in_use:
            continue
        used = struct.unpack_from(f"={max_devices}Q", data, base + _SLOT_HEAD.size)
        for d in range(len(devices)):
            if used[d]:
                per_device[d][pid] = per_device[d].get(pid, 0) + used[d]
    return {
        key: DeviceUsage(key=key, limit_bytes=limit, used_bytes=used, processes=per_device[i])
        for i, (key, limit, used) in enumerate(devices)
    }
