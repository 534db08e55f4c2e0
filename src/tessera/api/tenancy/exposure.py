"""What the API answers to whom before any route runs (ASGI middleware):

- ``TESSERA_ALLOWED_HOSTS`` (comma-separated host names; the chart's ``api.allowedHosts``):
  a request whose ``Host`` is not one of them is refused with 400, so the API answers only for
  the names a deployment configured (DNS rebinding, a stray Ingress). ``/healthz`` is exempt
  (kubelet probes by pod IP). Unset: every host.
- ``TESSERA_METRICS_REQUIRE_TOKEN=true`` (``api.metrics.requireToken``): ``/metrics`` needs a
  valid bearer token (Prometheus' ``authorization`` setting), else 401."""

import json
import os
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from tessera.api.tenancy.policy import Principal


def allowed_hosts() -> frozenset[str]:
    raw = os.environ.get("TESSERA_ALLOWED_HOSTS", "")
    return frozenset(h.strip().lower() for h in raw.split(",") if h.strip())


def metrics_need_token() -> bool:
    return os.environ.get("TESSERA_METRICS_REQUIRE_TOKEN", "").strip().lower() in (
        "1", "true", "yes")


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message, "details": None}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Exposure:
    def __init__(self, app: ASGIApp, resolve: Callable[[str], Principal | None]) -> None:
        self.app = app
        self.resolve = resolve
        self.hosts = allowed_hosts()
        self.metrics_token = metrics_need_token()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.hosts and scope["path"] != "/healthz":
            host = headers.get(b"host", b"").decode(errors="replace").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.strip("[]") not in self.hosts:
                await _refuse(send, 400, f"this server answers only for {', '.join(sorted(self.hosts))}"
                              " (TESSERA_ALLOWED_HOSTS)")
                return
        if self.metrics_token and scope["path"] == "/metrics":
            auth = headers.get(b"authorization", b"").decode(errors="replace")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not token or self.resolve(token) is None:
                await _refuse(send, 401, "/metrics needs a bearer token here "
                              "(TESSERA_METRICS_REQUIRE_TOKEN)")
                return
        await self.app(scope, receive, send)
