"""A lean HTTP/1.1 client for the scheduler's hot writes (bindings, ConfigMaps, reservation pods).

Profiling the 8,000-pod benchmark showed most of the scheduler's CPU in the general-purpose
HTTP stack (httpx, httpcore, anyio, h2: several milliseconds per request on this machine). The
writes on the binding path are plain JSON POSTs, so they go through a small pool of persistent
TLS connections on asyncio streams instead; watches and everything else stay on lightkube.
Credentials and CA come from the same kubeconfig, through lightkube's own helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User

_encode = msgspec.json.Encoder().encode


class KubeHTTPError(Exception):
    """The API server answered with an error status."""

    def __init__(self, code: int, message: str, reason: str = "") -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"{code} {reason}: {message}".strip())


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class RawApi:
    def __init__(self, config: SingleConfig, connections: int = 16) -> None:
        self.ctx: ssl.SSLContext | None = None
        url = urlsplit(config.cluster.server)
        self.https = url.scheme == "https"
        if self.https:
            self.ctx = verify_cluster(config.cluster, config.user or User(), config.abs_file)
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.https else 80)
        self.base = url.path.rstrip("/")
        self.netloc = url.netloc
        self.user = config.user
        self.abs_file = config.abs_file
        self._token: str | None = None
        self._token_read = 0.0
        self.pool: asyncio.LifoQueue[_Conn | None] = asyncio.LifoQueue()
        for _ in range(connections):
            self.pool.put_nowait(None)

    def _auth(self) -> str:
        user = self.user
        if user is None:
            return ""
        if user.token:
            return f"Authorization: Bearer {user.token}\r\n"
        if user.token_file:
            if self._token is None or time.monotonic() - self._token_read > 60:
                self._token = Path(str(self.abs_file(user.token_file))).read_text().strip()
                self._token_read = time.monotonic()
            return f"Authorization: Bearer {self._token}\r\n"
        return ""

    async def _open(self) -> _Conn:
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.ctx, server_hostname=self.host if self.https else None,
            limit=2**22)
        return _Conn(reader, writer)

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/json", decode: bool = True) -> Any:
        """Send one request; return the decoded JSON reply, or raise KubeHTTPError. ``body``:
        an object to encode as JSON, or bytes already encoded. ``decode=False``: a successful
        reply is read but not decoded (None is returned)."""
        data = await self.request_bytes(method, path, body, content_type)
        return msgspec.json.decode(data) if data and decode else None

    async def request_bytes(self, method: str, path: str, body: Any = None,
                            content_type: str = "application/json") -> bytes:
        """As ``request``, returning a successful reply's body undecoded (for a caller that
        decodes only the fields it reads)."""
        payload = b"" if body is None else body if isinstance(body, bytes) else _encode(body)
        head = (f"{method} {self.base}{path} HTTP/1.1\r\nHost: {self.netloc}\r\n"
                f"User-Agent: tessera-scheduler\r\nAccept: application/json\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
                f"{self._auth()}\r\n").encode()
        conn = await self.pool.get()
        try:
            if conn is None:
                conn = await self._open()
            try:
                status, data, keep = await self._exchange(conn, head + payload)
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                # A kept-alive connection the server closed: once more on a fresh one.
                conn.close()
                conn = await self._open()
                status, data, keep = await self._exchange(conn, head + payload)
            if not keep:
                conn.close()
                conn = None
        except BaseException:
            if conn is not None:
                conn.close()
            self.pool.put_nowait(None)
            raise
        self.pool.put_nowait(conn)
        if status >= 400:
            try:
                reply = msgspec.json.decode(data) if data else None
            except msgspec.DecodeError:
                reply = None
            message = reply.get("message", "") if isinstance(reply, dict) else str(data[:200])
            reason = reply.get("reason", "") if isinstance(reply, dict) else ""
            raise KubeHTTPError(status, message, reason)
        return data

    async def _exchange(self, conn: _Conn, request: bytes) -> tuple[int, bytes, bool]:
        conn.writer.write(request)
        await conn.writer.drain()
        reader = conn.reader
        status, length, chunked = await _read_head(reader)
        keep = status > 0
        status = abs(status)
        if chunked:
            chunks = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(chunks)
        elif length >= 0:
            data = await reader.readexactly(length)
        else:
            data = await reader.read()
            keep = False
        return status, data, keep

    async def stream_lines(self, path: str) -> AsyncIterator[bytes]:
        """GET ``path`` (a watch) on a connection of its own and yield each line of the reply
        body as it arrives (a watch sends one JSON event per line). Raises KubeHTTPError on an
        error status; ends when the server ends the reply."""
        conn = await self._open()
        try:
            head = (f"GET {self.base}{path} HTTP/1.1\r\nHost: {self.netloc}\r\n"
                    f"User-Agent: tessera\r\nAccept: application/json\r\n"
                    f"{self._auth()}\r\n").encode()
            conn.writer.write(head)
            await conn.writer.drain()
            reader = conn.reader
            status, length, chunked = await _read_head(reader)
            status = abs(status)
            if status >= 400 or not chunked:
                data = await reader.readexactly(length) if length >= 0 else b""
                reply = msgspec.json.decode(data) if data else None
                message = reply.get("message", "") if isinstance(reply, dict) else ""
                raise KubeHTTPError(status, message, reply.get("reason", "")
                                    if isinstance(reply, dict) else "")
            buf = b""
            while True:
                head_line = await reader.readline()
                if not head_line:  # cut without the last chunk: not a clean end
                    raise ConnectionResetError("watch cut by the API server")
                size = int(head_line.split(b";")[0].strip(), 16)
                if size == 0:
                    return
                buf += await reader.readexactly(size)
                await reader.readexactly(2)
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line:
                        yield line
        finally:
            conn.close()

    async def close(self) -> None:
        while not self.pool.empty():
            conn = self.pool.get_nowait()
            if conn is not None:
                conn.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, int, bool]:
    """Status line and headers of a reply: (status, Content-Length or -1, chunked). The status
    is negated when the server says it closes the connection after this reply."""
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("connection closed by the API server")
    status = int(line.split(b" ", 2)[1])
    length = -1
    chunked = False
    close = False
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(value.strip())
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif lname == b"connection" and b"close" in value.lower():
            close = True
    return (-status if close else status), length, chunked


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
