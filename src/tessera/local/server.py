"""The embedded control plane process: ``python -m tessera.local.server`` (what ``tessera up`` runs).

It holds ``server.lock`` in the data directory for its lifetime, so two servers never share one
database, and writes ``server.json`` (pid, URL) for ``tessera down`` and the CLI.
"""

from __future__ import annotations

import argparse
import json
import sys

from tessera.api.serving import lock_data_dir, serve
from tessera.core.errors import InvalidRequest
from tessera.settings import DEFAULT_PORT, data_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera-server")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--simulate", action="append", default=[])
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--policy", default="fgd")
    parser.add_argument("--runtime", choices=("auto", "podman", "docker", "none"), default="auto",
                        help="container runtime for images with no command")
    args = parser.parse_args(argv)


    from tessera.local.control import LocalBackend
    from tessera.local.gpus import discover

    directory = data_dir(args.data_dir)
    lock = lock_data_dir(directory)
    if lock is None:
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

    from tessera.local.containers import detect

    runtime, runtime_note = detect(args.runtime)
    backend = LocalBackend(
        directory, machine, args.policy, grace=args.grace, interval=args.interval,
        runtime=runtime, runtime_note=runtime_note,
    )
    backend.ensure_admin()
    backend.start()
    info: dict[str, object] = {
        "simulated": machine.simulated,
        "runtime": runtime.name if runtime else None,
        "gpus": [
            {"index": g.index, "model": g.model, "uuid": g.uuid, "memory": g.memory}
            for g in machine.node.gpus
        ],
    }
    kind = "SIMULATED" if machine.simulated else "NVML"
    gpus = ", ".join(f"{g.index}:{g.model}" for g in machine.node.gpus)

    def stop_workloads_if_asked() -> None:
        flag = directory / "stop-workloads"
        if flag.exists():
            stopped = backend.stop_all_workloads()
            flag.unlink(missing_ok=True)
            print(f"tessera: stopped {stopped} workload(s)", flush=True)

    return serve(backend, directory, args.host, args.port, info,
                 f"data {directory}; {kind} GPUs: {gpus}", stop_workloads_if_asked)

if __name__ == "__main__":
    sys.exit(main())
