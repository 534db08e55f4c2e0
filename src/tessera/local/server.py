"""The embedded control plane process: ``python -m tessera.local.server`` (what ``tessera up`` runs).

It holds ``server.lock`` in the data directory for its lifetime, so two servers never share one
database, and writes ``server.json`` (pid, URL) for ``tessera down`` and the CLI.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys

from tessera.api.fair_share_flags import add_history_flags, history_from_args
from tessera.api.serving import lock_data_dir, serve
from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_serves_shares
from tessera.settings import DEFAULT_PORT, data_dir


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    parser.add_argument("--insecure", action="store_true",
                        help="allow a --host other than the loopback (plain HTTP: tokens and "
                        "workloads' environment cross the network unencrypted)")
    parser.add_argument("--mig-serves-shares", action="store_true", default=None,
                        help="a share no shared GPU can hold is served by the smallest MIG "
                        "profile that holds it (env TESSERA_MIG_SERVES_SHARES; docs/mig.md)")
    add_history_flags(parser)
    args = parser.parse_args(argv)
    try:
        history = history_from_args(args)
    except InvalidRequest as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return 2
    try:
        env = os.environ.get("TESSERA_MIG_SERVES_SHARES")
        serves = bool(args.mig_serves_shares) or (
            env is not None and parse_serves_shares(env, "TESSERA_MIG_SERVES_SHARES"))
    except InvalidRequest as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        if not args.insecure:
            print(f"tessera: --host {args.host} would serve plain HTTP (no TLS) beyond this "
                  "machine: bearer tokens and environment values could be read on the network. "
                  "Put a TLS proxy in front and keep --host 127.0.0.1, or add --insecure to "
                  "serve it anyway.", file=sys.stderr)
            return 2
        print(f"tessera: WARNING: serving plain HTTP on {args.host} (--insecure): tokens and "
              "environment values cross the network unencrypted", file=sys.stderr, flush=True)


    from tessera.local.control import LocalBackend
    from tessera.local.gpus import discover
    from tessera.local.scheduling import LocalCycle

    directory = data_dir(args.data_dir)
    lock = lock_data_dir(directory)
    if lock is None:
        return 1

    from tessera.local.store import Store
    from tessera.local.store_check import StoreLost, check_store
    from tessera.local.store_schema import StoreTooNew

    try:
        warning = check_store(directory)
    except StoreLost as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return 1
    if warning:
        print(f"tessera: {warning}", file=sys.stderr, flush=True)
    try:
        store = Store(directory / "tessera.db")  # an earlier release's tables are migrated
    except StoreTooNew as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return 1
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

    from tessera.local.accounting import install as install_accounting

    install_accounting(directory / "tessera.db")  # GPU-hours from every binding (triggers)

    from tessera.local.containers import detect

    runtime, runtime_note = detect(args.runtime)
    cycle = LocalCycle(args.policy, directory / "tessera.db", history, directory / "tessera.db")
    backend = LocalBackend(
        directory, machine, args.policy, grace=args.grace, interval=args.interval,
        runtime=runtime, runtime_note=runtime_note, mig_serves_shares=serves,
        scheduler=cycle,
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
        "migGpus": [{"index": g.index, "model": g.model, "uuid": g.uuid} for g in machine.mig],
    }
    kind = "SIMULATED" if machine.simulated else "NVML"
    gpus = ", ".join(f"{g.index}:{g.model}" for g in machine.node.gpus) or "none whole"
    if machine.mig:  # NVML indexes: served by MIG partitions (docs/mig.md), not shared
        gpus += "; in MIG mode: " + ", ".join(f"{g.index}:{g.model}" for g in machine.mig)

    def stop_workloads_if_asked() -> None:
        flag = directory / "stop-workloads"
        if flag.exists():
            stopped = backend.stop_all_workloads()
            flag.unlink(missing_ok=True)
            print(f"tessera: stopped {stopped} workload(s)", flush=True)

    try:
        return serve(backend, directory, args.host, args.port, info,
                     f"data {directory}; {kind} GPUs: {gpus}", stop_workloads_if_asked)
    finally:  # the control loop has stopped: write the usage history (docs/scheduling.md)
        cycle.close()

if __name__ == "__main__":
    sys.exit(main())
