"""Is ``tessera.db`` the store a previous server left, before the server opens it?

SQLite takes a 0-byte file for an empty database and a missing one for a new one, so a store
lost to a truncation, a bad restore or a deleted file would start the server with no projects
and no workloads while the pods it started still run and hold their GPUs: the next placements
would give those GPUs again. The checks here run before the store is opened (opening writes the
schema) and refuse such a start, naming the file, what is wrong with it, the pods that still run
from this data directory, and what to do. A missing store with no pod left running is a start
from scratch, said loudly (docs/robustness.md, "Store lost or corrupt").
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .runner import marked_group_leaders

TABLES = frozenset({"meta", "projects", "workloads", "events"})


class StoreLost(Exception):
    """The store cannot be trusted; the message says why and what to do."""


@dataclass(frozen=True)
class LivePod:
    pid: int
    key: str
    """``TESSERA_EXIT_FILE``'s name: workload id, attempt and pod index."""


def live_pods(directory: Path) -> list[LivePod]:
    """Process-group leaders started by a server of ``directory`` that still run (their
    environment names an exit file under ``directory/run``)."""
    marker = f"TESSERA_EXIT_FILE={directory / 'run'}/".encode()
    return sorted((LivePod(pid, key) for pid, _, key in marked_group_leaders(marker)),
                  key=lambda p: p.pid)


def _problem(path: Path) -> str | None:
    """What is wrong with an existing store file, or None."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if size == 0:
        return "is empty (0 bytes): it was truncated"
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return f"cannot be opened ({exc})"
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = TABLES - tables
        if missing:
            return f"is not a tessera store (no table {', '.join(sorted(missing))})"
        checked = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
        if checked != ["ok"]:
            return f"is corrupt (SQLite's quick_check: {'; '.join(checked)})"
    except sqlite3.Error as exc:
        return f"is not a readable SQLite database ({exc})"
    finally:
        db.close()
    return None


def _pods_text(pods: list[LivePod]) -> str:
    shown = ", ".join(f"pid {p.pid} ({p.key})" for p in pods[:20])
    more = f" and {len(pods) - 20} more" if len(pods) > 20 else ""
    return f"{len(pods)} pod(s) started from this data directory still run: {shown}{more}"


def check_store(directory: Path) -> str | None:
    """Raise :class:`StoreLost` when the server must not start on ``directory/tessera.db``;
    return a warning to print when it starts from scratch over a store that existed before
    (None: nothing to say)."""
    path = directory / "tessera.db"
    used_before = (directory / "credentials.json").exists()
    if path.exists() or path.is_symlink():
        problem = _problem(path)
        if problem is None:
            return None
        pods = live_pods(directory)
        held = (f" {_pods_text(pods)}; they hold GPUs that an empty state would give again. "
                f"Stop them (kill -- -PID for each) first, then" if pods else " Then")
        raise StoreLost(
            f"the store {path} {problem}. Refusing to start: an empty state would forget every "
            f"project and workload.{held} restore the file from a backup, or move it aside "
            f"(mv {path} {path}.broken) to start from an empty state.")
    if not used_before:
        return None
    pods = live_pods(directory)
    if pods:
        raise StoreLost(
            f"the store {path} is missing, but this data directory was used before "
            f"(credentials.json is there) and {_pods_text(pods)}. Refusing to start with an "
            "empty state while they hold GPUs: restore the file, or stop those pods "
            "(kill -- -PID for each) and start again to begin from an empty state.")
    return (f"WARNING: the store {path} is missing although this data directory was used "
            "before: starting with an EMPTY state (no projects, no workloads, no history). "
            "No pod of this directory is running.")
