"""The tenancy service one API server holds: its store, tokens, policy and sign-in throttle."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path

from tessera.api.auth import secret_hash
from tessera.api.tenancy.policy import Authorizer, Principal
from tessera.api.tenancy.store import TenancyStore, groups_json
from tessera.api.token_store import TokenStore

APP_TOKEN_TTL = 30 * 24 * 3600.0
USER_TOKEN_TTL = 24 * 3600.0
THROTTLE_FREE = 5
"""Wrong secrets or passwords allowed per (client, source) before each next try must wait."""
THROTTLE_MAX = 300.0


def _ttl(default: float) -> float:
    """``TESSERA_TOKEN_TTL_SECONDS`` shortens every token's life (tests; strict sites)."""
    raw = os.environ.get("TESSERA_TOKEN_TTL_SECONDS")
    try:
        return min(default, float(raw)) if raw else default
    except ValueError:
        return default


class Throttle:
    """Failed sign-ins per (client or user, source address): after ``THROTTLE_FREE`` failures
    each further try waits 1, 2, 4 ... up to 300 s (answered 429 with Retry-After); a success
    clears it. In memory: a restart forgets it, which only ever helps the owner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], tuple[int, float]] = {}

    def wait(self, who: str, source: str) -> float:
        with self._lock:
            _, until = self._state.get((who, source), (0, 0.0))
        return max(0.0, until - time.monotonic())

    def failed(self, who: str, source: str) -> None:
        with self._lock:
            if len(self._state) > 100_000:
                self._state.clear()
            count, _ = self._state.get((who, source), (0, 0.0))
            count += 1
            delay = 0.0 if count < THROTTLE_FREE else min(2.0 ** (count - THROTTLE_FREE),
                                                          THROTTLE_MAX)
            self._state[(who, source)] = (count, time.monotonic() + delay)

    def succeeded(self, who: str, source: str) -> None:
        with self._lock:
            self._state.pop((who, source), None)


class Tenancy:
    def __init__(self, data_dir: Path, tokens: TokenStore) -> None:
        self.store = TenancyStore(data_dir / "tessera.db")
        self.tokens = tokens
        self.authz = Authorizer(self.store)
        self.throttle = Throttle()

    def ensure_admin_rule(self) -> None:
        """The local admin application holds the admin role on the cluster (one subject among
        others: its rule is listed and its tokens expire and are revoked like any other)."""
        if self.store.count_cluster_admins() == 0:
            self.store.add_rule("app", "admin", "admin", "cluster", "", "tessera")

    def issue(self, kind: str, name: str, groups: tuple[str, ...] = (),
              restricted: bool = False) -> tuple[str, float]:
        token = secrets.token_urlsafe(32)
        ttl = _ttl(APP_TOKEN_TTL if kind == "app" else USER_TOKEN_TTL)
        expires = self.tokens.add_token(secret_hash(token), name, ttl, kind, groups_json(groups),
                                        restricted)
        return token, expires

    def resolve(self, token: str) -> Principal | None:
        row = self.tokens.token_subject(secret_hash(token))
        if row is None:
            return None
        kind, name, groups, restricted, _ = row
        if kind in ("user", "sso") and self.store.user(name) is None:
            return None  # a deleted user's token (deleted with it; this is the second lock)
        return Principal(kind, name, tuple(json.loads(groups)), restricted)

    def revoke(self, token: str) -> bool:
        return self.tokens.remove_token(secret_hash(token))
