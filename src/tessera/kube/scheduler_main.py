"""The tessera-scheduler process: flags, leader election, health endpoint, then the loop.

    python -m tessera.kube.scheduler --kubeconfig PATH      (console script: tessera-scheduler)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from lightkube import AsyncClient, KubeConfig

from tessera.api.fair_share_flags import add_history_flags, history_from_args
from tessera.core.errors import InvalidRequest
from tessera.core.placement import DEFAULT_POLICY, POLICIES
from tessera.kube import gc_tuning, names
from tessera.kube.health import start_health_server
from tessera.kube.leader import LeaderElector, LostLeadership
from tessera.kube.namespace import ensure_namespace
from tessera.kube.parts import Options
from tessera.kube.rawapi import RawApi

log = logging.getLogger("tessera.kube")


class Loop(Protocol):
    async def run(self) -> None: ...


MakeLoop = Callable[[AsyncClient, Options, RawApi | None], Loop]
"""Builds the loop (``tessera.kube.scheduler.KubeScheduler``, which passes itself: this module
does not import it, so the loop imports the process, not both ways)."""


async def _main(args: argparse.Namespace, make: MakeLoop) -> int:
    config = KubeConfig.from_file(args.kubeconfig) if args.kubeconfig else None
    client = AsyncClient(config, field_manager=names.COMPONENT, timeout=None, http2=args.http2)
    opts = options_from_args(args)
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = start_health_server(args.health_address, args.health_port) \
        if args.health_port else None
    try:
        return await _run(args, client, config, opts, identity, stop, make)
    finally:
        if health is not None:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await health


async def _run(args: argparse.Namespace, client: AsyncClient, config: Any, opts: Options,
               identity: str, stop: asyncio.Event, make: MakeLoop) -> int:
    elector = None
    if args.leader_elect:
        # Its own connection: renewals must not queue behind the scheduler's traffic.
        lease_client = AsyncClient(config, field_manager=names.COMPONENT)
        elector = LeaderElector(lease_client, args.system_namespace, args.lease_name, identity,
                                lease_duration=args.lease_duration,
                                renew_deadline=args.lease_duration * 2 / 3,
                                retry_period=max(0.2, args.lease_duration / 7.5))
        await ensure_namespace(client, opts.system_namespace)
        acquire = asyncio.create_task(elector.acquire())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({acquire, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            acquire.cancel()
            return 0
        print(f"leader: {identity}", flush=True)
    raw = RawApi(client.config, connections=min(opts.concurrency, 32)) if args.raw_http else None
    sched = make(client, opts, raw)
    runner = asyncio.create_task(sched.run())
    waits: set[asyncio.Task[Any]] = {runner, asyncio.create_task(stop.wait())}
    keeper = asyncio.create_task(elector.keep()) if elector else None
    if keeper:
        waits.add(keeper)
    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await runner
    code = 0
    if keeper is not None:
        if keeper in done:
            exc = keeper.exception()
            log.error("%s; stopping", exc)
            code = 1 if isinstance(exc, LostLeadership) else 2
        else:
            keeper.cancel()
            await elector.release()  # type: ignore[union-attr]
    if runner in done and not runner.cancelled() and runner.exception() is not None:
        log.error("scheduler failed: %r", runner.exception())
        code = 2
    return code


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def options_from_args(args: argparse.Namespace) -> Options:
    history = history_from_args(args)  # InvalidRequest naming the flag: refused before starting
    return Options(fair_share_history=history.policy,
                   fair_share_history_for=tuple(sorted(history.overrides.items())),
                   fair_share_history_save_every=history.save_every,
                   system_namespace=args.system_namespace, concurrency=args.concurrency,
                   reservation_image=args.reservation_image, policy=args.policy,
                   reclaim=args.reclaim, min_runtime=args.min_runtime_seconds,
                   stale_gang_seconds=args.stale_gang_seconds)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-scheduler",
                                     description="tessera's GPU-sharing Kubernetes scheduler")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--system-namespace", default=names.SYSTEM_NAMESPACE,
                        help="namespace of reservation pods and the leader Lease")
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lease-name", default=names.LEASE_NAME)
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds")
    parser.add_argument("--identity", default="", help="leader election identity")
    parser.add_argument("--concurrency", type=int, default=32, help="API writes in flight")
    parser.add_argument("--reservation-image", default="registry.k8s.io/pause:3.10")
    parser.add_argument("--policy", default=None, choices=POLICIES,
                        help=f"placement policy (default: {DEFAULT_POLICY})")
    parser.add_argument("--reclaim", action=argparse.BooleanOptionalAction, default=True,
                        help="give GPUs lent over quota back to projects below their share")
    parser.add_argument("--min-runtime-seconds", type=_seconds, default=0.0, metavar="SECONDS",
                        help="a pod runs at least this long before reclaim or preemption may "
                        "evict it (a Project's own value wins)")
    parser.add_argument("--stale-gang-seconds", type=_seconds, default=60.0, metavar="SECONDS",
                        help="evict a gang whose bound members stay fewer than its minimum for "
                        "this long, so that it starts again together (0: never)")
    parser.add_argument("--http2", action=argparse.BooleanOptionalAction, default=False,
                        help="one multiplexed HTTP/2 connection to the API server")
    parser.add_argument("--raw-http", action=argparse.BooleanOptionalAction, default=True,
                        help="lean HTTP/1.1 client for bindings, ConfigMaps and reservation pods")
    parser.add_argument("--health-port", type=int, default=0,
                        help="serve GET /healthz (liveness probe) on this port; 0: off")
    parser.add_argument("--health-address", default="0.0.0.0")
    parser.add_argument("-v", "--verbose", action="store_true")
    add_history_flags(parser)
    return parser


def main(make: MakeLoop, argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        options_from_args(args)
    except InvalidRequest as exc:  # exits 2 naming the flag and the rule
        p.error(str(exc))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    gc_tuning.tune()  # collections were most of a cycle at 16,000 pods (kube/gc_tuning.py)
    return asyncio.run(_main(args, make))
