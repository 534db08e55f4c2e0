"""The single sign-on routes (open: they are how a user without a token gets one); see
``tessera.api.tenancy.oidc``."""

from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import RedirectResponse

from tessera.api.models import SecretText, Strict
from tessera.api.tenancy.guard import ApiRefusal
from tessera.api.tenancy.oidc import Identity, Oidc, OidcConfig, OidcError, Pending
from tessera.api.tenancy.service import Tenancy


class DeviceToken(Strict):
    deviceCode: SecretText


def mount_oidc(app: FastAPI, tenancy: Tenancy) -> None:
    config = OidcConfig.from_env()
    oidc = Oidc(config) if config is not None else None

    def need() -> Oidc:
        if oidc is None:
            raise ApiRefusal(404, "single sign-on is not configured on this server "
                             "(TESSERA_OIDC_ISSUER; docs/tenancy.md)")
        return oidc

    def sign_in(who: Identity, request: Request) -> tuple[str, float]:
        request.state.audit_subject = f"sso:{who.username}"
        user = tenancy.store.user(who.username)
        if user is not None and user[3] != "sso":
            raise ApiRefusal(409, f"a local user named {who.username} exists; single sign-on "
                             "cannot take its name")
        if user is None:
            tenancy.store.add_user(who.username, None, False, "sso", "sso")
        return tenancy.issue("sso", who.username, who.groups)

    @app.get("/api/v1/auth/oidc", tags=["auth"])
    def oidc_info() -> dict[str, Any]:
        """Whether single sign-on is configured, and with which issuer."""
        return {"enabled": oidc is not None,
                "issuer": config.issuer if config is not None else None}

    @app.get("/api/v1/auth/oidc/login", tags=["auth"])
    def oidc_login(request: Request) -> RedirectResponse:
        """The console's sign-in: to the provider (authorization code with PKCE)."""
        o = need()
        redirect = o.config.redirect_url or f"{str(request.base_url).rstrip('/')}" \
            "/api/v1/auth/oidc/callback"
        try:
            return RedirectResponse(o.authorize_url(redirect), status_code=302)
        except OidcError as exc:
            raise ApiRefusal(502, str(exc)) from None

    @app.get("/api/v1/auth/oidc/callback", tags=["auth"])
    def oidc_callback(request: Request, code: str = Query("", max_length=4096),
                      state: str = Query("", max_length=512),
                      error: str = Query("", max_length=512)) -> RedirectResponse:
        """Back from the provider: the code is exchanged (with the PKCE verifier), the ID token
        checked, and the browser sent to the console with a tessera token in the fragment."""
        o = need()
        source = request.client.host if request.client else "?"

        def audit(subject: str, status: int, result: str) -> None:
            # a GET, which the audit middleware does not record: a sign-in is recorded here
            tenancy.store.append_audit(subject, source, "GET", "/api/v1/auth/oidc/callback",
                                       "sign-in", status, result)

        if error or not code:
            audit("anonymous", 401, f"single sign-on failed: {error or 'no code'}")
            raise ApiRefusal(401, f"single sign-on failed: {error or 'no code'}")
        try:
            who = o.finish_code(code, state)
        except OidcError as exc:
            audit("anonymous", 401, f"single sign-on failed: {exc}")
            raise ApiRefusal(401, f"single sign-on failed: {exc}") from None
        token, _ = sign_in(who, request)
        audit(f"sso:{who.username}", 302, "ok")
        return RedirectResponse(f"/#/sso/{token}", status_code=302)

    @app.post("/api/v1/auth/oidc/device", tags=["auth"])
    def oidc_device() -> dict[str, Any]:
        """Start the device flow (``tessera login --sso``): a code for the user to enter at
        the provider's verification URL."""
        try:
            return need().device_start()
        except OidcError as exc:
            raise ApiRefusal(502, str(exc)) from None

    @app.post("/api/v1/auth/oidc/device/token", tags=["auth"])
    def oidc_device_token(body: DeviceToken, request: Request) -> dict[str, Any]:
        """Poll the device flow: 428 ``authorization_pending`` until the user approved, then
        a tessera token naming the user and its groups."""
        try:
            who = need().device_poll(body.deviceCode)
        except Pending as exc:
            raise ApiRefusal(428, str(exc)) from None
        except OidcError as exc:
            raise ApiRefusal(401, f"single sign-on failed: {exc}") from None
        token, expires = sign_in(who, request)
        return {"accessToken": token, "expiresAt": int(expires), "username": who.username,
                "groups": list(who.groups)}
