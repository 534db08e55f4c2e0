"""A real Kubernetes control plane for tests and for trying tessera without GPUs.

``TestCluster`` runs real ``etcd`` and ``kube-apiserver`` processes (built by
``tessera.testing.binaries``) on free loopback ports, plus ``kwok`` playing the kubelets of
simulated GPU nodes (``tessera.testing.gpu_nodes``). What is on:

- the secure port only, serving certificate from a generated CA; admin access through a client
  certificate in group ``system:masters``, written into a kubeconfig;
- ``--authorization-mode=RBAC`` (so components can be run as their ServiceAccounts, see
  ``service_account_kubeconfig``), a generated service-account signing key, TokenRequest;
- admission webhooks (``MutatingAdmissionWebhook``, ``ValidatingAdmissionWebhook``, ...), with a
  helper to issue webhook serving certificates signed by the cluster CA;



Run ``python -m tessera.testing.cluster up --kubeconfig PATH`` for a cluster in the foreground.
(Test harness, over 400 lines: one control plane's processes, certificates and kubeconfigs.)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tessera.testing import binaries, pki
from tessera.testing.gpu_nodes import (
    KWOK_ANNOTATION,
    KWOK_ANNOTATION_VALUE,
    NodeShape,
    node_manifest,
)
from tessera.testing.processes import ClusterError as ClusterError  # re-exported: the harness
from tessera.testing.processes import ManagedProcess as ManagedProcess  # and the tests import
from tessera.testing.processes import _wait_for as _wait_for  # these from here
from tessera.testing.processes import free_ports as free_ports

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SCHEDULER_MODULE = "tessera.kube.scheduler"


WORKDIR_PREFIX = "tessera-cluster-"


def _remove_stale_workdirs() -> None:
    """Remove temporary cluster dirs left by a harness that was killed (its owner pid is gone)."""
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            pid = int((path / "owner.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_text(
    server: str,
    ca_cert: Path,
    *,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> str:
    """A self-contained kubeconfig (certificates embedded) for one user."""
    creds: dict[str, str] = {}
    if client_cert and client_key:
        creds = {
            "client-certificate-data": _b64(client_cert),
            "client-key-data": _b64(client_key),
        }
    elif token:
        creds = {"token": token}
    else:
        raise ValueError("kubeconfig needs a client certificate and key, or a token")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tessera-test",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": "tessera-test", "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class TestCluster:
    """etcd + kube-apiserver + kwok on loopback. Use as a context manager, or start()/stop().

    ``workdir`` (default: a new temporary directory) holds certificates, etcd's data and the
    logs; it is removed by stop() unless ``keep_workdir`` (or ``$TESSERA_KEEP_CLUSTER_DIR``)."""

    __test__ = False  # not a pytest test class

    workdir: Path | None = None
    keep_workdir: bool = False
    startup_timeout: float = 90.0
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """More flags for "kube-apiserver" or "kwok", after the cluster's own (the last one wins)."""
    binary_overrides: dict[str, Path] = field(default_factory=dict)
    """Use these executables instead of the built ones (e.g. ``{"etcd": Path(...)}``)."""
    report: Callable[[str], None] | None = None
    device_classes: bool = True
    """Create the chart's DRA DeviceClasses at start (off where the chart itself is installed,
    since Helm refuses to adopt objects it did not create)."""

    server: str = field(init=False, default="")
    kubeconfig: Path = field(init=False, default=Path())
    pki: pki.ClusterPKI | None = field(init=False, default=None)
    paths: dict[str, Path] = field(init=False, default_factory=dict)
    processes: list[ManagedProcess] = field(init=False, default_factory=list)
    startup_seconds: dict[str, float] = field(init=False, default_factory=dict)
    node_agents: list[Any] = field(init=False, default_factory=list)
    """``tessera.testing.node_agents.NodeAgents`` started by create_gpu_nodes."""
    _owns_workdir: bool = field(init=False, default=False)
    _ssl: ssl.SSLContext | None = field(init=False, default=None)

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> TestCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _say(self, msg: str) -> None:
        if self.report:
            self.report(msg)

    def start(self) -> None:
        t0 = time.monotonic()
        wanted = [n for n in binaries.CLUSTER_BINARIES if n not in self.binary_overrides]
        self.paths = {**binaries.ensure(wanted, report=self.report), **self.binary_overrides}
        stages = binaries.kwok_stages_file()
        self.startup_seconds["binaries"] = time.monotonic() - t0
        if self.workdir is None:
            _remove_stale_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
            (self.workdir / "owner.pid").write_text(str(os.getpid()))
            self._owns_workdir = True
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(stages)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        self._say(f"control plane up in {self.startup_seconds['total']:.1f} s")

    def _start(self, stages: Path) -> None:
        assert self.workdir is not None
        wd = self.workdir
        t = time.monotonic()
        self.pki = pki.generate(wd / "pki")
        etcd_port, etcd_peer, api_port = free_ports(3)
        self.server = f"https://127.0.0.1:{api_port}"

        etcd = ManagedProcess(
            "etcd",
            [
                str(self.paths["etcd"]),
                "--name=tessera",
                f"--data-dir={wd / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=tessera=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            wd / "logs" / "etcd.log",
        )
        self.processes.append(etcd)
        etcd.start()
        _wait_for(
            "etcd /health",
            lambda: httpx.get(f"http://127.0.0.1:{etcd_port}/health", timeout=2).json()["health"]
            == "true",
            timeout=30,
            processes=[etcd],
        )
        self.startup_seconds["etcd"] = time.monotonic() - t

        t = time.monotonic()
        p = self.pki
        apiserver = ManagedProcess(
            "kube-apiserver",
            [
                str(self.paths["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={wd / 'apiserver-certs'}",
                f"--tls-cert-file={p.serving_cert}",
                f"--tls-private-key-file={p.serving_key}",
                f"--client-ca-file={p.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={p.sa_public_key}",
                f"--service-account-signing-key-file={p.sa_private_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                # TaintNodesByCondition taints every new node node.kubernetes.io/not-ready; a
                # cluster's node lifecycle controller lifts it once the kubelet reports Ready.
                # There is no such controller here, so the taint would stay for good.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--profiling=false",
                "--v=0",
                # Dynamic Resource Allocation (issue 19, docs/dra.md): resource.k8s.io/v1 is on
                # by default since 1.34; consumable capacity (KEP-5075) is beta in 1.36 and is
                # named here so the cluster does not depend on the gate's default.
                "--runtime-config=resource.k8s.io/v1=true",
                "--feature-gates=DRAConsumableCapacity=true",
                *self.extra_args.get("kube-apiserver", ()),
            ],
            wd / "logs" / "kube-apiserver.log",
        )
        self.processes.append(apiserver)
        apiserver.start()
        self._ssl = ssl.create_default_context(cafile=str(p.ca_cert))
        self._ssl.load_cert_chain(str(p.admin_cert), str(p.admin_key))
        _wait_for(
            "kube-apiserver /readyz",
            lambda: self._get("/readyz").status_code == 200,
            timeout=self.startup_timeout,
            processes=[etcd, apiserver],
            interval=0.2,
        )
        _wait_for("namespace 'default'", lambda: self._get("/api/v1/namespaces/default").status_code == 200,
                  timeout=30, processes=[apiserver])
        self.kubeconfig = wd / "admin.kubeconfig"
        self.kubeconfig.write_text(
            kubeconfig_text(
                self.server, p.ca_cert, user="tessera-admin",
                client_cert=p.admin_cert, client_key=p.admin_key,
            )
        )
        self.kubeconfig.chmod(0o600)
        self.startup_seconds["kube-apiserver"] = time.monotonic() - t
        if self.device_classes:
            self._create_device_classes()

        t = time.monotonic()
        kwok = ManagedProcess(
            "kwok",
            [
                str(self.paths["kwok"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
                "--cidr=10.64.0.0/10",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",  # a kubelet's default
                *self.extra_args.get("kwok", ()),
            ],
            wd / "logs" / "kwok.log",
        )
        self.processes.append(kwok)
        kwok.start(env={**os.environ, "HOME": str(wd)})
        time.sleep(0.2)
        kwok.check_alive()
        self.startup_seconds["kwok"] = time.monotonic() - t

    def restart_apiserver(self, *, kill: bool = True, down_seconds: float = 0.0,
                          while_down: Callable[[], None] | None = None) -> float:
        """Stop kube-apiserver (SIGKILL, or SIGTERM when ``kill`` is False), call
        ``while_down``, wait ``down_seconds``, start it again with the same flags on the same
        port (etcd keeps the data) and wait until it is ready. Returns the seconds it was
        unreachable. Call it from a thread that outlives the cluster: the API server is
        started with PR_SET_PDEATHSIG, which fires when the starting thread ends."""
        proc = next(p for p in self.processes if p.name == "kube-apiserver")
        t0 = time.monotonic()
        assert proc.popen is not None
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(10)
        else:
            proc.stop()
        if while_down is not None:
            while_down()
        time.sleep(down_seconds)
        proc.start()
        _wait_for("kube-apiserver /readyz after restart",
                  lambda: self._get("/readyz").status_code == 200,
                  timeout=self.startup_timeout, processes=[proc], interval=0.1)
        return time.monotonic() - t0

    def check_alive(self) -> None:
        """Raise ClusterError if any of the cluster's processes has exited."""
        for proc in self.processes:
            proc.check_alive()

    def stop(self) -> None:
        """Stop kwok, the API server and etcd (in that order) and remove the workdir."""
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        keep = self.keep_workdir or bool(os.environ.get("TESSERA_KEEP_CLUSTER_DIR"))
        if self.workdir is not None and self._owns_workdir and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _create_device_classes(self) -> None:
        """The DeviceClasses of DRA driver gpu.tessera.io, as the chart installs them (a
        source checkout's deploy/helm/tessera/files/deviceclasses.yaml; docs/dra.md)."""
        if not DEVICE_CLASSES.is_file():
            return
        assert self._ssl is not None
        for doc in yaml.safe_load_all(DEVICE_CLASSES.read_text()):
            if not doc:
                continue
            with httpx.Client(verify=self._ssl, base_url=self.server, timeout=10) as c:
                r = c.post("/apis/resource.k8s.io/v1/deviceclasses", json=doc)
            if r.status_code not in (201, 404, 409):  # 404: DRA turned off by extra args
                raise ClusterError(f"DeviceClass {doc['metadata']['name']}: {r.status_code} "
                                   f"{r.text[:300]}")

    # ---- access ----------------------------------------------------------------------------
    def _get(self, path: str) -> httpx.Response:
        assert self._ssl is not None
        return httpx.get(self.server + path, verify=self._ssl, timeout=5)

    @property
    def kubectl_path(self) -> Path:
        return binaries.ensure(["kubectl"])["kubectl"]

    def kubectl(self, *args: str, check: bool = True, kubeconfig: Path | None = None
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            capture_output=True, text=True, check=check, timeout=60,
        )

    def client(self, kubeconfig: Path | None = None, **kwargs: Any) -> Any:
        """A lightkube ``Client`` (admin unless another kubeconfig is given)."""
        from lightkube import Client, KubeConfig

        return Client(KubeConfig.from_file(str(kubeconfig or self.kubeconfig)), **kwargs)

    def async_client(self, kubeconfig: Path | None = None, **kwargs: Any) -> Any:
        """A lightkube ``AsyncClient`` (admin unless another kubeconfig is given)."""
        from lightkube import AsyncClient, KubeConfig

        return AsyncClient(KubeConfig.from_file(str(kubeconfig or self.kubeconfig)), **kwargs)

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        path: Path | None = None,
        create: bool = True,
        expiration_seconds: int = 3600,
    ) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``namespace/name``.

        Creates the namespace and ServiceAccount if missing (unless ``create=False``), then asks
        the API server for a bound token (TokenRequest). Rights come only from RBAC bindings
        for ``system:serviceaccount:<namespace>:<name>``."""
        from lightkube import ApiError
        from lightkube.models.authentication_v1 import TokenRequestSpec
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace, ServiceAccount, ServiceAccountToken

        admin = self.client()
        if create:
            for obj, ns in ((Namespace(metadata=ObjectMeta(name=namespace)), None),
                            (ServiceAccount(metadata=ObjectMeta(name=name)), namespace)):
                try:
                    admin.create(obj, namespace=ns) if ns else admin.create(obj)
                except ApiError as exc:
                    if exc.status.code != 409:
                        raise
        token = admin.create(
            ServiceAccountToken(
                metadata=ObjectMeta(name=name, namespace=namespace),
                spec=TokenRequestSpec(audiences=[], expirationSeconds=expiration_seconds),
            ),
            name,
            namespace=namespace,
        )
        assert token.status is not None and self.pki is not None and self.workdir is not None
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(
            kubeconfig_text(
                self.server, self.pki.ca_cert, user=f"{namespace}-{name}",
                token=token.status.token, namespace=namespace,
            )
        )
        path.chmod(0o600)
        return path

    def service_account_client(self, namespace: str, name: str, **kwargs: Any) -> Any:
        """A lightkube ``Client`` acting as ServiceAccount ``namespace/name``."""
        return self.client(self.service_account_kubeconfig(namespace, name), **kwargs)

    def issue_serving_cert(self, name: str, hosts: list[str] | None = None
                           ) -> tuple[Path, Path, bytes]:
        """(cert, key, caBundle) for a webhook server on loopback that the API server trusts."""
        assert self.pki is not None and self.workdir is not None
        cert, key = pki.issue_serving_cert(self.pki, self.workdir / "webhooks", name, hosts)
        return cert, key, self.pki.ca_cert.read_bytes()

    # ---- nodes -----------------------------------------------------------------------------
    def create_gpu_nodes(
        self,
        count: int,
        shape: NodeShape | None = None,
        *,
        prefix: str = "gpu-node-",
        start_index: int = 0,
        wait_ready: bool = True,
        timeout: float = 60.0,
        node_agents: bool = True,
    ) -> list[str]:
        """Create ``count`` simulated GPU nodes (kwok makes them Ready); return their names.

        ``node_agents``: also start the node side (``tessera.testing.node_agents``: one
        tessera-node per node on its own fake NVML, the kubelet pod-resources double) and wait
        until every agent reports the node ready for GPU shares (the scheduler places shares
        only there). Benchmarks with hundreds of nodes pass False and start
        ``python -m tessera.testing.kubelet --play-agents`` instead."""
        from lightkube import codecs
        from lightkube.resources.core_v1 import Node

        shape = shape or NodeShape()
        client = self.client()
        names = []
        for i in range(start_index, start_index + count):
            name = f"{prefix}{i}"
            manifest = node_manifest(name, shape, index=i)
            node = client.create(codecs.from_dict(manifest))
            assert isinstance(node, Node)
            if not (node.status and node.status.allocatable):
                client.patch(Node, name, {"status": manifest["status"]}, subresource="status")
            names.append(name)
        if wait_ready:
            self.wait_nodes_ready(names, timeout=timeout)
        if node_agents and shape.gpus > 0:
            from tessera.testing.node_agents import start_node_agents

            agents = start_node_agents(self, names)
            self.node_agents.append(agents)
            if wait_ready:
                agents.wait_ready(timeout=max(60.0, timeout))
        return names

    def wait_nodes_ready(self, names: list[str], *, timeout: float = 60.0) -> None:
        from lightkube.resources.core_v1 import Node

        client = self.client()
        pending = set(names)

        def all_ready() -> bool:
            for node in client.list(Node):
                name = node.metadata.name if node.metadata else None
                conditions = (node.status.conditions if node.status else None) or []
                if name in pending and any(
                    c.type == "Ready" and c.status == "True" for c in conditions
                ):
                    pending.discard(name)
            return not pending

        _wait_for(f"{len(names)} node(s) Ready", all_ready, timeout=timeout,
                  processes=self.processes, interval=0.2)


DEVICE_CLASSES = (Path(__file__).resolve().parents[3] / "deploy" / "helm" / "tessera" / "files"
                  / "deviceclasses.yaml")


# ---- scheduler hook ----------------------------------------------------------------------------
def start_scheduler(cluster: TestCluster) -> ManagedProcess | None:
    """HOOK for tessera's scheduler (issue 6, part 2): start it against the cluster, if it exists.

    Contract for the engineer writing ``tessera.kube``: provide a module ``tessera.kube.scheduler``
    runnable as ``python -m tessera.kube.scheduler --kubeconfig PATH``, which runs until SIGTERM.
    Until that module exists this returns None and the cluster runs without a scheduler."""
    if importlib.util.find_spec("tessera.kube") is None:
        return None
    if importlib.util.find_spec(SCHEDULER_MODULE) is None:
        return None
    assert cluster.workdir is not None
    crds = Path(__file__).resolve().parents[3] / "deploy" / "crds"
    if crds.is_dir():  # a source checkout; an installed package gets its CRDs from the chart
        cluster.kubectl("apply", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    # The node side (tessera-node per kwok node, the kubelet pod-resources double) is started
    # with the nodes (create_gpu_nodes(node_agents=True)).
    proc = ManagedProcess(
        "tessera-scheduler",
        [sys.executable, "-m", SCHEDULER_MODULE, f"--kubeconfig={cluster.kubeconfig}"],
        cluster.workdir / "logs" / "tessera-scheduler.log",
    )
    proc.start()
    cluster.processes.append(proc)
    return proc


# ---- command line ------------------------------------------------------------------------------
def _up(args: argparse.Namespace) -> int:
    try:
        shape = NodeShape(gpus=args.gpus_per_node, model=args.gpu_model)
        if args.nodes < 0:
            raise ValueError(f"--nodes must be >= 0, got {args.nodes}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cluster = TestCluster(report=say, keep_workdir=args.keep_workdir)
    stack: Any = None
    t0 = time.monotonic()
    try:
        cluster.start()
        nodes = cluster.create_gpu_nodes(args.nodes, shape, timeout=max(60.0, args.nodes * 0.5))
        kubeconfig = Path(args.kubeconfig).expanduser().resolve()
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        if not args.no_stack and importlib.util.find_spec(SCHEDULER_MODULE) is not None:
            from tessera.testing.stack import start_stack

            stack = start_stack(cluster, gpus=len(nodes) * shape.gpus)
        say(f"api server: {cluster.server}")
        say(f"workdir:    {cluster.workdir} (logs under logs/)")
        say(f"nodes:      {len(nodes)} x {shape.gpus} {shape.model} (kwok), one tessera-node each")
        if stack is not None:
            say(f"webhook:    {stack.webhook_url} (the chart's webhook configurations applied)")
            say("scheduler:  tessera-scheduler (ServiceAccount tessera-system/tessera-scheduler)")
            say("project:    default (namespace default): Run:ai and cGPU manifests work there as they are")
        else:
            say("scheduler:  not started (--no-stack)")
        say(f"started in {time.monotonic() - t0:.1f} s")
        print(f"kubectl: {cluster.kubectl_path}")
        print(f"kubeconfig: {kubeconfig}")
        print("ready", flush=True)
        while not stop.wait(1.0):
            cluster.check_alive()
            if stack is not None:
                stack.supervise(say)
    except (ClusterError, binaries.BuildError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if stack is not None:
            stack.stop()
        cluster.stop()
        say("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.testing.cluster",
        description="A real etcd + kube-apiserver + kwok cluster with simulated GPU nodes.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it running until interrupted")
    up.add_argument("--kubeconfig", required=True, help="where to write the admin kubeconfig")
    up.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes (default 4)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    up.add_argument("--gpu-model", default="H100-80GB", help="GPU model (default H100-80GB)")
    up.add_argument("--no-stack", action="store_true",
                    help="only the cluster: no webhook, no scheduler (the node side still runs)")
    up.add_argument("--keep-workdir", action="store_true",
                    help="keep certificates, etcd data and logs after stopping")
    args = parser.parse_args(argv)
    return _up(args)


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[TestCluster]:
    """``with running_cluster() as c:`` — start, yield, always stop."""
    cluster = TestCluster(**kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
