"""Single sign-on with an OIDC provider (Dex, Keycloak, Okta, Entra ID ...): the provider signs
users in; tessera checks its ID token (signature by the issuer's JWKS, issuer, audience, expiry,
nonce) and issues its own token naming the user (``sso`` kind) and its groups, so access rules
for the user (by e-mail) and for its groups apply.

- Console: authorization code with PKCE (S256): ``GET /api/v1/auth/oidc/login`` redirects to the
  provider; ``GET /api/v1/auth/oidc/callback`` exchanges the code with the verifier and sends the
  browser to ``/#/sso/<token>`` (a URL fragment: never sent to a server).
- CLI (``tessera login --sso``): the device flow (RFC 8628): ``POST /api/v1/auth/oidc/device``
  starts it at the provider; the CLI shows the code and URL and polls
  ``POST /api/v1/auth/oidc/device/token``.

Configured by ``TESSERA_OIDC_ISSUER``, ``TESSERA_OIDC_CLIENT_ID``, ``TESSERA_OIDC_CLIENT_SECRET``
(optional: a public client), ``TESSERA_OIDC_USERNAME_CLAIM`` (default ``email``),
``TESSERA_OIDC_GROUPS_CLAIM`` (default ``groups``), ``TESSERA_OIDC_REDIRECT_URL`` (default: this
server's ``/api/v1/auth/oidc/callback`` as the request reached it).
"""

import base64
import hashlib
import os
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

PENDING_TTL = 600.0


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str = ""
    username_claim: str = "email"
    groups_claim: str = "groups"
    redirect_url: str = ""

    @staticmethod
    def from_env() -> "OidcConfig | None":
        issuer = os.environ.get("TESSERA_OIDC_ISSUER", "").rstrip("/")
        if not issuer:
            return None
        return OidcConfig(issuer, os.environ.get("TESSERA_OIDC_CLIENT_ID", "tessera"),
                          os.environ.get("TESSERA_OIDC_CLIENT_SECRET", ""),
                          os.environ.get("TESSERA_OIDC_USERNAME_CLAIM", "email"),
                          os.environ.get("TESSERA_OIDC_GROUPS_CLAIM", "groups"),
                          os.environ.get("TESSERA_OIDC_REDIRECT_URL", ""))


class OidcError(Exception):
    """The provider refused, or its answer did not check out (said to the user, 401)."""


class Pending(Exception):
    """The device flow's user has not approved yet (``authorization_pending``/``slow_down``)."""


