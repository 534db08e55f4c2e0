"""The embedded control plane process: ``python -m tessera.local.server`` (what ``tessera up`` runs).

It holds ``server.lock`` in the data directory for its lifetime, so two servers never share one
database, and writes ``server.json`` (pid, URL) for ``tessera down`` and the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
from pathlib import Path

from tessera.core.errors import InvalidRequest
from tessera.local.paths import DEFAULT_PORT, data_dir


def server_info(directory: Path) -> dict[str, object] | None:
    try:
        info: dict[str, object] = json.loads((directory / "server.json").read_text())
        return info
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera-server")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--simulate", action="append", default=[])
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--scheduler", choices=("cycle", "simple"), default="cycle")
    args = parser.parse_args(argv)

    import uvicorn

    from tessera.api.app import create_app
    from tessera.local.control import LocalBackend
    from tessera.local.gpus import discover
    from tessera.local.scheduler import CycleScheduler, QuotaScheduler, Scheduler

    directory = data_dir(args.data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    lock = open(directory / "server.lock", "w")  # noqa: SIM115 - held for the process lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        info = server_info(directory) or {}
        print(
            f"tessera: a server already uses {directory} (pid {info.get('pid', '?')}, "
            f"{info.get('url', '?')})",
            file=sys.stderr,
        )
        return 1

    from tessera.local.store import Store

    store = Store(directory / "tessera.db")
    simulate = list(args.simulate)
    if not simulate:
        saved = store.meta("simulate")
        if saved:
            simulate = json.loads(saved)
    try:
        machine = discover(simulate or None, seed=str(directory))
    except InvalidRequest as exc:
        print(f"tessera: --{exc}", file=sys.stderr)
        return 1
    if machine.simulated:
        store.set_meta("simulate", json.dumps(simulate or ["1xV100-16GB"]))
    store.close()

    scheduler: Scheduler = (
        CycleScheduler(args.policy) if args.scheduler == "cycle" else QuotaScheduler(args.policy)
    )
    backend = LocalBackend(
        directory, machine, scheduler, grace=args.grace, interval=args.interval
    )
    backend.ensure_admin()
    backend.start()
    url = f"http://{args.host}:{args.port}"
    info = {
        "pid": os.getpid(),
        "url": url,
        "port": args.port,
        "simulated": machine.simulated,
        "gpus": [
            {"index": g.index, "model": g.model, "uuid": g.uuid, "memory": g.memory}
            for g in machine.node.gpus
        ],
    }
    (directory / "server.json").write_text(json.dumps(info))
    kind = "SIMULATED" if machine.simulated else "NVML"
    gpus = ", ".join(f"{g.index}:{g.model}" for g in machine.node.gpus)
    print(f"tessera: serving {url} (data {directory}; {kind} GPUs: {gpus})", flush=True)

    config = uvicorn.Config(
        create_app(backend), host=args.host, port=args.port, log_level="warning",
        access_log=False, lifespan="off",
    )
    server = uvicorn.Server(config)

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    # uvicorn re-raises SIGTERM/SIGINT once it has shut down; exit through ``finally`` then.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    try:
        server.run()
    finally:
        flag = directory / "stop-workloads"
        if flag.exists():
            stopped = backend.stop_all_workloads()
            flag.unlink(missing_ok=True)
            print(f"tessera: stopped {stopped} workload(s)", flush=True)
        backend.stop()
        with contextlib.suppress(OSError):
            info_now = server_info(directory)
            if info_now and info_now.get("pid") == os.getpid():
                (directory / "server.json").unlink()
        print("tessera: server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
