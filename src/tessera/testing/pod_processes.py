"""The pod processes an embedded server left on this machine, found from /proc rather than from
the server's own records, so a test can tell tracked pods from untracked ones (a start the server
was killed in) and duplicates (a pod started twice)."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from tessera.node import procfs


@dataclass(frozen=True)
class PodProcess:
    pid: int
    """The pod's process group leader (the runner's shell)."""
    workload_id: str
    index: int
    env: dict[str, str]


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    fields = procfs.stat_fields(pid)
    if fields is None or fields[0] == "Z" or int(fields[2]) != pid:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def pod_processes(data_dir: Path) -> list[PodProcess]:
    """Live pod process groups started by the server whose data directory is ``data_dir``."""
    exits = f"{Path(data_dir).resolve()}/"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        if not env or not env.get("TESSERA_EXIT_FILE", "").startswith(exits):
            continue
        with contextlib.suppress(KeyError, ValueError):
            found.append(PodProcess(int(entry.name), env["TESSERA_WORKLOAD_ID"],
                                    int(env["TESSERA_POD_INDEX"]), env))
    return found


def kill_all(data_dir: Path) -> int:
    """SIGKILL every pod process group of ``data_dir``'s server (cleanup after a crash test)."""
    procs = pod_processes(data_dir)
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    return len(procs)
