"""The Helm chart (deploy/helm/tessera): lint, render, apply to the real API server, RBAC."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from lightkube import ApiError, codecs

from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[3]
NS = "tessera-system"


def kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_helm_lint_passes() -> None:
    out = subprocess.run([str(local.helm()), "lint", str(local.CHART), "--strict",
                          "--kube-version", local.KUBE_VERSION],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_chart_renders_every_component() -> None:
    docs = kinds(local.helm_template(include_crds=True))
    for key in [("CustomResourceDefinition", "projects.tessera.io"),
                ("CustomResourceDefinition", "podgroups.tessera.io"),
                ("Deployment", "tessera-scheduler"), ("Deployment", "tessera-webhook"),
                ("Service", "tessera-webhook"), ("Secret", "tessera-webhook-tls"),
                ("MutatingWebhookConfiguration", "tessera"),
                ("ValidatingWebhookConfiguration", "tessera"),
                ("DaemonSet", "tessera-node-agent"),
                ("ClusterRole", "tessera-scheduler"), ("ClusterRole", "tessera-webhook"),
                ("Role", "tessera-scheduler"),
                ("ValidatingAdmissionPolicy", "tessera-gpu-configmaps"),
                ("ValidatingAdmissionPolicy", "tessera-api-project-namespaces"),
                ("PriorityClass", "train"), ("PriorityClass", "build"),
                ("PriorityClass", "inference")]:
        assert key in docs, key
    args = docs[("Deployment", "tessera-scheduler")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--policy=fgd" in args
    mutating = docs[("MutatingWebhookConfiguration", "tessera")]["webhooks"][0]
    assert mutating["failurePolicy"] == "Fail"
    assert mutating["clientConfig"]["service"] == {
        "name": "tessera-webhook", "namespace": NS, "path": "/mutate", "port": 443}
    exempt = mutating["namespaceSelector"]["matchExpressions"][0]["values"]
    assert NS in exempt and "kube-system" in exempt


def test_chart_values_reach_the_components() -> None:
    docs = kinds(local.helm_template("policy.placement=binpack", "policy.reclaim=false",
                                     "policy.minRuntimeSeconds=300", "scheduler.name=gpu-sched",
                                     "webhook.defaultProject=shared"))
    args = docs[("Deployment", "tessera-scheduler")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--policy=binpack", "--no-reclaim", "--min-runtime-seconds=300"} <= set(args)
    assert "--reclaim" not in args
    defaults = _args(kinds(local.helm_template()), "tessera-scheduler")
    assert {"--policy=fgd", "--reclaim", "--min-runtime-seconds=60"} <= set(defaults)
    hook_args = docs[("Deployment", "tessera-webhook")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scheduler-name=gpu-sched" in hook_args and "--default-project=shared" in hook_args
    cel = docs[("MutatingWebhookConfiguration", "tessera")]["webhooks"][0]["matchConditions"][0]
    assert "== 'tessera'" in cel["expression"]  # the CEL names tessera's own scheduler name


def test_chart_crds_are_the_scheduler_crds() -> None:
    rendered = [d for d in local.helm_template(include_crds=True)
                if d["kind"] == "CustomResourceDefinition"]
    on_disk = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "deploy" / "crds").glob("*.yaml"))]
    assert sorted(rendered, key=lambda d: d["metadata"]["name"]) == \
        sorted(on_disk, key=lambda d: d["metadata"]["name"])


def _verify(ca: x509.Certificate, cert: x509.Certificate) -> None:
    key = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                   cert.signature_hash_algorithm)
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(cert.signature, cert.tbs_certificate_bytes,
                   ec.ECDSA(cert.signature_hash_algorithm))


def test_generated_certificate_is_signed_by_the_bundle_and_names_the_service() -> None:
    docs = kinds(local.helm_template())
    secret = docs[("Secret", "tessera-webhook-tls")]["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    _verify(ca, cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"tessera-webhook.{NS}.svc" in sans.get_values_for_type(x509.DNSName)
    for kind in local.WEBHOOK_KINDS:
        for hook in docs[(kind, "tessera")]["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == secret["ca.crt"]


def test_cert_manager_is_used_when_present() -> None:
    out = subprocess.run(
        [str(local.helm()), "template", "tessera", str(local.CHART), "-n", NS,
         "--kube-version", local.KUBE_VERSION, "--api-versions", "cert-manager.io/v1"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    docs = kinds([d for d in yaml.safe_load_all(out) if d])
    assert ("Certificate", "tessera-webhook") in docs and ("Issuer", "tessera-webhook-selfsigned") in docs
    assert ("Secret", "tessera-webhook-tls") not in docs
    hook = docs[("MutatingWebhookConfiguration", "tessera")]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/tessera-webhook"
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]


def _rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", [""])
            for r in rule["resources"] for v in rule["verbs"]}


def test_scheduler_rbac_is_exactly_what_the_scheduler_declares() -> None:
    """The chart grants the scheduler the rules of deploy/rbac.yaml (what tessera-scheduler's own
    tests run it with): the same ClusterRole, and the same Role in the release namespace
    (creating reservation pods, the Lease)."""
    docs = kinds(local.helm_template())
    declared = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
                if d and d["kind"] in ("ClusterRole", "Role")}
    assert _rule_set(docs[("ClusterRole", "tessera-scheduler")]["rules"]) == _rule_set(
        declared["ClusterRole"]["rules"])
    assert _rule_set(docs[("Role", "tessera-scheduler")]["rules"]) == _rule_set(
        declared["Role"]["rules"])
    assert ("", "pods", "create") not in _rule_set(declared["ClusterRole"]["rules"])


def test_api_rbac_is_exactly_what_the_api_backend_declares() -> None:
    """The chart's tessera-api ClusterRole equals deploy/api-rbac.yaml, which the CLI-on-Kubernetes
    tests run the REST API server with."""
    docs = kinds(local.helm_template())
    declared = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "api-rbac.yaml").read_text())
                    if d and d["kind"] == "ClusterRole")
    assert _rule_set(docs[("ClusterRole", "tessera-api")]["rules"]) == _rule_set(declared["rules"])
    assert ("ServiceAccount", "tessera-api") in docs


def test_rendered_chart_applies_to_the_api_server(kube_cluster: TestCluster) -> None:
    """Everything the chart renders is accepted by the API server: applied for real, except the
    webhook configurations (server-side dry run: nothing serves the in-cluster Service here,
    and failurePolicy Fail would then refuse every GPU pod of the other tests)."""
    kube_cluster.kubectl("create", "namespace", NS, check=False)
    docs = local.helm_template(include_crds=True)
    hooks = [d for d in docs if d["kind"] in local.WEBHOOK_KINDS]
    rest = [d for d in docs if d["kind"] not in local.WEBHOOK_KINDS]
    out = local.apply(kube_cluster, rest)
    assert "deployment.apps/tessera-scheduler serverside-applied" in out
    assert "daemonset.apps/tessera-node-agent serverside-applied" in out
    out = local.apply(kube_cluster, hooks, "--dry-run=server")
    assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/tessera serverside-applied (server dry run)" in out
    for kind, name in (("deployment", "tessera-webhook"), ("priorityclass", "inference"),
                       ("clusterrole", "tessera-webhook")):
        got = kube_cluster.kubectl("get", kind, name, "-n", NS, "-o", "name")
        assert got.stdout.strip(), (kind, name)


def test_webhook_with_a_rule_missing_never_becomes_ready(kube_cluster: TestCluster) -> None:
    """Least privilege is tested, not assumed: without the chart's 'watch projects' rule the
    webhook cannot sync its caches, stays unready, and so never admits a GPU pod."""
    role = kinds(local.helm_template())[("ClusterRole", "tessera-webhook")]
    role["metadata"]["name"] = "tessera-webhook-crippled"
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["projects"]]
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "tessera-webhook-crippled"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "tessera-webhook-crippled"},
               "subjects": [{"kind": "ServiceAccount", "name": "crippled-webhook",
                             "namespace": NS}]}
    kubeconfig = kube_cluster.service_account_kubeconfig(NS, "crippled-webhook")
    local.apply(kube_cluster, [role, binding])
    with pytest.raises(RuntimeError, match="not ready"):
        hook = local.start_webhook(kube_cluster, name="crippled-webhook", kubeconfig=kubeconfig,
                                   timeout=6)
        hook.stop()
    assert kube_cluster.workdir is not None
    log = (kube_cluster.workdir / "logs" / "crippled-webhook.log").read_text()
    assert "projects" in log and "forbidden" in log.lower()
    # Registered anyway, it fails closed: GPU pods refused until its caches sync, others admitted.
    hook = local.start_webhook(kube_cluster, name="crippled-webhook", kubeconfig=kubeconfig,
                               wait_ready=False)
    client = kube_cluster.client()
    ns = "crippled-webhook-test"
    kube_cluster.kubectl("create", "namespace", ns, check=False)
    try:
        local.register(kube_cluster, hook)
        gpu = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "frac05", "annotations": {"gpu-fraction": "0.5"}},
               "spec": {"containers": [{"name": "main", "image": "x"}]}}
        with pytest.raises(ApiError) as info:
            client.create(codecs.from_dict(gpu), namespace=ns)
        assert "tessera-webhook: is starting (node and project caches not synced yet)" in \
            str(info.value.status.message)
        cpu = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
               "spec": {"containers": [{"name": "main", "image": "x"}]}}
        client.create(codecs.from_dict(cpu), namespace=ns)
    finally:
        local.unregister(kube_cluster)
        hook.stop()

def test_values_are_checked_by_the_chart_schema() -> None:
    from tessera.core.placement import POLICIES

    schema = json.loads((local.CHART / "values.schema.json").read_text())
    assert tuple(schema["properties"]["policy"]["properties"]["placement"]["enum"]) == POLICIES
    out = subprocess.run([str(local.helm()), "template", "t", str(local.CHART),
                          "--kube-version", local.KUBE_VERSION, "--set", "policy.placement=best"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "/policy/placement" in out.stderr, out.stderr


def _args(docs: dict[tuple[str, str], dict[str, Any]], name: str) -> list[str]:
    spec = docs[("Deployment", name)]["spec"]["template"]["spec"]
    return list(spec["containers"][0]["args"])


def test_components_accept_the_arguments_the_chart_gives_them(tmp_path: Path) -> None:
    """The Deployments' args parse: the webhook's with its own parser, the scheduler's by running
    it (it must get past argument parsing and fail only at the missing kubeconfig)."""
    from tessera.kube.admission.__main__ import parser

    docs = kinds(local.helm_template("webhook.defaultProject=shared"))
    args = parser().parse_args(_args(docs, "tessera-webhook"))
    assert (args.cert, args.default_project) == ("/tls/tls.crt", "shared")
    assert args.scheduler_user == f"system:serviceaccount:{NS}:tessera-scheduler"
    out = subprocess.run([sys.executable, "-m", "tessera.kube.scheduler",
                          *_args(docs, "tessera-scheduler"),
                          f"--kubeconfig={tmp_path / 'missing.kubeconfig'}"],
                         capture_output=True, text=True, timeout=60)
    assert "unrecognized arguments" not in out.stderr and out.returncode != 2, out.stderr
    assert "missing.kubeconfig" in out.stderr
