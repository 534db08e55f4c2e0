"""The engines people run their workloads through, on the test cluster: the real controllers of
JobSet, LeaderWorkerSet and KubeRay, built from the Go module proxy at a pinned version
(tessera.testing.binaries), with the CRDs and admission webhooks of the same module versions.

Each controller runs on loopback with the cluster's admin kubeconfig, no leader election, its
webhook server (JobSet, LeaderWorkerSet) on a serving certificate from the cluster's CA, and its
webhook configurations registered with ``url:`` instead of the in-cluster Service they name.
Named ``<engine>-…`` (before ``tessera``), so an engine's pod webhook (LeaderWorkerSet labels
its pods there) runs before tessera's reads the pod.
(Test harness.)"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster
from tessera.testing.processes import ManagedProcess, _wait_for, free_ports


@dataclass(frozen=True)
class Engine:
    name: str
    binary: str
    """Key in tessera.testing.binaries.BINARIES (its module and version)."""
    module: str
    crds: tuple[str, ...]
    """CRD manifests, paths inside the module."""
    webhooks: str | None = None
    """The kubebuilder webhook manifests inside the module (None: the engine has none)."""
    pod_label: str | None = None
    """Its pod webhooks only see pods with this label (as its own deployment patches them)."""
    config_group: str | None = None
    """``config.<group>/v1alpha1 Configuration`` passed with ``--config`` (controller-runtime
    engines of sigs.k8s.io); None: flags only (KubeRay)."""
    certs_key: str = "internalCertManagement"
    """The Configuration's field that turns its own certificate management off (Kubeflow
    Trainer: ``certManagement``, which has no ``webhook.certDir``: its serving certificate goes
    where controller-runtime looks by default, under ``$TMPDIR``)."""


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("jobset", "jobset", "sigs.k8s.io/jobset",
           ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
           "config/components/webhook/manifests.yaml", "jobset.sigs.k8s.io/jobset-name",
           "config.jobset.x-k8s.io"),
    Engine("leaderworkerset", "lws", "sigs.k8s.io/lws",
           ("config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",),
           "config/webhook/manifests.yaml", "leaderworkerset.sigs.k8s.io/name",
           "config.lws.x-k8s.io"),
    Engine("kuberay", "kuberay", "github.com/ray-project/kuberay/ray-operator",
           ("config/crd/bases/ray.io_rayclusters.yaml", "config/crd/bases/ray.io_rayjobs.yaml")),
    # Kubeflow Trainer v2: a TrainJob becomes a JobSet (run the jobset engine too).
    Engine("trainer", "trainer", binaries.TRAINER, tuple(
        f"manifests/base/crds/trainer.kubeflow.org_{k}.yaml"
        for k in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")),
        "manifests/base/webhook/manifests.yaml", None, "config.trainer.kubeflow.org",
        "certManagement"),
)}


def module_dir(module: str, version: str) -> Path:
    """The module's source in the Go module cache (downloaded from the proxy if missing)."""
    out = binaries._run([binaries._go(), "mod", "download", "-json", f"{module}@{version}"],
                        cwd=binaries.cache_dir(), log=binaries.cache_dir() / "logs" /
                        f"download-{module.replace('/', '_')}-{version}.log",
                        env=binaries._go_env(module_mode=False))
    return Path(json.loads(out)["Dir"])


def apply_crds(cluster: TestCluster, crds: list[dict[str, Any]]) -> None:
    """Apply CRDs and wait until each is Established (``kubectl wait`` fails, rather than
    waits, while a new CRD has no status yet: retried)."""
    from tessera.testing.webhook import apply

    apply(cluster, crds)
    def established(name: str) -> bool:
        return cluster.kubectl("wait", "--for=condition=Established", "--timeout=10s",
                               f"crd/{name}", check=False).returncode == 0

    for crd in crds:
        name = str(crd["metadata"]["name"])
        _wait_for(f"CRD {name} Established", functools.partial(established, name),
                  timeout=60, interval=0.5)


