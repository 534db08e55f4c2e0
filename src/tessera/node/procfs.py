"""``/proc/PID/stat``, read one way: the fields after the command name.

The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the
fields are what follows its *last* closing parenthesis. Index 0 of the list is the process
state (field 3 of proc(5)); 1 ppid, 2 pgrp, 3 session, 11 utime, 12 stime, 19 starttime.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int | str) -> list[str] | None:
    """Fields 3 onwards of ``/proc/PID/stat``; None when the process is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    end = raw.rfind(")")
    return raw[end + 2 :].split() if end >= 0 else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (its threads; not its children), None if gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICK
