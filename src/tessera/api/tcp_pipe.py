"""Copying a proxied TCP connection (one direction, or both with :func:`relay`): the proxies in front of a workload's
port (embedded mode's inference and external URLs, tessera.local; a scaling replica's proxy on
Kubernetes, tessera.kube.replica_proxy) share it."""

from __future__ import annotations

import contextlib
import socket
import threading


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then shut both down."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def relay(conn: socket.socket, upstream: socket.socket) -> None:
    """Copy both directions between a client's ``conn`` and the ``upstream`` it was connected
    to, until both ends are done (the caller closes both)."""
    upstream.settimeout(None)
    back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
    back.start()
    pipe(conn, upstream)
    back.join()
