"""Relay a stream socket across network namespaces through a unix socket on the filesystem.

A unix socket bound to a path is reachable from every network namespace that sees the path, so
two relays join a TCP port on the host's loopback to the same port inside the real node's own
network namespace (tessera.testing.realnode): on the host, ``unix:SOCK -> tcp:127.0.0.1:PORT``;
inside the namespace, ``tcp:127.0.0.1:PORT -> unix:SOCK``. Bytes are copied as they are (TLS
passes through end to end).

    python -m tessera.testing.nsrelay LISTEN CONNECT      # each tcp:HOST:PORT or unix:PATH
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _connector(spec: str) -> Callable[[], Awaitable[Streams]]:
    kind, _, rest = spec.partition(":")
    if kind == "unix":
        return lambda: asyncio.open_unix_connection(rest)
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        return lambda: asyncio.open_connection(host, int(port))
    raise SystemExit(f"nsrelay: {spec!r} is neither tcp:HOST:PORT nor unix:PATH")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: str, connect: str) -> None:
    dial = _connector(connect)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await dial()
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, w2), _pipe(r2, writer))

    kind, _, rest = listen.partition(":")
    if kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rest)
        server = await asyncio.start_unix_server(handle, rest)
    elif kind == "tcp":
        host, _, port = rest.rpartition(":")
        server = await asyncio.start_server(handle, host, int(port), reuse_address=True)
    else:
        raise SystemExit(f"nsrelay: {listen!r} is neither tcp:HOST:PORT nor unix:PATH")
    print(f"relaying {listen} -> {connect}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(serve(args[0], args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
