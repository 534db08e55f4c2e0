"""Run the webhook as a local process against a test cluster and register it with the chart's
own webhook configurations (``helm template`` with ``webhook.url``), for tests and benchmarks.

Needs the repository checkout (the chart lives in deploy/helm/tessera) and helm (built by
``python -m tessera.testing.binaries ensure``).
"""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tessera.testing import binaries
from tessera.testing.processes import ClusterHandle, ManagedProcess

CHART = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "tessera"
KUBE_VERSION = binaries.KUBERNETES_VERSION.lstrip("v")
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def helm() -> Path:
    return binaries.ensure(["helm"])["helm"]


def helm_template(*set_args: str, namespace: str = "tessera-system", release: str = "tessera",
                  include_crds: bool = False) -> list[dict[str, Any]]:
    """The chart rendered by ``helm template`` as a list of objects."""
    cmd = [str(helm()), "template", release, str(CHART), "--namespace", namespace,
           "--kube-version", KUBE_VERSION]
    if include_crds:
        cmd.append("--include-crds")
    for s in set_args:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@dataclass
class LocalWebhook:
    process: ManagedProcess
    port: int
    ca_bundle: bytes

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.stop()


def start_webhook(cluster: ClusterHandle, *, name: str = "tessera-webhook",
                  kubeconfig: Path | None = None, extra_args: list[str] | None = None,
                  timeout: float = 30.0, wait_ready: bool = True, port: int = 0,
                  client_cert: tuple[Path, Path] | None = None) -> LocalWebhook:
    """Start ``python -m tessera.kube.admission`` on a free loopback port (or ``port``, so a
    restart keeps the registered URL) with a serving certificate from the cluster's CA; return
    once it reports ready (caches synced), or only serving (``wait_ready=False``).
    ``client_cert`` (certificate, key): what the readiness check presents, for a webhook
    started with ``--client-ca``."""
    assert cluster.workdir is not None
    cert, key, ca = cluster.issue_serving_cert(name)
    ready_file = cluster.workdir / f"{name}.port"
    ready_file.unlink(missing_ok=True)
    proc = ManagedProcess(
        name,
        [sys.executable, "-m", "tessera.kube.admission",
         f"--kubeconfig={kubeconfig or cluster.kubeconfig}", f"--cert={cert}", f"--key={key}",
         "--host=127.0.0.1", f"--port={port}", f"--ready-file={ready_file}", "--log-level=INFO",
         *(extra_args or [])],
        cluster.workdir / "logs" / f"{name}.log",
    )
    proc.start()
    deadline = time.monotonic() + timeout
    port = 0
    while True:  # the port the webhook reports (the one asked, or the free one it picked)
        proc.check_alive()
        if not port and ready_file.exists() and ready_file.read_text().strip():
            port = int(ready_file.read_text())
        if port:
            try:
                assert cluster.pki is not None
                verify = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
                if client_cert is not None:
                    verify.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
                r = httpx.get(f"https://127.0.0.1:{port}/readyz", verify=verify, timeout=2)
                if r.status_code == 200 or not wait_ready:
                    return LocalWebhook(proc, port, ca)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{proc.log_tail()}")
        time.sleep(0.05)


def webhook_configurations(url: str, ca_bundle: bytes, *extra_set: str) -> list[dict[str, Any]]:
    """The chart's Mutating/ValidatingWebhookConfiguration, pointing at ``url``."""
    docs = helm_template(f"webhook.url={url}",
                         f"webhook.caBundle={base64.b64encode(ca_bundle).decode()}", *extra_set)
    return [d for d in docs if d.get("kind") in WEBHOOK_KINDS]


def register(cluster: ClusterHandle, webhook: LocalWebhook, *extra_set: str) -> list[dict[str, Any]]:
    """Apply the chart's webhook configurations for ``webhook`` (server-side apply)."""
    docs = webhook_configurations(webhook.url, webhook.ca_bundle, *extra_set)
    apply(cluster, docs)
    return docs


def apply(cluster: ClusterHandle, docs: list[dict[str, Any]], *args: str,
          kubeconfig: Path | None = None) -> str:
    """``kubectl apply --server-side`` of ``docs``; returns kubectl's output."""
    assert cluster.workdir is not None
    path = cluster.workdir / f"apply-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    out = cluster.kubectl("apply", "--server-side", "--force-conflicts",
                          "--field-manager=tessera-test", "-f", str(path), *args,
                          kubeconfig=kubeconfig, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {out.stderr.strip()}")
    return out.stdout


def unregister(cluster: ClusterHandle) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "tessera", "--ignore-not-found")
