"""The chart's values: the schema covers every value and refuses bad ones naming them, image
references follow repository/tag/digest, the API server + console, probes, PDBs and security
contexts are rendered, and the scheduler parses the policy arguments the chart gives it."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from tessera.core.usage import UsagePolicy
from tessera.kube import scheduler_main as sched
from tessera.testing import webhook as local

SCHEMA = json.loads((local.CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((local.CHART / "values.yaml").read_text())


def _kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _leaves(values: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in _leaves(v, (*path, k))]
    return [path]


def _schema_at(path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] = SCHEMA
    for key in path:
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]  # maps (nodeSelector, resources.requests)
        else:
            return None
    return node


def test_schema_covers_every_value_and_closes_every_object() -> None:
    missing = [".".join(p) for p in _leaves(VALUES) if _schema_at(p) is None]
    assert not missing, f"values without a schema: {missing}"

    def open_objects(node: dict[str, Any], where: str) -> list[str]:
        out = []
        if node.get("type") == "object" and "additionalProperties" not in node:
            out.append(where or "/")
        for k, v in node.get("properties", {}).items():
            out += open_objects(v, f"{where}/{k}")
        return out

    assert open_objects(SCHEMA, "") == []  # a misspelled key is refused, not silently ignored


def _template_error(*sets: str) -> str:
    cmd = [str(local.helm()), "template", "t", str(local.CHART), "--kube-version", local.KUBE_VERSION]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, f"helm accepted {sets}"
    return out.stderr


@pytest.mark.parametrize(("value", "named"), [
    ("policy.minRuntimeSeconds=-1", "/policy/minRuntimeSeconds"),
    ("policy.placement=best", "/policy/placement"),
    ("policy.reclaim=maybe", "/policy/reclaim"),
    ("scheduler.replicas=0", "/scheduler/replicas"),
    ("image.digest=latest", "/image/digest"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("api.service.type=External", "/api/service/type"),
    ("webhook.port=70000", "/webhook/port"),
    ("nodeAgent.onEscape=ignore", "/nodeAgent/onEscape"),
    ("scheduler.resources.requests.cpu=lots", "/scheduler/resources/requests/cpu"),
    ("isolation.libraryMount=relative", "/isolation/libraryMount"),
])
def test_bad_values_are_refused_naming_them(value: str, named: str) -> None:
    assert named in _template_error(value)


def test_misspelled_values_are_refused_naming_them() -> None:
    err = _template_error("policy.minRuntime=30")
    assert "/policy" in err and "minRuntime" in err


def _container(docs: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return dict(docs[(kind, name)]["spec"]["template"]["spec"]["containers"][0])


def test_image_reference_is_tag_or_digest() -> None:
    docs = _kinds(local.helm_template())
    assert _container(docs, "Deployment", "tessera-scheduler")["image"] == \
        "ghcr.io/tessera-gpu/tessera:0.1.0"
    assert _container(docs, "DaemonSet", "tessera-node-agent")["image"] == \
        "ghcr.io/tessera-gpu/tessera-node:0.1.0"
    d1, d2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    docs = _kinds(local.helm_template("image.repository=reg.example/t", "image.tag=v9",
                                      f"image.digest={d1}", f"image.nodeDigest={d2}",
                                      "image.pullSecrets[0]=regcred"))
    for kind, name in (("Deployment", "tessera-scheduler"), ("Deployment", "tessera-webhook"),
                       ("Deployment", "tessera-api")):
        assert _container(docs, kind, name)["image"] == f"reg.example/t@{d1}"
        spec = docs[(kind, name)]["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert _container(docs, "DaemonSet", "tessera-node-agent")["image"] == \
        f"ghcr.io/tessera-gpu/tessera-node@{d2}"


def test_api_server_console_service_and_optional_ingress() -> None:
    docs = _kinds(local.helm_template())
    assert ("Ingress", "tessera-api") not in docs
    api = _container(docs, "Deployment", "tessera-api")
    assert api["command"] == ["python3", "-m", "tessera.kube.api_server"]
    assert "--host=0.0.0.0" in api["args"] and "--port=8470" in api["args"]
    assert docs[("Deployment", "tessera-api")]["spec"]["template"]["spec"][
        "serviceAccountName"] == "tessera-api"
    svc = docs[("Service", "tessera-api")]["spec"]
    assert svc["ports"][0]["port"] == 80 and svc["ports"][0]["targetPort"] == "http"
    docs = _kinds(local.helm_template("api.ingress.enabled=true", "api.ingress.host=gpu.corp",
                                      "api.ingress.tlsSecretName=gpu-tls",
                                      "api.ingress.className=nginx"))
    ing = docs[("Ingress", "tessera-api")]["spec"]
    assert ing["ingressClassName"] == "nginx" and ing["tls"][0]["secretName"] == "gpu-tls"
    assert ing["rules"][0]["host"] == "gpu.corp"
    assert ("Deployment", "tessera-api") not in _kinds(local.helm_template("api.enabled=false"))


def test_every_component_has_probes_resources_and_a_locked_down_security_context() -> None:
    docs = _kinds(local.helm_template())
    for kind, name in (("Deployment", "tessera-scheduler"), ("Deployment", "tessera-webhook"),
                       ("Deployment", "tessera-api"), ("DaemonSet", "tessera-node-agent")):
        c = _container(docs, kind, name)
        assert "livenessProbe" in c, name
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], name
        sec = c["securityContext"]
        assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
        if kind == "DaemonSet":
            # The node agent: root (reads /proc of other users' processes with hostPID) and the
            # capabilities each of its functions needs, proven one by one under exactly this set
            # by tests/node/test_chart_privileges.py; docs/node-agent.md says why.
            assert sec["capabilities"] == {"drop": ["ALL"],
                                           "add": ["CHOWN", "FSETID", "KILL", "SYS_PTRACE"]}
        else:
            assert sec["capabilities"] == {"drop": ["ALL"]} and sec["runAsNonRoot"] is True
            pod = docs[(kind, name)]["spec"]["template"]["spec"]["securityContext"]
            assert pod["runAsUser"] == 65532 and pod["seccompProfile"]["type"] == "RuntimeDefault"
            assert "readinessProbe" in c, name


def test_pod_disruption_budgets() -> None:
    docs = _kinds(local.helm_template())
    assert docs[("PodDisruptionBudget", "tessera-webhook")]["spec"]["minAvailable"] == 1
    assert docs[("PodDisruptionBudget", "tessera-scheduler")]["spec"]["maxUnavailable"] == 1
    one = _kinds(local.helm_template("scheduler.replicas=1"))
    assert ("PodDisruptionBudget", "tessera-scheduler") not in one  # would block every drain


def test_scheduler_reads_every_policy_value_the_chart_passes() -> None:
    """The chart's scheduler arguments become the core's CycleConfig (the end-to-end effect on
    preemption is tests/kube/deploy/test_helm_install.py)."""
    docs = _kinds(local.helm_template("policy.placement=binpack", "policy.reclaim=false",
                                      "policy.minRuntimeSeconds=300"))
    args = _container(docs, "Deployment", "tessera-scheduler")["args"]
    parsed = sched.parser().parse_args(args)
    opts = sched.options_from_args(parsed)
    config = opts.cycle_config(evicting=False)
    assert config.policy == "binpack" and "reclaim" not in config.actions
    assert config.preempt_min_runtime == config.reclaim_min_runtime == 300
    parsed = sched.parser().parse_args(_container(_kinds(local.helm_template()), "Deployment",
                                                  "tessera-scheduler")["args"])
    config = sched.options_from_args(parsed).cycle_config(evicting=False)
    assert config.policy == "fgd" and "reclaim" in config.actions
    assert config.preempt_min_runtime == 60


def test_fair_share_history_values_reach_the_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    """Helm's policy.fairShareHistory[For] become the scheduler's time-based fair share; off by
    default; a bad value stops the scheduler before it starts, naming the flag and the rule."""
    args = _container(_kinds(local.helm_template(
        "policy.fairShareHistory=window=2d\\,half-life=6h",
        "policy.fairShareHistoryFor={research:half-life=1h}")), "Deployment", "tessera-scheduler")["args"]
    opts = sched.options_from_args(sched.parser().parse_args(args))
    assert opts.cycle_config(evicting=False).usage == UsagePolicy(window=2 * 86400, half_life=6 * 3600)
    assert dict(opts.fair_share_history_for) == {"research": (None, 3600.0)}
    plain = _container(_kinds(local.helm_template()), "Deployment", "tessera-scheduler")["args"]
    assert sched.options_from_args(sched.parser().parse_args(plain)).cycle_config(False).usage is None
    with pytest.raises(SystemExit) as info:
        sched.main(lambda *a: None, ["--fair-share-history", "half-life=400d"])  # type: ignore[arg-type,return-value]
    assert info.value.code == 2
    assert "--fair-share-history half-life: must be at most one year" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["--min-runtime-seconds=-5", "--min-runtime-seconds=soon",
                                 "--policy=best", "--min-runtime-seconds=inf"])
def test_scheduler_refuses_bad_policy_arguments_naming_the_flag(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        sched.parser().parse_args([bad])
    assert info.value.code == 2
    assert bad.split("=")[0] in capsys.readouterr().err


def test_node_agent_serves_the_dra_plugin_where_the_kubelet_looks() -> None:
    """The node DaemonSet mounts the kubelet's plugin directories and the CDI directory at the
    paths its arguments name (tessera-node parses them); dra.kubeletPlugin=false passes
    --no-dra-plugin and mounts none of them."""
    from tessera.node.cli import parser as node_parser

    def agent(*sets: str) -> tuple[Any, dict[str, str], dict[str, str]]:
        docs = _kinds(local.helm_template(*sets))
        c = _container(docs, "DaemonSet", "tessera-node-agent")
        spec = docs[("DaemonSet", "tessera-node-agent")]["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
        mounts = {m["mountPath"]: host[m["name"]] for m in c["volumeMounts"]}
        return node_parser().parse_args(["run", *c["args"]]), mounts, host

    args, mounts, _ = agent("dra.kubeletDir=/data/kubelet", "dra.cdiDir=/etc/cdi")
    assert not args.no_dra_plugin
    for flag, path in ((args.dra_registration_dir, "/data/kubelet/plugins_registry"),
                       (args.dra_plugin_dir, "/data/kubelet/plugins/gpu.tessera.io"),
                       (args.cdi_dir, "/etc/cdi")):
        assert flag == path and mounts[path] == path  # the host's path, seen at the same path
    args, mounts, host = agent("dra.kubeletPlugin=false")
    assert args.no_dra_plugin
    assert not {"dra-registry", "dra-plugin", "cdi"} & set(host)


def test_webhook_rewrites_requests_into_claims_only_when_asked() -> None:
    """dra.rewriteRequests renders --rewrite-to-claims (which the webhook parses), the
    ClusterRole rule for the templates (get and create, nothing else) and sideEffects
    NoneOnDryRun; off (the default) renders none of them."""
    from tessera.kube.admission.__main__ import parser as webhook_parser

    def webhook(*sets: str) -> tuple[Any, list[dict[str, Any]], str]:
        docs = _kinds(local.helm_template(*sets))
        c = _container(docs, "Deployment", "tessera-webhook")
        rules = docs[("ClusterRole", "tessera-webhook")]["rules"]
        side = docs[("MutatingWebhookConfiguration", "tessera")]["webhooks"][0]["sideEffects"]
        return webhook_parser().parse_args(c["args"]), rules, side

    args, rules, side = webhook()
    assert not args.rewrite_to_claims and side == "None"
    assert not [r for r in rules if r["apiGroups"] == ["resource.k8s.io"]]
    args, rules, side = webhook("dra.rewriteRequests=true")
    assert args.rewrite_to_claims and side == "NoneOnDryRun"
    assert [r for r in rules if r["apiGroups"] == ["resource.k8s.io"]] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
         "verbs": ["get", "create"]}]
