"""Running the REST API over a backend as one process: the same life cycle for every backend.

The data directory holds ``server.lock`` (flock, held for the process lifetime, so two servers
never share it) and ``server.json`` (pid, URL and what the backend wants the CLI to know),
removed on the way out if it is still this process's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tessera.api.datadir import DataDirUnsafe, check_data_dir


def server_info(directory: Path) -> dict[str, object] | None:
    try:
        info: dict[str, object] = json.loads((directory / "server.json").read_text())
        return info
    except (OSError, ValueError):
        return None


def lock_data_dir(directory: Path) -> IO[str] | None:
    """Hold ``server.lock``; None (having said who holds it, or why the directory is unsafe)
    when another server does or the directory is not this user's own (tessera.api.datadir)."""
    try:
        check_data_dir(directory)
    except DataDirUnsafe as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return None
    lock = open(directory / "server.lock", "w")  # noqa: SIM115 - held for the process lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        info = server_info(directory) or {}
        print(f"tessera: a server already uses {directory} (pid {info.get('pid', '?')}, "
              f"{info.get('url', '?')})", file=sys.stderr)
        return None
    return lock


def serve(
    backend: Any,
    directory: Path,
    host: str,
    port: int,
    info: dict[str, object],
    banner: str,
    before_stop: Callable[[], None] | None = None,
) -> int:
    """Serve ``backend`` on host:port until SIGTERM/SIGINT, then stop it and clean up."""
    import uvicorn

    from tessera.api.app import create_app

    url = f"http://{host}:{port}"
    (directory / "server.json").write_text(
        json.dumps({"pid": os.getpid(), "url": url, "port": port, **info})
    )
    print(f"tessera: serving {url} ({banner})", flush=True)
    server = uvicorn.Server(uvicorn.Config(
        create_app(backend), host=host, port=port, log_level="warning",
        access_log=False, lifespan="off",
    ))

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    # uvicorn re-raises SIGTERM/SIGINT once it has shut down; exit through ``finally`` then.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    try:
        server.run()
    finally:
        if before_stop is not None:
            before_stop()
        backend.stop()
        with contextlib.suppress(OSError):
            info_now = server_info(directory)
            if info_now and info_now.get("pid") == os.getpid():
                (directory / "server.json").unlink()
        print("tessera: server stopped", flush=True)
    return 0
