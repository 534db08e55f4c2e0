"""The ``tessera-node`` command line.

    tessera-node run --node-name NODE [--kubeconfig P] [--on-escape warn|kill] ...   the agent
    tessera-node local --shares-dir DIR [--on-escape warn|kill] ...   one machine, no Kubernetes
    tessera-node inventory [--json]      what NVML reports (exit 1 with one line without NVML)
    tessera-node usage [--json]          memory, utilisation and processes per GPU, now
    tessera-node mig [show|reconcile|create GPU PROFILE START|remove GPU GI] [--journal P] [--json]
                                         MIG mode, profiles and partitions; make or remove one
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import Any

from tessera import decoding
from tessera.node.nvml import Nvml, NvmlUnavailable

_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")


def _headroom_option(text: str | None) -> int | None:
    """``--headroom``: a Kubernetes quantity (``512Mi``); None: measure, else the default."""
    if text is None:
        return None
    from tessera.core.errors import InvalidRequest
    from tessera.core.units import parse_memory

    try:
        value = parse_memory(text, "--headroom")
    except InvalidRequest as exc:
        raise SystemExit(f"tessera-node: {exc}") from None
    if value <= 0:
        raise SystemExit(f"tessera-node: --headroom: must be more than 0 bytes (got {text!r}); "
                         "the driver always keeps some memory")
    return value


def _inventory(args: argparse.Namespace) -> int:
    from tessera.node.headroom import headroom_for

    configured = _headroom_option(args.headroom)
    try:
        with Nvml() as nvml:
            inv = nvml.inventory()
            room = headroom_for(inv, nvml, configured, measure=not args.no_measure_headroom)
    except NvmlUnavailable as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = dataclasses.asdict(inv)
        for g in doc["gpus"]:
            h = room[g["index"]]
            g["headroom"], g["headroom_source"] = h.bytes, h.source
        print(json.dumps(doc))
        return 0
    print(f"driver {inv.driver_version}, CUDA {inv.cuda_version}")
    for g in inv.gpus:
        mig = " MIG" if g.mig_enabled else ""
        h = room[g.index]
        print(f"{g.index}  {g.uuid}  {g.name}  {g.memory_total // 2**20} MiB  {g.model}{mig}  "
              f"headroom {h.bytes // 2**20} MiB ({h.source})")
    for link in inv.links:
        print(f"GPU{link.a}-GPU{link.b}: {link.ancestor}{' nvlink' if link.nvlink else ''}")
    return 0


def _usage(args: argparse.Namespace) -> int:
    try:
        with Nvml() as nvml:
            usage = nvml.usage()
    except NvmlUnavailable as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([dataclasses.asdict(u) for u in usage]))
        return 0
    for u in usage:
        print(f"{u.index}  {u.uuid}  {u.memory_used}/{u.memory_total} B  util {u.utilization}%")
        for p in u.processes:
            print(f"    pid {p.pid}  {p.used_bytes} B  sm {p.sm_util}%")
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os
    import signal
    from pathlib import Path

    from tessera.node.agent import AgentOptions, KubeAgent, load_plugin, make_client
    from tessera.node.escapes import check_on_escape
    from tessera.node.metrics import registry_for
    from tessera.node.report import advertised_url, start_server, usage_document

    try:
        on_escape = check_on_escape(args.on_escape)
    except ValueError as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 2
    node = args.node_name or os.environ.get("NODE_NAME", "")
    if not node:
        print("tessera-node: --node-name: required (or NODE_NAME from the downward API)",
              file=sys.stderr)
        return 2
    if args.sync_interval <= 0:
        print(f"tessera-node: --sync-interval: must be > 0 (got {args.sync_interval})",
              file=sys.stderr)
        return 2
    if args.advertise_url and not _URL.match(args.advertise_url):
        print(f"tessera-node: --advertise-url: must be http(s)://HOST:PORT, optionally with a path "
              f"(got {args.advertise_url!r})", file=sys.stderr)
        return 2
    for flag in ("dra_registration_dir", "dra_plugin_dir", "cdi_dir"):
        if not os.path.isabs(getattr(args, flag)):
            print(f"tessera-node: --{flag.replace('_', '-')}: must be an absolute path "
                  f"(got {getattr(args, flag)!r})", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    opts = AgentOptions(
        node_name=node, kubeconfig=args.kubeconfig,
        pod_resources_socket=Path(args.pod_resources_socket),
        library_dir=Path(args.library_dir), library_mount=args.library_mount,
        containers_dir=Path(args.containers_dir),
        containers_host_dir=Path(args.containers_host_dir or args.containers_dir),
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port, on_escape=on_escape, sync_interval=args.sync_interval,
        headroom_bytes=_headroom_option(args.headroom),
        measure_headroom=not args.no_measure_headroom,
        loans_dir=Path(args.loans_dir) if args.loans_dir else None,
        plugin_options={"loans-dir": args.loans_dir} if args.loans_dir else {})
    nvml: Nvml | None = None
    error = ""
    try:
        nvml = Nvml().open()
    except NvmlUnavailable as exc:
        error = str(exc)

    decoding.warm()  # before the kubelet plugin's threads and the loop decode (tessera.decoding)

    async def main_async() -> None:
        client = make_client(opts.kubeconfig)
        agent = KubeAgent(opts, client, nvml, error, plugin=load_plugin(opts.plugin_options))
        dra = _start_dra_plugin(args, opts, agent)
        registry = registry_for(agent.collector)
        server, _thread = start_server(
            opts.metrics_port, opts.metrics_address, registry,
            lambda: usage_document(node, agent.collector.usage, agent.ready, agent.reason,
                                   extra=agent.collector.more_share_fields()))
        opts.advertise_url = advertised_url(args.advertise_url, opts.metrics_address,
                                            server.server_port, os.environ.get("POD_IP", ""))
        print(f"tessera-node {node}: metrics on http://{opts.metrics_address}:"
              f"{server.server_port}/metrics, usage on /usage"
              f"{f' (published as {opts.advertise_url})' if opts.advertise_url else ''}",
              flush=True)
        task = asyncio.create_task(agent.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            server.shutdown()
            if dra is not None:
                dra.stop()

    asyncio.run(main_async())
    if nvml is not None:
        nvml.close()
    return 0


def _start_dra_plugin(args: argparse.Namespace, opts: Any, agent: Any) -> Any:
    """The kubelet's DRA plugin (tessera.node.draplugin.service), or None when it is turned off,
    the API server does not serve DRA, or its sockets cannot be made; in those cases the agent
    publishes no ResourceSlice (nothing here would prepare a claim allocated on this node)."""
    import logging
    from pathlib import Path

    from tessera.node.draplugin.service import DraPaths, DraService, dra_served, sync_client

    log = logging.getLogger("tessera.node.dra")
    if args.no_dra_plugin:
        opts.dra_slices = False
        log.info("DRA kubelet plugin off (--no-dra-plugin): no ResourceSlice is published")
        return None
    paths = DraPaths(Path(args.dra_registration_dir), Path(args.dra_plugin_dir),
                     Path(args.cdi_dir))
    client = sync_client(opts.kubeconfig)
    served, why = dra_served(client)
    if not served:
        opts.dra_slices = False
        log.info("DRA kubelet plugin not started: %s", why)
        return None
    service = DraService(paths, client, lambda: agent.plugin_config(paths.cdi_dir))
    try:
        service.start()
    except (OSError, RuntimeError) as exc:
        opts.dra_slices = False
        log.warning("DRA kubelet plugin not started (no ResourceSlice is published): sockets %s, "
                    "%s: %s", paths.registration_socket, paths.plugin_socket, exc)
        return None
    opts.dra_registered = service.registered
    return service


def _local(args: argparse.Namespace) -> int:
    import logging
    import signal
    import socket
    import threading
    from pathlib import Path

    from tessera.node.agent import load_plugin
    from tessera.node.escapes import check_on_escape
    from tessera.node.local_agent import LocalAgent
    from tessera.node.metrics import registry_for
    from tessera.node.report import start_server, usage_document

    try:
        on_escape = check_on_escape(args.on_escape)
    except ValueError as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    nvml: Nvml | None = None
    try:
        nvml = Nvml().open()
    except NvmlUnavailable as exc:
        print(f"tessera-node: {exc}; not ready for GPU shares (metrics are still served)",
              flush=True)
    shares_dir = Path(args.shares_dir)
    shares_dir.mkdir(parents=True, exist_ok=True)
    agent = LocalAgent(args.node_name or socket.gethostname(), nvml, shares_dir,
                       on_escape=on_escape, sync_interval=args.sync_interval,
                       plugin=load_plugin({"loans-dir": args.loans_dir}))
    collector = agent.observer.collector
    name = args.node_name or socket.gethostname()
    server, _thread = start_server(
        args.metrics_port, args.metrics_address, registry_for(collector),
        lambda: usage_document(name, collector.usage, collector.ready,
                               extra=collector.more_share_fields()))
    print(f"tessera-node (local): metrics on http://{args.metrics_address}:"
          f"{server.server_port}/metrics, usage on /usage", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    agent.run(stop)
    server.shutdown()
    if nvml is not None:
        nvml.close()
    return 0


def _mig(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tessera.node.mig import MigError, MigNode, state_doc

    try:
        with Nvml() as nvml:
            node = MigNode(nvml, Path(args.journal))
            gpus = {str(g.index): g.uuid for g in nvml.inventory().gpus}
            gpu = gpus.get(args.gpu or "", args.gpu or "")
            if args.action == "reconcile":
                for line in node.reconcile():
                    print(line)
                return 0
            if args.action == "create":
                if args.profile is None or args.start is None:
                    print("tessera-node: mig create needs GPU PROFILE START", file=sys.stderr)
                    return 2
                p = node.create(gpu, args.profile, int(args.start), owner=args.owner)
                print(json.dumps(dataclasses.asdict(p)) if args.json else p.uuid)
                return 0
            elif args.action == "remove":
                if args.profile is None:
                    print("tessera-node: mig remove needs GPU GI (the GPU instance id)",
                          file=sys.stderr)
                    return 2
                node.destroy(gpu, int(args.profile))
                return 0
            states = node.state()
    except (NvmlUnavailable, MigError, ValueError) as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(state_doc(states)))
        return 0
    for s in states:
        mode = {None: "no MIG", True: "MIG mode", False: "MIG off"}[s.mig_enabled]
        print(f"{s.index}  {s.uuid}  {s.model}  {mode}"
              + (f"  profiles {', '.join(p.name for p in s.profiles)}" if s.profiles else ""))
        for part in s.partitions:
            who = part.owner or ("idle" if part.managed else "not made by tessera")
            print(f"   {part.profile} at slot {part.start} (GPU instance {part.gi})  "
                  f"{part.uuid or 'no compute instance'}  {who}")
    return 0


def _headroom_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--headroom", default=None, metavar="QUANTITY",
                   help="GPU memory kept back per device for the driver and CUDA contexts, e.g. "
                        "512Mi (default: measured by creating a context, else the model's default)")
    p.add_argument("--no-measure-headroom", action="store_true",
                   help="do not create a CUDA context to measure the headroom")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera-node", description="tessera's node agent")
    sub = p.add_subparsers(dest="command", required=True)
    inv = sub.add_parser("inventory", help="print the GPU inventory NVML reports")
    inv.add_argument("--json", action="store_true")
    _headroom_arguments(inv)
    inv.set_defaults(func=_inventory)
    use = sub.add_parser("usage", help="print memory, utilisation and processes per GPU")
    use.add_argument("--json", action="store_true")
    use.set_defaults(func=_usage)
    mig = sub.add_parser("mig", help="MIG mode, profiles and partitions per GPU; create or "
                                     "remove a partition (never changes MIG mode)")
    mig.add_argument("action", nargs="?", default="show",
                     choices=("show", "reconcile", "create", "remove"))
    mig.add_argument("gpu", nargs="?", help="GPU index or UUID (create, remove)")
    mig.add_argument("profile", nargs="?", help="create: the profile (3g.20gb); remove: the "
                                                "GPU instance id")
    mig.add_argument("start", nargs="?", help="create: the memory slot it starts at")
    mig.add_argument("--owner", default=None, help="create: the workload that holds it")
    mig.add_argument("--journal", default="/var/lib/tessera/mig-journal.json",
                     help="the record of the partitions tessera made (written before and after "
                          "each create and remove)")
    mig.add_argument("--json", action="store_true")
    mig.set_defaults(func=_mig)
    run = sub.add_parser("run", help="run the node agent (Kubernetes)")
    run.add_argument("--node-name", default="", help="this node (default: $NODE_NAME)")
    run.add_argument("--kubeconfig", default=None, help="default: in-cluster ServiceAccount")
    run.add_argument("--pod-resources-socket",
                     default="/var/lib/kubelet/pod-resources/kubelet.sock")
    run.add_argument("--library-dir", default="/var/lib/tessera/isolation",
                     help="host directory the isolation library is installed into")
    run.add_argument("--library-mount", default="/usr/local/tessera",
                     help="where share containers see --library-dir")
    run.add_argument("--containers-dir", default="/var/lib/tessera/containers",
                     help="directory the per-container isolation files are written to")
    run.add_argument("--containers-host-dir", default=None,
                     help="that directory's path on the host, as pods' hostPath volumes name it "
                          "(default: --containers-dir)")
    run.add_argument("--metrics-address", default="0.0.0.0")
    run.add_argument("--metrics-port", type=int, default=9400, help="0: any free port")
    run.add_argument("--advertise-url", default="",
                     help="where the API server reaches this agent's /usage, published on the "
                          "Node as tessera.io/node-agent-url (default: http://METRICS-ADDRESS:PORT, "
                          "or http://$POD_IP:PORT when listening on every address)")
    run.add_argument("--on-escape", default="warn", help="warn | kill")
    run.add_argument("--sync-interval", type=float, default=1.0)
    _headroom_arguments(run)
    run.add_argument("--loans-dir", default="/var/lib/tessera/loans",
                     help="the node's loans ledger directory (dynamic fractions); share "
                          "containers see it at /run/tessera-loans; '' turns loans off")
    run.add_argument("--no-dra-plugin", action="store_true",
                     help="do not serve the kubelet's DRA plugin for gpu.tessera.io (and publish "
                          "no ResourceSlice); default: served when the API server serves "
                          "resource.k8s.io/v1")
    run.add_argument("--dra-registration-dir", default="/var/lib/kubelet/plugins_registry",
                     help="the kubelet's plugin registration directory (gpu.tessera.io-reg.sock)")
    run.add_argument("--dra-plugin-dir", default="/var/lib/kubelet/plugins/gpu.tessera.io",
                     help="directory of the plugin's socket (dra.sock)")
    run.add_argument("--cdi-dir", default="/var/run/cdi",
                     help="where the container runtime reads CDI specs (one per prepared claim)")
    run.set_defaults(func=_run)
    loc = sub.add_parser("local", help="run the node agent over shares in a directory "
                                       "(one machine, no Kubernetes)")
    loc.add_argument("--shares-dir", required=True)
    loc.add_argument("--node-name", default="")
    loc.add_argument("--metrics-address", default="127.0.0.1")
    loc.add_argument("--metrics-port", type=int, default=9400, help="0: any free port")
    loc.add_argument("--on-escape", default="warn", help="warn | kill")
    loc.add_argument("--sync-interval", type=float, default=1.0)
    loc.add_argument("--loans-dir", default="/var/lib/tessera/loans",
                     help="the loans ledger directory the shares' processes write")
    loc.set_defaults(func=_local)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))
