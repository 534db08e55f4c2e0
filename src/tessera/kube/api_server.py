"""The REST API backed by a Kubernetes cluster: ``python -m tessera.kube.api_server`` (what
``tessera up --kubernetes`` runs). Same routes, same documents and the same CLI as embedded mode.

Cluster access: ``--kubeconfig PATH`` (and ``--context``), else lightkube's defaults
(``$KUBECONFIG``, ``~/.kube/config``, or the in-cluster ServiceAccount). The data directory
holds only the API's clients and token hashes, ``server.json`` and ``server.lock``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tessera.kube import workload_docs as wd
from tessera.settings import DEFAULT_PORT, data_dir


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

    from lightkube import Client, ConfigError, KubeConfig
    from lightkube.resources.core_v1 import Namespace

    from tessera.api.serving import lock_data_dir, serve
    from tessera.kube.api_backend import KubeBackend
    from tessera.kube.autoscaling import KubeAutoscaler

    directory = kube_data_dir(args.data_dir)
    lock = lock_data_dir(directory)
    if lock is None:
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
    KubeAutoscaler(client).start()  # inference that scales (tessera.kube.autoscaling)
    server = config.cluster.server if config is not None else "?"
    info: dict[str, object] = {"backend": "kubernetes", "apiServer": server, "simulated": False,
                               "gpus": []}
    return serve(backend, directory, args.host, args.port, info,
                 f"Kubernetes backend, API server {server}; data {directory}")

if __name__ == "__main__":
    sys.exit(main())
