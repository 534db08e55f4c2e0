"""Errors no route expected, answered as ASGI middleware so the connection stays open.

Starlette gives an ``exception_handler(Exception)`` to its outermost middleware, which sends
the handler's response and then raises the exception again: the server logs it a second time
and closes the connection, so a client with a keep-alive pool (the CLI, the console, httpx)
finds its next request on that connection reset. This middleware sits inside that one and
answers the error itself; only an error after the response started still propagates (nothing
else can be sent then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from tessera.api.limits import App, Receive, Scope, Send


class AnswerUnexpected:
    def __init__(self, app: App, answer: Callable[[Exception], Response]) -> None:
        self.app = app
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            await self.answer(exc)(scope, receive, send)
