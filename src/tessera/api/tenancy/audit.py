"""The audit trail: every mutating request (POST, PUT, PATCH, DELETE under ``/api/``) appended
after it is answered, with who (the token's subject, or the name a sign-in gave), when, from
where (the client address), what (method, path and the permission it needed) and the result
(HTTP status, and the refusal's message). Bodies are never written, and a message's
``(got ...)`` echo of a value is cut, so no secret reaches the log.

Stored in the API server's SQLite database (both backends; on Kubernetes on the API server's
volume, docs/tenancy.md says why). Readable with ``audit:read`` (cluster admins):
``GET /api/v1/audit/log``, ``tessera audit``."""


import json
import logging
import re
import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tessera.api.tenancy.guard import POLICY
from tessera.api.tenancy.store import TenancyStore
from tessera.core.errors import InvalidRequest

log = logging.getLogger("tessera.audit")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_GOT = re.compile(r"\s*\(got .*?\)")
MAX_RESULT = 500


class AuditTrail:
    """ASGI middleware: appends one row per mutating API request once it is answered."""

    def __init__(self, app: ASGIApp, store: TenancyStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING \
                or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        status = 500
        body = bytearray()

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400 \
                    and len(body) < 4096:
                body.extend(message.get("body", b"")[:4096])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            self._append(scope, status, bytes(body))

    def _append(self, scope: Scope, status: int, body: bytes) -> None:
        state = scope.get("state") or {}
        principal = state.get("principal")
        subject = principal.label if principal is not None else \
            str(state.get("audit_subject") or "anonymous")
        route = scope.get("route")
        path_format = str(getattr(route, "path", scope["path"]))
        action = POLICY.get((scope["method"], path_format), ("", ""))[0] or (
            "sign-in" if path_format == "/api/v1/token" else path_format)
        result = "ok"
        if status >= 400:
            try:
                result = str(json.loads(body).get("message", ""))
            except (ValueError, AttributeError):
                result = body.decode(errors="replace")
            result = _GOT.sub("", result)[:MAX_RESULT] or f"HTTP {status}"
        client = scope.get("client")
        source = client[0] if client else "?"
        try:
            self.store.append_audit(subject, source, scope["method"], scope["path"], action,
                                    status, result)
        except Exception as exc:  # the answer is sent; say it loudly, never lose it silently
            log.error("audit: could not append %s %s by %s: %r", scope["method"],
                      scope["path"], subject, exc)


def parse_time(value: str | None, field: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(field, "must be an ISO 8601 time, e.g. 2026-11-27T00:00:00Z",
                             value) from None
    if t.tzinfo is None:
        raise InvalidRequest(field, "must give its time zone (Z or +HH:MM)", value)
    return t.timestamp()


def mount_audit(api: APIRouter, store: TenancyStore) -> None:
    @api.get("/audit/log", tags=["audit"])
    def audit_log(
        start: Annotated[str | None, Query(alias="from", description="ISO 8601")] = None,
        end: Annotated[str | None, Query(alias="to", description="ISO 8601")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        """The newest entries first: who, when, from where, what and the result."""
        since = parse_time(start, "from", 0.0)
        until = parse_time(end, "to", time.time() + 1)
        if since > until:
            raise InvalidRequest("from", "must not be after to")
        return {"entries": store.audit(since, until, limit)}
