"""The REST API backed by a Kubernetes cluster: ``python -m tessera.kube.api_server`` (what
``tessera up --kubernetes`` runs). Same routes, same documents and the same CLI as embedded mode.

Cluster access: ``--kubeconfig PATH`` (and ``--context``), else lightkube's defaults
(``$KUBECONFIG``, ``~/.kube/config``, or the in-cluster ServiceAccount). The data directory
holds only the API's clients and token hashes, ``server.json`` and ``server.lock``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
from pathlib import Path

from tessera.kube import workload_docs as wd
from tessera.local.paths import DEFAULT_PORT, data_dir


def kube_data_dir(given: str | None) -> Path:
    """Default: ``<tessera data dir>/kubernetes``, so it never shares a lock with embedded mode."""
    return data_dir(given) if given else data_dir(None) / "kubernetes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera-api-kubernetes")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--context", default=None)
    parser.add_argument("--image", default=wd.DEFAULT_IMAGE,
                        help="container image of workloads submitted without -i")
    parser.add_argument("--reconcile-interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")

    import uvicorn
    from lightkube import Client, ConfigError, KubeConfig
    from lightkube.resources.core_v1 import Namespace

    from tessera.api.app import create_app
    from tessera.kube.api_backend import KubeBackend
    from tessera.local.server import server_info

    directory = kube_data_dir(args.data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    lock = open(directory / "server.lock", "w")  # noqa: SIM115 - held for the process lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        info = server_info(directory) or {}
        print(f"tessera: a server already uses {directory} (pid {info.get('pid', '?')}, "
              f"{info.get('url', '?')})", file=sys.stderr)
        return 1
    try:
        if args.kubeconfig:
            config = KubeConfig.from_file(args.kubeconfig).get(context_name=args.context)
        else:
            config = KubeConfig.from_env().get(context_name=args.context)
        client = Client(config, field_manager="tessera-api")
        client.get(Namespace, "default")
    except (ConfigError, OSError) as exc:
        print(f"tessera: --kubeconfig: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"tessera: cannot reach the Kubernetes API server: {exc}", file=sys.stderr)
        return 1

    backend = KubeBackend(client, directory, image=args.image)
    backend.ensure_admin()
    backend.start(args.reconcile_interval)
    url = f"http://{args.host}:{args.port}"
    server = config.cluster.server if config is not None else "?"
    (directory / "server.json").write_text(json.dumps({
        "pid": os.getpid(), "url": url, "port": args.port, "backend": "kubernetes",
        "apiServer": server, "simulated": False, "gpus": []}))
    print(f"tessera: serving {url} (Kubernetes backend, API server {server}; data {directory})",
          flush=True)
    uv = uvicorn.Server(uvicorn.Config(create_app(backend), host=args.host, port=args.port,
                                       log_level="warning", access_log=False, lifespan="off"))

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    try:
        uv.run()
    finally:
        backend.stop()
        with contextlib.suppress(OSError):
            info_now = server_info(directory)
            if info_now and info_now.get("pid") == os.getpid():
                (directory / "server.json").unlink()
        print("tessera: server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
