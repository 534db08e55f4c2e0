"""Answers for a data directory that cannot be written (disk full, read-only, I/O error).

SQLite rolls the failed transaction back, so the request changed nothing; the client gets a
5xx that says so (507 Insufficient Storage for a full disk) instead of a dropped connection."""

from __future__ import annotations

import errno
import sqlite3

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_SQLITE_READONLY = 8


def storage_error(exc: BaseException) -> tuple[int, str] | None:
    """(status, message) when ``exc`` means the data directory could not be written; None for
    any other error (a bug stays a 500 with a traceback in the log)."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        text = str(exc).lower()
        if code == _SQLITE_FULL or "disk is full" in text:
            return 507, ("the server's data directory is full (disk or quota): nothing was "
                         "changed; free space there and retry")
        if code in (_SQLITE_IOERR, _SQLITE_READONLY) or "disk i/o error" in text \
                or "readonly" in text:
            return 503, (f"the server cannot write its data directory ({exc}): nothing was "
                         "changed; retry once it is writable")
        return None
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return 507, ("the server's data directory is full (disk or quota): nothing was "
                     "changed; free space there and retry")
    return None
