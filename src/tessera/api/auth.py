"""The local admin client and bearer tokens, the same for every backend.

Secrets and tokens are kept only as SHA-256 hashes; the admin's credentials file is readable by
its owner alone.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Protocol

from tessera.api.datadir import write_private

TOKEN_TTL = 30 * 24 * 3600.0


class AuthStore(Protocol):
    def client_secret_hash(self, client_id: str) -> str | None: ...
    def set_client(self, client_id: str, secret_hash: str) -> None: ...
    def add_token(self, token_hash: str, client_id: str, ttl: float) -> float: ...
    def token_client(self, token_hash: str) -> str | None: ...
    def remove_token(self, token_hash: str) -> bool: ...


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenAuth:
    """Mixin for backends: needs ``data_dir`` and ``auth_store``."""

    data_dir: Path
    auth_store: AuthStore

    def ensure_admin(self) -> dict[str, str]:
        """The local admin client (created on first start), kept readable only by this user."""
        path = self.data_dir / "credentials.json"
        if path.exists():
            creds: dict[str, str] = json.loads(path.read_text())
            if self.auth_store.client_secret_hash(creds["clientId"]) == secret_hash(creds["clientSecret"]):
                return creds
        creds = {"clientId": "admin", "clientSecret": secrets.token_urlsafe(32)}
        self.auth_store.set_client(creds["clientId"], secret_hash(creds["clientSecret"]))
        write_private(path, json.dumps(creds))
        return creds

    def authenticate(self, client_id: str, secret: str) -> bool:
        stored = self.auth_store.client_secret_hash(client_id)
        return stored is not None and secrets.compare_digest(stored, secret_hash(secret))

    def issue_token(self, client_id: str) -> tuple[str, float]:
        token = secrets.token_urlsafe(32)
        return token, self.auth_store.add_token(secret_hash(token), client_id, TOKEN_TTL)

    def token_valid(self, token: str) -> bool:
        return self.auth_store.token_client(secret_hash(token)) is not None

    def revoke_token(self, token: str) -> bool:
        """Forget a token (``tessera logout``, ``DELETE /api/v1/token``); it stops working at once."""
        return self.auth_store.remove_token(secret_hash(token))
