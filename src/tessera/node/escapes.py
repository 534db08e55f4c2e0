"""Escape detection: GPU memory a share's processes use beyond what the library charged them.

A process on a GPU that hosts shares is an escape when it belongs to no share (something started
outside tessera's isolation: a privileged container, a process in another pod with the device
mounted by hand), when a share's own process is not in its region (the library did not load in
it: ``no-preload``), when NVML shows it using more than its charge by more than the
tolerance (5%: memory allocated through a path the library does not see), or when NVML shows a
share's processes together using more of a GPU than the share's limit (``over-limit``): the
agent's own figures only (NVML and the share it configured), nothing a tenant can write, so a
program that rewrites its region file (docs/isolation.md, class 7) is caught whatever the region
says. A process is reported
only when two consecutive checks agree, so the instant between an allocation and its charge is
never mistaken for an escape.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.node.usage import NodeUsage

ON_ESCAPE = ("warn", "kill")
NO_SHARE = "no-share"
OVER_CHARGE = "over-charge"
OVER_LIMIT = "over-limit"
NO_PRELOAD = "no-preload"
"""A process of a share's pod that the share's region does not know: the isolation library did
not load in it (an image whose C library it cannot load, or LD_PRELOAD taken away)."""


@dataclass(frozen=True)
class Escape:
    pid: int
    gpu_uuid: str
    kind: str
    nvml_bytes: int
    charged_bytes: int
    share_key: str | None

    def message(self, who: str) -> str:
        if self.kind == NO_SHARE:
            return (f"process {self.pid} uses {self.nvml_bytes} bytes of shared GPU "
                    f"{self.gpu_uuid} and belongs to no share (not isolated)")
        if self.kind == NO_PRELOAD:
            return (f"process {self.pid} of {who} uses {self.nvml_bytes} bytes of GPU "
                    f"{self.gpu_uuid} without the isolation library (it did not load in that "
                    "process: an image whose C library it cannot load, e.g. too old a glibc or "
                    "musl, or LD_PRELOAD removed); its memory is not capped")
        if self.kind == OVER_LIMIT:
            return (f"process {self.pid} of {who} uses {self.nvml_bytes} bytes of GPU {self.gpu_uuid}, "
                    f"and the share's processes together more than its limit of {self.charged_bytes} "
                    "bytes, whatever its accounting region says (memory allocated outside the library, "
                    "or the region file written by the workload)")
        return (f"process {self.pid} of {who} uses {self.nvml_bytes} bytes of GPU "
                f"{self.gpu_uuid}, more than the {self.charged_bytes} bytes the isolation library "
                "charged it (memory allocated outside the library)")


def check_on_escape(value: str) -> str:
    if value not in ON_ESCAPE:
        raise ValueError(f"--on-escape: must be warn or kill (got {value!r})")
    return value


def candidates(usage: NodeUsage, tolerance: float = 0.05) -> list[Escape]:
    shared = usage.shared_gpus()
    out: list[Escape] = []
    for p in usage.processes:
        if p.gpu_uuid not in shared or p.nvml_bytes <= 0:
            continue
        if p.share_key is None:
            out.append(Escape(p.pid, p.gpu_uuid, NO_SHARE, p.nvml_bytes, 0, None))
        elif not p.in_region:
            out.append(Escape(p.pid, p.gpu_uuid, NO_PRELOAD, p.nvml_bytes, 0, p.share_key))
        elif p.nvml_bytes > p.charged_bytes * (1 + tolerance):
            out.append(Escape(p.pid, p.gpu_uuid, OVER_CHARGE, p.nvml_bytes, p.charged_bytes,
                              p.share_key))
    flagged = {(e.pid, e.gpu_uuid) for e in out}
    for view in usage.shares:
        if view.limit_bytes <= 0 or view.nvml_bytes <= view.limit_bytes * (1 + tolerance):
            continue
        for p in usage.processes:
            if (p.share_key == view.share.key and p.gpu_uuid == view.gpu_uuid and p.nvml_bytes > 0
                    and (p.pid, p.gpu_uuid) not in flagged):
                out.append(Escape(p.pid, p.gpu_uuid, OVER_LIMIT, p.nvml_bytes, view.limit_bytes,
                                  p.share_key))
    return out


class EscapeDetector:
    """Keeps the previous check's candidates; an escape is reported once, when seen twice."""

    def __init__(self, tolerance: float = 0.05) -> None:
        self.tolerance = tolerance
        self._previous: set[tuple[int, str, str]] = set()
        self._reported: set[tuple[int, str, str]] = set()
        self.current: list[Escape] = []

    def check(self, usage: NodeUsage) -> list[Escape]:
        """Returns the escapes seen now for the first time (confirmed by two checks)."""
        found = candidates(usage, self.tolerance)
        keys = {(e.pid, e.gpu_uuid, e.kind) for e in found}
        confirmed = [e for e in found if (e.pid, e.gpu_uuid, e.kind) in self._previous]
        self.current = confirmed
        new = [e for e in confirmed if (e.pid, e.gpu_uuid, e.kind) not in self._reported]
        self._reported = {k for k in self._reported if k in keys} | {
            (e.pid, e.gpu_uuid, e.kind) for e in new}
        self._previous = keys
        return new
