"""Driver-native GPU memory limits per cgroup (NVML, driver branch r615 and later).

From r615 NVML can hold every process of a cgroup to a hard device-memory limit
(``nvmlDeviceSetMemoryLimits_v1``: the cgroup's sysfs path, a soft and a hard limit in bytes;
``nvmlDeviceGetMemoryLimits_v1`` reads them back with what the cgroup uses now). The driver then
refuses an allocation that would take the cgroup past the hard limit, whatever the process
does with its environment or its loader: a cap the preload library cannot give. It counts what
NVML counts for a process (allocations and its CUDA context), which is what the isolation library
charges, so a share gets the same room on both paths.

tessera-node uses it for the hard cap where the driver has it (:func:`supported`) and keeps the
preload library for charging, visibility (``cuMemGetInfo``), loans and drivers before r615. Where
a node enforces by which path is docs/isolation.md's "Driver-native limits". Setting needs root
(the agent is root; no capability beyond the chart's is asked for). MIG devices are not covered
by the API (a MIG share's partition is its cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIN_BRANCH = 615
UNLIMITED: int = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


class MemLimitError(RuntimeError):
    """NVML refused a limit; the message names the GPU, the cgroup and NVML's reason."""


@dataclass(frozen=True)
class CgroupLimit:
    soft: int
    hard: int
    used: int

    @property
    def limited(self) -> bool:
        return self.hard != UNLIMITED


def supported(handle: Any) -> bool:
    """Whether this GPU's driver has per-cgroup limits (r615+; not MIG devices)."""
    try:
        read(handle, CGROUP_ROOT)
    except pynvml.NVMLError_FunctionNotFound:
        return False
    except pynvml.NVMLError_NotSupported:
        return False
    except MemLimitError:
        return False
    return True


def set_hard(handle: Any, cgroup: Path, hard: int, soft: int | None = None) -> None:
    """Holds ``cgroup`` and everything below it to ``hard`` bytes on this GPU."""
    limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
    path = str(cgroup).encode()
    limits.nameSpace = path
    limits.softLimit = hard if soft is None else soft
    limits.hardLimit = hard
    try:
        pynvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)
    except pynvml.NVMLError as exc:
        raise MemLimitError(f"nvmlDeviceSetMemoryLimits_v1({cgroup}, hard={hard}): {exc}") from exc


def clear(handle: Any, cgroup: Path) -> None:
    """Removes the limit (soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX, as NVML says to)."""
    set_hard(handle, cgroup, UNLIMITED, soft=0)


def read(handle: Any, cgroup: Path) -> CgroupLimit:
    limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
    path = str(cgroup).encode()
    limits.nameSpace = path
    try:
        pynvml.nvmlDeviceGetMemoryLimits_v1(handle, limits)
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported):
        raise
    except pynvml.NVMLError as exc:
        raise MemLimitError(f"nvmlDeviceGetMemoryLimits_v1({cgroup}): {exc}") from exc
    return CgroupLimit(int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed))


def pod_cgroups(pod_uid: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The pod's cgroup directories the kubelet made (cgroupfs driver: ``.../pod<uid>``; systemd
    driver: ``...-pod<uid_with_underscores>.slice``), in the memory hierarchy on cgroup v1 and
    the unified one on v2. Empty when the pod has none on this node."""
    plain, slice_ = f"pod{pod_uid}", f"-pod{pod_uid.replace('-', '_')}.slice"
    bases = [root / "memory"] if (root / "memory").is_dir() else [root]
    found: set[Path] = set()
    for base in bases:
        for top in ("kubepods", "kubepods.slice"):
            start = base / top
            if start.is_dir():
                for depth in ("*", "*/*"):
                    found.update(p for p in start.glob(depth)
                                 if p.name == plain or p.name.endswith(slice_))
    return sorted(found)
