"""A bound on request bodies, as ASGI middleware, for the REST API and the webhook.

A body is refused with 413 as soon as its declared ``Content-Length`` or the bytes received so
far pass the limit, before it is buffered or parsed, so a client cannot make the server hold or
parse megabytes it will refuse anyway.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

API_MAX_BODY = 1024 * 1024
"""The REST API's largest request: a workload with its command (128 KiB) and environment
(512 KiB) fits with room to spare."""


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def too_large(send: Send, limit: int, as_json: bool = True) -> None:
    message = f"the request body is larger than {limit // 1024} KiB"
    if as_json:
        body = json.dumps({"code": 413, "message": f"body: {message}",
                           "details": [{"field": "body", "message": message}]}).encode()
        ctype = b"application/json"
    else:
        body, ctype = message.encode(), b"text/plain"
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 (JSON error in the API's shape)."""

    def __init__(self, app: App, limit: int = API_MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = declared_length(scope)
        if length is not None and length > self.limit:
            await too_large(send, self.limit)
            return
        body = await read_body(receive, self.limit)
        if body is None:
            await too_large(send, self.limit)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` bytes (the rest is not read)."""
    body = bytearray()
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            return bytes(body)
        body += msg.get("body", b"")
        if len(body) > limit:
            return None
        if not msg.get("more_body"):
            return bytes(body)
