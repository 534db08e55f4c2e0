"""tessera-webhook --client-ca: only a caller with a client certificate from that CA gets a
review through. The test cluster's API server is configured the way docs/admission.md tells an
operator to configure theirs (an AdmissionConfiguration whose kubeconfig gives it a client
certificate for webhook calls); this needs its own cluster (an API-server flag)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from lightkube import ApiError, codecs

from tessera.testing import pki
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster, free_ports

NS = "auth-team"


def _bad_pod() -> object:
    """A GPU pod the webhook refuses on its own reading (a Run:ai fraction above 1): the
    refusal's text proves the review reached the webhook's handler."""
    return codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bad", "annotations": {"gpu-fraction": "1.5"}},
        "spec": {"schedulerName": "runai-scheduler",
                 "containers": [{"name": "main", "image": "x"}]}})


@pytest.fixture(scope="module")
def authed_cluster(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[TestCluster, Path, Path, Path]]:
    d = tmp_path_factory.mktemp("admission-auth")
    ca, cert, key = pki.generate_client_ca(d, "kube-apiserver-admission")
    kubeconfig = d / "admission-kubeconfig.yaml"
    # "*": every webhook this API server calls; on a real cluster name the Service instead
    # (tessera-webhook.tessera-system.svc), docs/admission.md.
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(cert),
                                         "client-key": str(key)}}]}))
    webhook_conf = {"apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration", "kubeConfigFile": str(kubeconfig)}
    config = d / "admission-config.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": n, "configuration": webhook_conf}
                    for n in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}))
    cluster = TestCluster(extra_args={"kube-apiserver": [f"--admission-control-config-file={config}"]})
    cluster.start()
    try:
        cluster.kubectl("create", "namespace", NS)
        local.apply(cluster, [d for d in local.helm_template(include_crds=True)
                              if d["kind"] == "CustomResourceDefinition"])
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io")
        yield cluster, ca, cert, key
    finally:
        cluster.stop()


def _refusal(cluster: TestCluster) -> str:
    """The API server's refusal of the bad pod (server-side dry run, repeated until the just
    registered webhook configuration is in effect: it takes a moment)."""
    import time

    client = cluster.client()
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create(_bad_pod(), namespace=NS, dry_run=True)
        except ApiError as exc:
            return str(exc.status.message)
        if time.monotonic() > deadline:
            return "admitted: the webhook was never called"
        time.sleep(0.2)


def _start(cluster: TestCluster, ca: Path, client: tuple[Path, Path], port: int = 0
           ) -> tuple[local.LocalWebhook, int]:
    probe_port = free_ports(1)[0]
    hook = local.start_webhook(cluster, extra_args=[f"--client-ca={ca}",
                                                    f"--probe-port={probe_port}"],
                               client_cert=client, port=port)
    return hook, probe_port


def test_reviews_only_from_the_api_server_certificate(
        authed_cluster: tuple[TestCluster, Path, Path, Path]) -> None:
    cluster, ca, cert, key = authed_cluster
    assert cluster.pki is not None
    hook, probe_port = _start(cluster, ca, (cert, key))
    try:
        local.register(cluster, hook)
        # The API server presents its admission client certificate: the review is made.
        assert "metadata.annotations[gpu-fraction]: must be a decimal GPU portion" in \
            _refusal(cluster)
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "1", "kind": {"kind": "Pod"}, "operation": "CREATE",
                              "object": {"metadata": {"name": "x"}}}}
        # Anyone else is turned away in the TLS handshake: no certificate, or one signed by
        # another CA (the cluster's own: an admin's certificate is not the API server's).
        anon = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        other = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        other.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
        for ctx in (anon, other):
            with pytest.raises(httpx.HTTPError):
                httpx.post(f"{hook.url}/mutate", json=review, verify=ctx, timeout=5)
        # The holder of the right certificate is served (the same request as the API server).
        good = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        good.load_cert_chain(str(cert), str(key))
        r = httpx.post(f"{hook.url}/mutate", json=review, verify=good, timeout=5)
        assert r.status_code == 200 and r.json()["response"]["uid"] == "1"
        # Probes without a certificate, on their own plain-HTTP port; reviews are not.
        probe = f"http://127.0.0.1:{probe_port}"
        assert httpx.get(f"{probe}/readyz", timeout=5).status_code == 200
        assert httpx.get(f"{probe}/healthz", timeout=5).status_code == 200
        assert httpx.post(f"{probe}/mutate", json=review, timeout=5).status_code == 404
    finally:
        local.unregister(cluster)
        hook.stop()


def test_a_caller_without_the_certificate_gets_no_review(
        authed_cluster: tuple[TestCluster, Path, Path, Path], tmp_path: Path) -> None:
    """The same webhook trusting another CA: the API server's calls fail the handshake, and
    with failurePolicy Fail the GPU pod is refused without a review (nothing admitted
    unchecked)."""
    cluster, _, _, _ = authed_cluster
    other_ca, other_cert, other_key = pki.generate_client_ca(tmp_path, "someone-else")
    hook, _ = _start(cluster, other_ca, (other_cert, other_key))
    try:
        local.register(cluster, hook)
        message = _refusal(cluster)
        assert "failed calling webhook" in message and "gpu-fraction" not in message, message
    finally:
        local.unregister(cluster)
        hook.stop()


def test_client_ca_flag_is_checked(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("hello")
    out = subprocess.run([sys.executable, "-m", "tessera.kube.admission", "--cert=x", "--key=y",
                          f"--client-ca={bad}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--client-ca" in out.stderr and "PEM" in out.stderr


def test_chart_wires_the_client_ca(tmp_path: Path) -> None:
    """webhook.clientCA: the CA reaches the webhook as --client-ca, probes move to the plain
    probe port (kubelet probes carry no client certificate), and the arguments parse."""
    import subprocess

    from tessera.kube.admission.__main__ import parser

    ca, _, _ = pki.generate_client_ca(tmp_path, "apiserver")
    out = subprocess.run([str(local.helm()), "template", "t", str(local.CHART), "-n", "ts",
                          "--kube-version", local.KUBE_VERSION,
                          "--set-file", f"webhook.clientCA={ca}", "--set", "webhook.probePort=9090"],
                         capture_output=True, text=True, check=True, timeout=60)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}
    assert docs[("ConfigMap", "tessera-webhook-client-ca")]["data"]["ca.crt"] == ca.read_text()
    pod = docs[("Deployment", "tessera-webhook")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = parser().parse_args(container["args"])
    assert (args.client_ca, args.probe_port) == ("/client-ca/ca.crt", 9090)
    assert {"name": "client-ca", "mountPath": "/client-ca", "readOnly": True} in \
        container["volumeMounts"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "probes"
        assert container[probe]["httpGet"]["scheme"] == "HTTP"
    assert {"name": "probes", "containerPort": 9090} in container["ports"]
    metrics = docs[("Service", "tessera-webhook-metrics")]["spec"]["ports"][0]
    assert (metrics["port"], metrics["targetPort"]) == (9090, "probes")
