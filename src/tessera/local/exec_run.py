"""Running one command for ``exec`` with bounds: its output is capped (the rest is read and
dropped, so the command never blocks on a full pipe), and on timeout its whole process group is
killed, grandchildren included."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import IO

from tessera.api.backend import Conflict
from tessera.core.errors import InvalidRequest

OUTPUT_CAP = 1024 * 1024
"""Bytes of stdout and of stderr returned; the rest is dropped (and said so)."""


@dataclass(frozen=True)
class Done:
    code: int
    stdout: bytes
    stderr: bytes
    truncated: bool


def _drain(stream: IO[bytes], into: bytearray, cap: int, flags: list[bool]) -> None:
    while chunk := stream.read(65536):
        room = cap - len(into)
        if room > 0:
            into += chunk[:room]
        if len(chunk) > room:
            flags[0] = True


def run_capped(argv: list[str], env: dict[str, str], cwd: str | None, timeout: float,
               cap: int = OUTPUT_CAP) -> Done:
    """Run ``argv``; refusals name the field: ``command`` (not found, not executable, too
    long) or the timeout."""
    if cwd is not None and not os.path.isdir(cwd):
        cwd = None
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except FileNotFoundError:
        raise InvalidRequest("command", "not found (no such program on the PATH of the pod)",
                             argv[0][:200]) from None
    except (PermissionError, IsADirectoryError):
        raise InvalidRequest("command", "is not an executable program (a directory, or no "
                             "execute permission)", argv[0][:200]) from None
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            raise InvalidRequest("command", "is too long for the system (arguments plus the "
                                 "pod's environment exceed the kernel's limit)") from None
        raise InvalidRequest("command", f"could not be started: {exc.strerror}",
                             argv[0][:200]) from None
    out, err = bytearray(), bytearray()
    flags = [False]
    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=_drain, args=(s, b, cap, flags), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for t in readers:
            t.join(timeout=1)
        raise Conflict(f"the command did not finish within {timeout:g} s (its processes were "
                       "killed)") from None
    # grandchildren may keep the pipes open: the command is done, so are they
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for t in readers:
        t.join(timeout=2)
    return Done(code, bytes(out), bytes(err), flags[0])
