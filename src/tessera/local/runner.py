"""Running workloads as local process groups.

Each pod is started as ``sh -c '"$@"; echo $? > EXIT'`` in a new session, so it is a process
group of its own that outlives the server. The shell records the command's exit status in a file
next to the log; that file, not the parent's ``wait``, is how an exit is learnt, so a server that
restarts can still tell a crash (exit code in the file) from a process that vanished (no file).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tessera.node import procfs

_SHIM = (
    '"$@"; rc=$?; echo "$rc" > "$TESSERA_EXIT_FILE.tmp"; mv -f "$TESSERA_EXIT_FILE.tmp" '
    '"$TESSERA_EXIT_FILE"; exit "$rc"'
)


def marked_group_leaders(marker: bytes) -> Iterator[tuple[int, int, str]]:
    """Live (non-zombie) process-group leaders whose environment holds an entry starting with
    ``marker``: (pid, start ticks, the rest of that entry). How a server finds the processes it
    started without their pids written down."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fields = procfs.stat_fields(pid)
            if fields is None or int(fields[2]) != pid or fields[0] == "Z":
                continue
            with open(f"/proc/{pid}/environ", "rb") as fb:
                environ = fb.read()
        except (OSError, ValueError, IndexError):
            continue
        for item in environ.split(b"\0"):
            if item.startswith(marker):
                yield pid, int(fields[19]), item[len(marker):].decode(errors="replace")


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    start_ticks: int
    log: str
    exit_file: str


@dataclass(frozen=True, slots=True)
class Exited:
    code: int | None
    """The command's exit status; None when it vanished without recording one."""
    reason: str


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = procfs.stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


class Runner:
    def __init__(self, data_dir: Path) -> None:
        self.logs = data_dir / "logs"
        self.run = data_dir / "run"
        for d in (self.logs, self.run):  # logs may hold secrets: the server's user only
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            d.chmod(0o700)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._kills: dict[int, float] = {}

    def paths(self, key: str) -> tuple[Path, Path]:
        return self.logs / f"{key}.log", self.run / f"{key}.exit"

    def start(self, key: str, argv: list[str], env: dict[str, str], cwd: str | None) -> Proc:
        log, exit_file = self.paths(key)
        exit_file.unlink(missing_ok=True)
        full_env = dict(env)
        full_env["TESSERA_EXIT_FILE"] = str(exit_file)
        with open(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as out:
            out.write(f"--- tessera: started {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _SHIM, "tessera-pod", *argv],
                env=full_env,
                cwd=cwd if cwd and os.path.isdir(cwd) else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[proc.pid] = proc
        ticks = _start_ticks(proc.pid) or 0
        return Proc(proc.pid, ticks, str(log), str(exit_file))

    def alive(self, pid: int, start_ticks: int) -> bool:
        child = self._children.get(pid)
        if child is not None:
            if child.poll() is None:
                return True
            del self._children[pid]
            return False
        ticks = _start_ticks(pid)
        return ticks is not None and (start_ticks == 0 or ticks == start_ticks)

    def check(self, pid: int, start_ticks: int, exit_file: str) -> Exited | None:
        """None while the pod runs (or, being stopped, still has processes); how it ended once done."""
        if self.alive(pid, start_ticks):
            return None
        if pid in self._kills:
            if self.group_alive(pid):
                return None
            del self._kills[pid]
        try:
            text = Path(exit_file).read_text().strip()
        except OSError:
            text = ""
        if text.lstrip("-").isdigit():
            code = int(text)
            if code == 0:
                return Exited(0, "exited with code 0")
            if code > 128:
                with contextlib.suppress(ValueError):
                    name = signal.Signals(code - 128).name
                    return Exited(code, f"exited with code {code} (killed by {name})")
            return Exited(code, f"exited with code {code}")
        return Exited(None, "the process group ended without recording an exit code")

    def adopt(self, pid: int, start_ticks: int) -> bool:
        """Whether a pod started by an earlier server is still running (and can be watched)."""
        return self.alive(pid, start_ticks)

    def terminate(self, pid: int, grace: float) -> None:
        """SIGTERM to the group now; ``reap_kills`` sends SIGKILL once ``grace`` has passed."""
        if pid in self._kills:
            return
        self._kills[pid] = time.monotonic() + grace
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)

    def reap_kills(self) -> None:
        """SIGKILL what is left of a stopped group once its grace period is over."""
        now = time.monotonic()
        for pid, deadline in list(self._kills.items()):
            if not self.group_alive(pid):
                if pid not in self._children:
                    del self._kills[pid]
                continue
            if now >= deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def kill_now(self, pid: int) -> None:
        """SIGKILL the process group at once."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def find_started(self, key_prefix: str) -> dict[str, tuple[int, int]]:
        """Pods whose group leader's environment holds ``TESSERA_START_KEY=PREFIX<index>``:
        index -> (pid, start ticks). How a restarted server finds processes of a start that
        was interrupted before their pids were written down."""
        marker = f"TESSERA_START_KEY={key_prefix}".encode()
        return {value: (pid, ticks) for pid, ticks, value in marked_group_leaders(marker)}

    def group_alive(self, pid: int) -> bool:
        """Whether any live (non-zombie) process is left in the process group ``pid``."""
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            self._children.pop(pid, None)
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return any(pgrp == pid and state != "Z" for pgrp, state in _groups())


def _groups() -> list[tuple[int, str]]:
    """(process group, state) of every process, from /proc."""
    out: list[tuple[int, str]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = procfs.stat_fields(entry.name)
        if fields is None:
            continue
        out.append((int(fields[2]), fields[0]))
    return out
