"""Embedded mode's GPU accounting: SQLite triggers on the workloads table write an allocation
interval (``tessera.api.tenancy.ledger``) whenever a workload's allocated GPUs change, in the
same transaction as the change itself. So the ledger is exactly as durable as the binding, and
needs no hook in the control loop: a bind (Running), a suspend or eviction (0), completion,
and deletion each close or open an interval at the time the store recorded it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tessera.api.tenancy.ledger import SCHEMA

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_OPEN = f"""
  INSERT INTO gpu_allocations (workload_id, workload, project, user, gpus, start_time)
  SELECT NEW.id, NEW.name, NEW.project_name,
         COALESCE(json_extract(NEW.control, '$.submitted_by'), ''), NEW.gpus_allocated, {_NOW}
  WHERE NEW.gpus_allocated > 0;"""
TRIGGERS = f"""
CREATE TRIGGER IF NOT EXISTS accounting_insert AFTER INSERT ON workloads
WHEN NEW.gpus_allocated > 0 BEGIN {_OPEN} END;
CREATE TRIGGER IF NOT EXISTS accounting_update AFTER UPDATE OF gpus_allocated ON workloads
WHEN NEW.gpus_allocated != OLD.gpus_allocated BEGIN
  UPDATE gpu_allocations SET end_time = {_NOW}
  WHERE workload_id = NEW.id AND end_time IS NULL;
  {_OPEN}
END;
CREATE TRIGGER IF NOT EXISTS accounting_delete AFTER DELETE ON workloads BEGIN
  UPDATE gpu_allocations SET end_time = {_NOW}
  WHERE workload_id = OLD.id AND end_time IS NULL;
END;
"""


def install(path: Path) -> None:
    """Create the ledger's tables and the triggers in embedded mode's database (idempotent)."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(SCHEMA + TRIGGERS)
    finally:
        db.close()
