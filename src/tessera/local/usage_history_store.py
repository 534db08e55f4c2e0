"""Where embedded mode keeps its usage history across restarts (time-based fair share,
docs/scheduling.md): one row (``usage_history``) of the server's own SQLite store's ``meta``
table, which only the server process writes (tenants reach the store through the API only).
Read when the server starts; written by the control loop every ``save-every`` seconds and when
the server stops. The record is ``tessera.core.usage_saved``'s JSON; an unreadable or
other-format one is logged and the history starts empty, the server runs on."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tessera.api.sqlite_db import SqliteDb
from tessera.core.usage_history import UsageHistory

log = logging.getLogger("tessera.local")

KEY = "usage_history"
SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


class HistoryRow:
    def __init__(self, path: Path, history: UsageHistory) -> None:
        self.path = path
        self.history = history
        self._db: SqliteDb | None = None

    def _open(self) -> SqliteDb:
        if self._db is None:
            self._db = SqliteDb(self.path, SCHEMA)
        return self._db

    def load(self) -> None:
        if self.history.policy is None:
            return
        where = f"{self.path} (meta {KEY})"
        try:
            with self._open().transaction() as db:
                rows = db.execute("SELECT value FROM meta WHERE key=?", (KEY,)).fetchall()
        except Exception as exc:
            log.warning("usage history: %s could not be read (%s); starting empty", where, exc)
            return
        if not rows:
            log.info("usage history: none saved in %s yet; starting empty", where)
            return
        ok, line = self.history.restore_from(lambda: json.loads(rows[0][0]), "a JSON record",
                                             where, time.time())
        log.log(logging.INFO if ok else logging.WARNING, "%s", line)

    def save(self, now: float, force: bool = False) -> None:
        """Write the record if it is due (or ``force``); never raises (logged)."""
        try:
            record = self.history.saved(now, force=force)
            if record is None:
                return
            with self._open().transaction() as db:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           (KEY, json.dumps(record, separators=(",", ":"))))
        except Exception as exc:  # the next save tries again; scheduling goes on
            log.warning("usage history: writing %s failed: %s", self.path, exc)

    def close(self) -> None:
        if self._db is not None:
            self.save(time.time(), force=True)
            self._db.close()
            self._db = None
