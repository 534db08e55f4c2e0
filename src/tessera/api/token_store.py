"""API clients and bearer tokens on disk: two small SQLite tables, the same for every backend.

Embedded mode keeps them in its own database file next to its workloads; on Kubernetes they are
the only thing the API server keeps on disk (workloads live in the cluster), so this store is all
the Kubernetes backend needs from SQLite.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tessera.api.sqlite_db import SqliteDb

SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (client_id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (token_hash TEXT PRIMARY KEY, client_id TEXT NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL);
"""


class TokenStore(SqliteDb):
    """Implements ``tessera.api.auth.AuthStore``; only hashes of secrets and tokens are kept."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        path.chmod(0o600)
        super().__init__(path, SCHEMA)
        have = {row[1] for row in self._db.execute("PRAGMA table_info(tokens)")}
        for column, decl in (("kind", "TEXT NOT NULL DEFAULT 'app'"),
                             ("groups", "TEXT NOT NULL DEFAULT '[]'"),
                             ("restricted", "INTEGER NOT NULL DEFAULT 0")):
            if column not in have:  # a data directory from before tenancy (docs/tenancy.md)
                self._db.execute(f"ALTER TABLE tokens ADD COLUMN {column} {decl}")

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

    def add_token(self, token_hash: str, client_id: str, ttl: float, kind: str = "app",
                  groups: str = "[]", restricted: bool = False) -> float:
        """Keep a new token until ``ttl`` seconds from now (expired ones are dropped here).
        ``client_id`` names its subject: an application, a user or an SSO user (``kind``)."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM tokens WHERE expires < ?", (now,))
                self._db.execute(
                    "INSERT INTO tokens (token_hash, client_id, created, expires, kind, groups,"
                    " restricted) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (token_hash, client_id, now, now + ttl, kind, groups, int(restricted)),
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return now + ttl

    def token_client(self, token_hash: str) -> str | None:
        """The application a token was issued to, or None when unknown, expired or a user's."""
        with self._lock:
            row = self._db.execute(
                "SELECT client_id FROM tokens WHERE token_hash=? AND expires >= ? AND kind='app'",
                (token_hash, time.time()),
            ).fetchone()
        return row[0] if row else None

    def token_subject(self, token_hash: str) -> tuple[str, str, str, bool, float] | None:
        """(kind, name, groups JSON, restricted, expires) of a live token, else None."""
        with self._lock:
            row = self._db.execute(
                "SELECT kind, client_id, groups, restricted, expires FROM tokens"
                " WHERE token_hash=? AND expires >= ?", (token_hash, time.time()),
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2], bool(row[3]), row[4])

    def remove_tokens_of(self, kind: str, name: str) -> int:
        """Revoke every token of one subject (deleted user, regenerated secret, password set)."""
        with self._lock:
            cur = self._db.execute("DELETE FROM tokens WHERE kind=? AND client_id=?", (kind, name))
        return cur.rowcount

    def remove_client(self, client_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM clients WHERE client_id=?", (client_id,))
            self._db.execute("DELETE FROM tokens WHERE kind='app' AND client_id=?", (client_id,))
        return cur.rowcount > 0

    def clients(self) -> list[tuple[str, float]]:
        with self._lock:
            return [(r[0], r[1]) for r in self._db.execute(
                "SELECT client_id, created FROM clients ORDER BY client_id")]

    def remove_token(self, token_hash: str) -> bool:
        """Revoke a token; whether it existed."""
        with self._lock:
            cur = self._db.execute("DELETE FROM tokens WHERE token_hash=?", (token_hash,))
        return cur.rowcount > 0
