"""Embedded mode's usage history in the server's SQLite store (tessera.local.usage_history_store):
written at most every save-every seconds, read back, and a corrupt or other-format row logged
and ignored (the history starts empty, nothing raises). The crash and restart of a real server:
tests/console/test_fair_share_history_browser.py."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from tessera.core.usage import UsagePolicy, UsageRecord
from tessera.core.usage_history import UsageHistory
from tessera.local.store import Store
from tessera.local.usage_history_store import HistoryRow


def _history() -> UsageHistory:
    return UsageHistory(UsagePolicy(window=3600.0, half_life=60.0), save_every=10.0)


def test_written_at_most_every_save_every_and_read_back(tmp_path: Path) -> None:
    db = tmp_path / "tessera.db"
    Store(db).close()  # the server's store: its meta table
    h = _history()
    row = HistoryRow(db, h)
    row.load()
    t = time.time() - 200
    h.records.append(UsageRecord("a", t, t + 60, 2.0))
    row.save(t + 100)
    h.records.append(UsageRecord("a", t + 60, t + 70, 1.0))
    row.save(t + 105)  # not due: the second record is not written yet
    saved = json.loads(sqlite3.connect(db).execute(
        "SELECT value FROM meta WHERE key='usage_history'").fetchone()[0])
    assert saved["savedAt"] == t + 100
    flat = saved["usage"]["a"]
    assert sum((e - s) * g for s, e, g in zip(flat[::3], flat[1::3], flat[2::3], strict=True)) == \
        pytest.approx(120.0)  # GPU-seconds: the first record only
    row.close()  # the server stops: written now
    again = _history()
    HistoryRow(db, again).load()
    assert sum(r.gpus * (r.end - r.start) for r in again.records) == pytest.approx(130.0)


@pytest.mark.parametrize(("value", "says"), [
    ("{\"format\": 1, \"savedAt\": \"x", "ignored: not a JSON record ("),
    (json.dumps({"format": 9, "savedAt": 1.0, "usage": {}, "running": []}),
     "ignored: format 9, this release reads format 1; starting empty"),
])
def test_a_corrupt_or_other_format_row_is_logged_and_ignored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, value: str, says: str) -> None:
    db = tmp_path / "tessera.db"
    Store(db).set_meta("usage_history", value)
    h = _history()
    with caplog.at_level(logging.WARNING, "tessera.local"):
        HistoryRow(db, h).load()
    assert h.records == [] and not h.running
    assert any(r.getMessage().startswith("usage history: ") and says in r.getMessage()
               for r in caplog.records), caplog.text
