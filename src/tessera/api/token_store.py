"""API clients and bearer tokens on disk: two small SQLite tables, the same for every backend.

Embedded mode keeps them in its own database file next to its workloads; on Kubernetes they are
the only thing the API server keeps on disk (workloads live in the cluster), so this store is all
the Kubernetes backend needs from SQLite.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (client_id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (token_hash TEXT PRIMARY KEY, client_id TEXT NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL);
"""


class TokenStore:
    """Implements ``tessera.api.auth.AuthStore``; only hashes of secrets and tokens are kept."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        path.chmod(0o600)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def client_secret_hash(self, client_id: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT secret_hash FROM clients WHERE client_id=?", (client_id,)).fetchone()
        return row[0] if row else None

    def set_client(self, client_id: str, secret_hash: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO clients (client_id, secret_hash, created) VALUES (?, ?, ?)",
                (client_id, secret_hash, time.time()),
            )

    def add_token(self, token_hash: str, client_id: str, ttl: float) -> float:
        """Keep a new token until ``ttl`` seconds from now (expired ones are dropped here)."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM tokens WHERE expires < ?", (now,))
                self._db.execute(
                    "INSERT INTO tokens (token_hash, client_id, created, expires)"
                    " VALUES (?, ?, ?, ?)",
                    (token_hash, client_id, now, now + ttl),
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return now + ttl

    def token_client(self, token_hash: str) -> str | None:
        """The client a token was issued to, or None when unknown or expired."""
        with self._lock:
            row = self._db.execute(
                "SELECT client_id FROM tokens WHERE token_hash=? AND expires >= ?",
                (token_hash, time.time()),
            ).fetchone()
        return row[0] if row else None

    def remove_token(self, token_hash: str) -> bool:
        """Revoke a token; whether it existed."""
        with self._lock:
            cur = self._db.execute("DELETE FROM tokens WHERE token_hash=?", (token_hash,))
        return cur.rowcount > 0