@dataclass(frozen=True)
class Identity:
    username: str
    groups: tuple[str, ...]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Oidc:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._discovery: dict[str, Any] | None = None
        self._jwks: jwt.PyJWKClient | None = None
        self._pending: dict[str, tuple[str, str, str, float]] = {}
        """state -> (PKCE verifier, nonce, redirect URI, created)."""

    def discovery(self) -> dict[str, Any]:
        if self._discovery is None:
            url = f"{self.config.issuer}/.well-known/openid-configuration"
            try:
                r = httpx.get(url, timeout=10)
                r.raise_for_status()
            except httpx.HTTPError as exc:
                raise OidcError(f"the OIDC provider {self.config.issuer} did not answer: {exc}"
                                ) from None
            doc: dict[str, Any] = r.json()
            if doc.get("issuer", "").rstrip("/") != self.config.issuer:
                raise OidcError(f"the provider's discovery names issuer {doc.get('issuer')!r}, "
                                f"not {self.config.issuer!r}")
            self._discovery = doc
            self._jwks = jwt.PyJWKClient(doc["jwks_uri"], cache_keys=True)
        return self._discovery

    def _auth(self) -> dict[str, str]:
        body = {"client_id": self.config.client_id}
        if self.config.client_secret:
            body["client_secret"] = self.config.client_secret
        return body

    # -- authorization code + PKCE ---------------------------------------------------------------

    def authorize_url(self, redirect_uri: str) -> str:
        d = self.discovery()
        state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        verifier = secrets.token_urlsafe(48)
        challenge = _b64(hashlib.sha256(verifier.encode()).digest())
        now = time.monotonic()
        with self._lock:
            self._pending = {k: v for k, v in self._pending.items() if now - v[3] < PENDING_TTL}
            self._pending[state] = (verifier, nonce, redirect_uri, now)
        query = {"response_type": "code", "client_id": self.config.client_id,
                 "redirect_uri": redirect_uri, "scope": "openid email profile groups",
                 "state": state, "nonce": nonce, "code_challenge": challenge,
                 "code_challenge_method": "S256"}
        return f"{d['authorization_endpoint']}?{urllib.parse.urlencode(query)}"

    def finish_code(self, code: str, state: str) -> Identity:
        with self._lock:
            pending = self._pending.pop(state, None)
        if pending is None or time.monotonic() - pending[3] > PENDING_TTL:
            raise OidcError("state: unknown or expired sign-in; start again")
        verifier, nonce, redirect_uri, _ = pending
        tokens = self._token({"grant_type": "authorization_code", "code": code,
                              "redirect_uri": redirect_uri, "code_verifier": verifier})
        return self.identity(tokens, nonce)

    # -- device flow -----------------------------------------------------------------------------

    def device_start(self) -> dict[str, Any]:
        d = self.discovery()
        endpoint = d.get("device_authorization_endpoint")
        if not endpoint:
            raise OidcError(f"the provider {self.config.issuer} offers no device flow")
        r = httpx.post(endpoint, data={**self._auth(), "scope": "openid email profile groups"},
                       timeout=10)
        if r.status_code != 200:
            raise OidcError(f"the provider refused the device flow: {r.text[:200]}")
        doc: dict[str, Any] = r.json()
        return {"deviceCode": doc["device_code"], "userCode": doc["user_code"],
                "verificationUri": doc["verification_uri"],
                "verificationUriComplete": doc.get("verification_uri_complete"),
                "interval": int(doc.get("interval", 5)), "expiresIn": int(doc["expires_in"])}

    def device_poll(self, device_code: str) -> Identity:
        tokens = self._token({"grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                              "device_code": device_code})
        return self.identity(tokens, None)

    # -- tokens ----------------------------------------------------------------------------------

    def _token(self, form: dict[str, str]) -> dict[str, Any]:
        d = self.discovery()
        r = httpx.post(d["token_endpoint"], data={**self._auth(), **form}, timeout=10)
        if r.status_code != 200:
            try:
                err = r.json()
            except ValueError:
                err = {"error": r.text[:200]}
            if err.get("error") in ("authorization_pending", "slow_down"):
                raise Pending(err["error"])
            raise OidcError(f"the provider refused: {err.get('error')}: "
                            f"{err.get('error_description', '')}".rstrip(": "))
        doc: dict[str, Any] = r.json()
        return doc

    def identity(self, tokens: dict[str, Any], nonce: str | None) -> Identity:
        raw = tokens.get("id_token")
        if not raw:
            raise OidcError("the provider returned no ID token (is the openid scope allowed?)")
        assert self._jwks is not None
        try:
            key = self._jwks.get_signing_key_from_jwt(raw)
            claims: dict[str, Any] = jwt.decode(
                raw, key.key, algorithms=["RS256", "ES256", "PS256", "EdDSA"],
                audience=self.config.client_id, issuer=self.discovery()["issuer"],
                options={"require": ["exp", "iat", "sub"]}, leeway=30)
        except jwt.PyJWTError as exc:
            raise OidcError(f"the ID token did not check out: {exc}") from None
        if nonce is not None and claims.get("nonce") != nonce:
            raise OidcError("the ID token's nonce does not match this sign-in")
        name = claims.get(self.config.username_claim)
        if not isinstance(name, str) or not name:
            raise OidcError(f"the ID token has no {self.config.username_claim!r} claim "
                            "(TESSERA_OIDC_USERNAME_CLAIM)")
        groups = claims.get(self.config.groups_claim) or []
        if not isinstance(groups, list):
            groups = [groups]
        return Identity(name, tuple(str(g) for g in groups))
