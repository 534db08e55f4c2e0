"""``python -m tessera.kube.admission`` / ``tessera-webhook``: serve the admission webhook."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from tessera.core.podgroups import MAX_GID, valid_gid
from tessera.kube.admission.mig_resources import MODES
from tessera.kube.admission.policy import WebhookConfig


def _gid(text: str) -> int:
    gid = valid_gid(int(text)) if text.isascii() and text.isdigit() else None
    if gid is None:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a group id, 0 to {MAX_GID}")
    return gid


def parser() -> argparse.ArgumentParser:
    d = WebhookConfig()
    p = argparse.ArgumentParser(prog="tessera-webhook", description=__doc__)
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster service account)")
    p.add_argument("--cert", required=True, help="TLS certificate (PEM)")
    p.add_argument("--key", required=True, help="TLS private key (PEM)")
    p.add_argument("--client-ca", metavar="PEM",
                   help="accept reviews only from callers with a client certificate signed by "
                        "this CA (the API server's, set in its AdmissionConfiguration; "
                        "docs/admission.md); probes then need --probe-port")
    p.add_argument("--probe-port", type=int, default=None,
                   help="also serve /healthz, /readyz and /metrics over plain HTTP on this port")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443, help="0 picks a free port")
    p.add_argument("--scheduler-name", default=d.scheduler_name)
    p.add_argument("--gpu-compute-mode", choices=("off", "fair", "strict"), default=d.compute_mode,
                   help="cluster default compute-share mode (docs/compute-share.md)")
    p.add_argument("--scheduler-user", default=d.scheduler_user,
                   help="the scheduler's username; the only one that may change tessera's "
                        "annotations on a pod")
    p.add_argument("--node-user", default=d.node_user,
                   help="tessera-node's username; it may only write a made MIG partition's "
                        "UUID into that pod's ConfigMap")
    p.add_argument("--library-host-dir", default=d.library_host_dir)
    p.add_argument("--library-mount", default=d.library_mount)
    p.add_argument("--preload-host-file", default=d.preload_host_file)
    p.add_argument("--containers-host-dir", default=d.containers_host_dir,
                   help="where tessera-node writes each share container's isolation config")
    p.add_argument("--loans-host-dir", default=d.loans_host_dir,
                   help="the node's loans ledger directory (tessera-node --loans-dir)")
    p.add_argument("--region-group", type=_gid, default=d.region_group, metavar="GID",
                   help="supplemental group given to a share pod that states none (fsGroup, "
                        "supplementalGroups, runAsGroup); its region file is shared with it "
                        f"(default {d.region_group})")
    p.add_argument("--rewrite-to-claims", action="store_true",
                   help="rewrite GPU requests written the old way (tessera/Run:ai annotations, "
                        "aliyun.com/gpu-mem, nvidia.com/gpu) into a ResourceClaim of "
                        "gpu.tessera.io from a ResourceClaimTemplate the webhook creates in the "
                        "pod's namespace (chart value dra.rewriteRequests; docs/dra.md)")
    p.add_argument("--operator-mig", choices=MODES, default=d.operator_mig,
                   help="the GPU operator's nvidia.com/mig-<profile> resources: auto (tessera "
                        "makes the partition where no node advertises that resource but a GPU "
                        "in MIG mode has the profile), dynamic (always tessera's partitions), "
                        "static (the operator's device plugin serves them); chart value "
                        "mig.operatorResources (docs/mig.md)")
    p.add_argument("--default-project", default=None,
                   help="project for pods in namespaces no Project owns (default: refuse them)")
    p.add_argument("--ready-file", help="write the bound port here once serving")
    p.add_argument("--record-latencies", metavar="PATH",
                   help="benchmarks: on exit, write each review's handling time (JSON seconds)")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.client_ca:
        try:
            import ssl
            ssl.create_default_context(cafile=args.client_ca)
        except (OSError, ssl.SSLError) as exc:
            p.error(f"--client-ca {args.client_ca}: not a readable PEM CA certificate ({exc})")
    if args.probe_port is not None and not 0 <= args.probe_port <= 65535:
        p.error(f"--probe-port {args.probe_port}: must be 0-65535")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = WebhookConfig(
        scheduler_name=args.scheduler_name, scheduler_user=args.scheduler_user,
        node_user=args.node_user,
        library_host_dir=args.library_host_dir, library_mount=args.library_mount,
        containers_host_dir=args.containers_host_dir, loans_host_dir=args.loans_host_dir,
        preload_host_file=args.preload_host_file, default_project=args.default_project or None,
        region_group=args.region_group, rewrite_claims=args.rewrite_to_claims,
        operator_mig=args.operator_mig, compute_mode=args.gpu_compute_mode,
    )
    try:
        import uvloop  # libuv loop and its TLS: about half the webhook's CPU per review
    except ImportError:
        return asyncio.run(_run(args, config))
    return int(uvloop.run(_run(args, config)))


async def _run(args: argparse.Namespace, config: WebhookConfig) -> int:
    from lightkube import AsyncClient, KubeConfig

    from tessera.kube.admission.server import serve

    kc = KubeConfig.from_file(args.kubeconfig) if args.kubeconfig else KubeConfig.from_env()
    client = AsyncClient(kc)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)

    def ready(port: int) -> None:
        if args.ready_file:
            with open(args.ready_file, "w") as f:
                f.write(str(port))

    try:
        await serve(host=args.host, port=args.port, certfile=args.cert, keyfile=args.key,
                    config=config, client=client, ready=ready,
                    record_latencies=args.record_latencies, client_ca=args.client_ca,
                    probe_port=args.probe_port)
    except asyncio.CancelledError:
        return 0
    finally:
        await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