def _webhook_docs(engine: Engine, source: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    assert engine.webhooks is not None
    docs = [d for d in yaml.safe_load_all((source / engine.webhooks).read_text()) if d]
    for doc in docs:
        kind = "mutating" if doc["kind"].startswith("Mutating") else "validating"
        doc["metadata"] = {"name": f"{engine.name}-{kind}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}",
                                    "caBundle": base64.b64encode(ca).decode()}
            if engine.pod_label and any("pods" in r.get("resources", [])
                                        for r in hook.get("rules", [])):
                hook["objectSelector"] = {"matchExpressions": [
                    {"key": engine.pod_label, "operator": "Exists"}]}
    return docs


@contextlib.contextmanager
def running(cluster: TestCluster, name: str) -> Iterator[ManagedProcess]:
    """Start engine ``name`` (building it first if needed); stop it and remove its webhook
    configurations on exit. Its CRDs stay (as after uninstalling most operators)."""
    from tessera.testing.webhook import apply

    engine = ENGINES[name]
    assert cluster.workdir is not None
    binary = binaries.BINARIES[engine.binary]
    path = binaries.ensure([engine.binary], report=cluster.report)[engine.binary]
    source = module_dir(engine.module, binary.version)
    crds = [d for rel in engine.crds for d in yaml.safe_load_all((source / rel).read_text()) if d]
    apply_crds(cluster, crds)
    wd = cluster.workdir / name
    wd.mkdir(exist_ok=True)
    hook_port, probe_port = free_ports(2)
    args: list[str] = []
    if engine.config_group is not None:
        cert, key, _ = cluster.issue_serving_cert(f"{name}-webhook")
        certs = wd / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "tls.crt").write_bytes(Path(cert).read_bytes())
        (certs / "tls.key").write_bytes(Path(key).read_bytes())
        (wd / "config.yaml").write_text(yaml.safe_dump({
            "apiVersion": f"{engine.config_group}/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            engine.certs_key: {"enable": False},
            "webhook": {"port": hook_port, "host": "127.0.0.1", **(
                {"certDir": str(certs)} if engine.certs_key == "internalCertManagement" else {})},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
            "clientConnection": {"qps": 500, "burst": 1000},
        }))
        args = [f"--config={wd / 'config.yaml'}", f"--kubeconfig={cluster.kubeconfig}"]
    else:
        args = [f"--kubeconfig={cluster.kubeconfig}", "--metrics-addr=0",
                f"--health-probe-bind-address=127.0.0.1:{probe_port}",
                "--enable-leader-election=false", "--log-stdout-encoder=console"]
    proc = ManagedProcess(name, [str(path), *args], cluster.workdir / "logs" / f"{name}.log")
    cluster.processes.append(proc)
    t0 = time.monotonic()
    proc.start(env={**os.environ, "TMPDIR": str(wd)})
    _wait_for(f"{name} /readyz", lambda: httpx.get(f"http://127.0.0.1:{probe_port}/readyz",
                                                    timeout=2).status_code == 200,
              timeout=90, processes=[proc], interval=0.2)
    registered: list[dict[str, Any]] = []
    if engine.webhooks is not None:
        def serving() -> bool:
            with socket.create_connection(("127.0.0.1", hook_port), timeout=2):
                return True
        _wait_for(f"{name} webhook server", serving, timeout=60, processes=[proc], interval=0.2)
        assert cluster.pki is not None
        registered = _webhook_docs(engine, source, f"https://127.0.0.1:{hook_port}",
                                   cluster.pki.ca_cert.read_bytes())
        apply(cluster, registered)
    cluster.startup_seconds[name] = time.monotonic() - t0
    try:
        yield proc
    finally:
        for doc in registered:
            cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"],
                            "--ignore-not-found", check=False)
        proc.stop()
        with contextlib.suppress(ValueError):
            cluster.processes.remove(proc)
