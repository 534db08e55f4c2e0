"""`helm install` of deploy/helm/tessera on a real API server, and every control-plane component
started from what the installed objects say: the image the Deployment names (by digest, the
images `./dev image` built, unpacked), the exact command, args and env, the Secret and emptyDir
volumes at their mount paths, the pod's ServiceAccount token where Kubernetes mounts it, the
user and read-only root of its securityContext (tessera.testing.oci: chroot in a private mount
namespace, since kwok runs no containers). The webhook is called by the API server through its
in-cluster Service (tessera.testing.service_proxy plays kube-proxy for the ClusterIP). Then a
Run:ai manifest is admitted and bound, the console is served through its Service, a policy value
changes what is preempted, and `helm upgrade` / `helm uninstall` leave nothing behind.

The node side runs as the harness's tessera-node processes (tessera.testing.node_agents: the
fake NVML and kubelet double a DaemonSet pod cannot have here), with the chart's ServiceAccount
and RBAC. The cluster is this module's own: the chart's webhooks fail closed and its
cluster-scoped objects would collide with the other tests' copies."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, Secret, Service

from tessera.kube import names
from tessera.kube.objects import ProjectResource
from tessera.testing import oci
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster, free_ports
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.node_agents import NodeAgents, start_node_agents
from tessera.testing.service_proxy import ServiceProxy
from tests import waiting
from tests.kube import image_fixtures

pytestmark = image_fixtures.skip_without_images("tests/kube/deploy/test_helm_install.py")

RELEASE, NS = "tessera", "tessera-system"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MODEL = "T4-16GB"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0,
               alive: Callable[[], None] | None = None) -> Any:
    return waiting.wait_until(what, check, timeout, interval=0.2, alive=alive,
                              ignore=(ApiError, httpx.HTTPError))


@dataclass
class Component:
    """One Deployment's pod, run as a process from the installed object."""
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def check(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, \
            f"{self.name} exited:\n{self.log.read_text()[-3000:]}"

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class Install:
    cluster: TestCluster
    client: Client
    work: Path
    images: dict[str, oci.UnpackedImage]
    digests: dict[str, str]
    values: list[str]
    components: dict[str, Component] = field(default_factory=dict)
    proxies: list[ServiceProxy] = field(default_factory=list)
    agents: NodeAgents | None = None
    nodes: list[str] = field(default_factory=list)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(local.helm()), *args, f"--kubeconfig={self.cluster.kubeconfig}"],
                             capture_output=True, text=True, timeout=180)
        if check:
            assert out.returncode == 0, out.stdout + out.stderr
        return out

    def manifest(self) -> list[dict[str, Any]]:
        out = self.helm("get", "manifest", RELEASE, "-n", NS).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    # ---- a pod's process from its Deployment ------------------------------------------------
    def command(self, deployment: str) -> list[str]:
        dep = self.client.get(Deployment, deployment, namespace=NS)
        spec = dep.to_dict()["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        image = next((name for name, d in self.digests.items() if c["image"].endswith("@" + d)),
                     None)
        assert image is not None, f"{deployment} runs {c['image']}, not an image built here"
        img = self.images[image]
        pod_name = f"{deployment}-0"
        env: dict[str, str] = {}
        for e in c.get("env", []):
            if "valueFrom" not in e:  # an empty value comes back without its "value" key
                env[e["name"]] = e.get("value", "")
                continue
            src = e["valueFrom"]
            if "fieldRef" in src:
                env[e["name"]] = {"metadata.name": pod_name, "metadata.namespace": NS,
                                  "spec.nodeName": "control-plane-0"}[src["fieldRef"]["fieldPath"]]
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                env[e["name"]] = (self.client.get(ConfigMap, ref["name"], namespace=NS).data
                                  or {})[ref["key"]]
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                data = self.client.get(Secret, ref["name"], namespace=NS).data or {}
                env[e["name"]] = base64.b64decode(data[ref["key"]]).decode()
            else:
                raise AssertionError(f"{deployment}: env source {src} not handled")
        port = self.cluster.server.rsplit(":", 1)[1]
        env.update({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port})
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        pod_dir = self.work / deployment
        pod_dir.mkdir(mode=0o755, exist_ok=True)
        pod_sec = spec.get("securityContext", {})
        sec = {**pod_sec, **c.get("securityContext", {})}
        uid, gid = int(sec["runAsUser"]), int(sec.get("runAsGroup", sec["runAsUser"]))
        for vm in c.get("volumeMounts", []):
            vol = volumes[vm["name"]]
            d = pod_dir / vm["name"]
            d.mkdir(mode=0o755, exist_ok=True)
            if "secret" in vol:
                data = self.client.get(Secret, vol["secret"]["secretName"], namespace=NS).data or {}
                for k, v in data.items():
                    (d / k).write_bytes(base64.b64decode(v))
                    (d / k).chmod(0o644)
            elif "emptyDir" in vol:
                os.chown(d, 0, int(pod_sec.get("fsGroup", gid)))
                d.chmod(0o2775)  # what fsGroup gives a pod's volume
            else:
                raise AssertionError(f"{deployment}: volume {vol} not handled here")
            mounts[vm["mountPath"]] = d
        mounts[SA_DIR] = self.token_dir(spec["serviceAccountName"], pod_dir)
        argv = [*c.get("command", []), *c.get("args", [])]
        return img.command(argv, env=env, mounts=mounts, user=(uid, gid),
                           read_only_root=bool(sec.get("readOnlyRootFilesystem")))

    def token_dir(self, account: str, pod_dir: Path) -> Path:
        kubeconfig = self.cluster.service_account_kubeconfig(NS, account, create=False)
        doc = yaml.safe_load(kubeconfig.read_text())
        d = pod_dir / "serviceaccount"
        d.mkdir(mode=0o755, exist_ok=True)
        (d / "token").write_text(doc["users"][0]["user"]["token"])
        assert self.cluster.pki is not None
        (d / "ca.crt").write_bytes(self.cluster.pki.ca_cert.read_bytes())
        (d / "namespace").write_text(NS)
        for f in d.iterdir():
            f.chmod(0o644)
        return d

    def start(self, deployment: str) -> Component:
        comp = Component(deployment, self.command(deployment), self.work / f"{deployment}.log")
        comp.start()
        self.components[deployment] = comp
        return comp

    def restart(self, deployment: str) -> Component:
        old = self.components.pop(deployment)
        assert old.stop() == 0, old.log.read_text()[-3000:]
        return self.start(deployment)

    def proxy(self, service: str) -> ServiceProxy:
        svc = self.client.get(Service, service, namespace=NS)
        assert svc.spec is not None and svc.spec.clusterIP and svc.spec.ports
        port = svc.spec.ports[0]
        target = int(port.targetPort) if str(port.targetPort).isdigit() else None
        if target is None:  # a named port: the Deployment's containerPort of that name
            dep = self.client.get(Deployment, service, namespace=NS).to_dict()
            ports = dep["spec"]["template"]["spec"]["containers"][0]["ports"]
            target = next(p["containerPort"] for p in ports if p["name"] == port.targetPort)
        p = ServiceProxy(svc.spec.clusterIP, port.port, target)
        p.start()
        self.proxies.append(p)
        return p

    def alive(self) -> None:
        for c in self.components.values():
            c.check()

    def stop(self) -> None:
        for c in self.components.values():
            c.stop()
        self.components.clear()
        for p in self.proxies:
            p.stop()
        self.proxies.clear()
        if self.agents is not None:
            self.agents.stop()
            self.agents = None


@pytest.fixture(scope="module")
def install(built: dict[str, Any], images: dict[str, oci.UnpackedImage],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    work = tmp_path_factory.mktemp("install")
    work.chmod(0o755)
    cluster = TestCluster(device_classes=False)  # the chart installs them
    cluster.start()
    try:
        nodes = cluster.create_gpu_nodes(1, NodeShape(gpus=1, model=MODEL), prefix="t4-",
                                         node_agents=False)
        digests = {name: img["digest"] for name, img in built["images"].items()}
        hook_port, api_port, health_port = free_ports(3)
        values = [f"image.digest={digests['tessera']}",
                  f"image.nodeDigest={digests['tessera-node']}",
                  "image.pullPolicy=Never", "scheduler.replicas=1", "webhook.replicas=1",
                  f"webhook.port={hook_port}", f"api.port={api_port}",
                  f"scheduler.healthPort={health_port}", "webhook.certManager.enabled=false",
                  "policy.minRuntimeSeconds=3600", "api.ingress.enabled=true"]
        inst = Install(cluster, cluster.client(), work, images, digests, values, nodes=nodes)
        args = ["install", RELEASE, str(local.CHART), "-n", NS, "--create-namespace"]
        for v in values:
            args += ["--set", v]
        inst.helm(*args)
        yield inst
    finally:
        with contextlib.suppress(NameError):
            inst.stop()
        cluster.stop()


@pytest.fixture(scope="module")
def running(install: Install) -> Install:
    """The control plane started from the installed Deployments; the node agents as the chart's
    ServiceAccount."""
    inst = install
    agent_kc = inst.cluster.service_account_kubeconfig(NS, "tessera-node-agent", create=False)
    inst.agents = start_node_agents(inst.cluster, inst.nodes, kubeconfig=agent_kc)
    inst.agents.wait_ready(timeout=60)
    hook = inst.start("tessera-webhook")
    inst.proxy("tessera-webhook")
    inst.start("tessera-scheduler")
    inst.start("tessera-api")
    inst.proxy("tessera-api")
    secret = inst.client.get(Secret, "tessera-webhook-tls", namespace=NS).data or {}
    ca = base64.b64decode(secret["ca.crt"])
    ctx = ssl.create_default_context(cadata=ca.decode())
    svc = inst.client.get(Service, "tessera-webhook", namespace=NS)
    assert svc.spec is not None
    # through the Service's ClusterIP, checking the name the API server checks
    with httpx.Client(verify=ctx, timeout=2) as http:
        wait_until("webhook ready through its Service", lambda: http.get(
            f"https://{svc.spec.clusterIP}:443/readyz",
            extensions={"sni_hostname": f"tessera-webhook.{NS}.svc"}).status_code == 200,
            alive=hook.check)
    return inst


def _project(inst: Install, ns: str, deserved: float) -> None:
    inst.client.create(Namespace(metadata=ObjectMeta(name=ns)))
    inst.client.create(ProjectResource(metadata=ObjectMeta(name=ns), spec={
        "namespace": ns, "resources": {"gpu": {"deserved": deserved}}}))


def _wait_project_seen(inst: Install, ns: str) -> None:
    probe = _runai_pod("probe", "0.5")
    wait_until("the webhook knows the project", lambda: inst.client.create(
        codecs.from_dict(probe), namespace=ns, dry_run=True), timeout=30, alive=inst.alive)


def _runai_pod(name: str, fraction: str) -> dict[str, Any]:
    """A pod as `runai submit NAME -i IMAGE -g 0.5` creates it (Run:ai's scheduler name)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"project": "team-a", "release": name},
                         "annotations": {"gpu-fraction": fraction, names.GPU_MODEL: MODEL}},
            "spec": {"schedulerName": "runai-scheduler", "restartPolicy": "Never",
                     "containers": [{"name": name, "image": "runai.jfrog.io/demo/quickstart"}]}}


def _bound(inst: Install, ns: str, name: str, timeout: float = 60) -> Pod:
    def check() -> Pod | None:
        pod = inst.client.get(Pod, name, namespace=ns)
        return pod if pod.spec and pod.spec.nodeName else None
    pod: Pod = wait_until(f"{ns}/{name} bound", check, timeout, alive=inst.alive)
    return pod


def _delete_all(inst: Install, ns: str) -> None:
    for pod in inst.client.list(Pod, namespace=ns):
        with contextlib.suppress(ApiError):
            inst.client.delete(Pod, pod.metadata.name, namespace=ns, grace_period=0)
    wait_until(f"pods of {ns} gone", lambda: not list(inst.client.list(Pod, namespace=ns)))


# ---- the tests (in file order: install, use, upgrade, uninstall) ------------------------------
def test_every_object_of_the_release_is_accepted_by_the_api_server(install: Install) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in install.manifest()}
    for key in [("Deployment", "tessera-scheduler"), ("Deployment", "tessera-webhook"),
                ("Deployment", "tessera-api"), ("Service", "tessera-api"),
                ("Ingress", "tessera-api"), ("DaemonSet", "tessera-node-agent"),
                ("MutatingWebhookConfiguration", "tessera"), ("PodDisruptionBudget", "tessera-webhook")]:
        assert key in kinds, key
    for d in install.manifest():
        ns = ["-n", NS] if d["metadata"].get("namespace") or d["kind"] not in (
            "ClusterRole", "ClusterRoleBinding", "PriorityClass", "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding") else []
        got = install.cluster.kubectl("get", d["kind"], d["metadata"]["name"], *ns, "-o", "name",
                                      check=False)
        assert got.returncode == 0 and got.stdout.strip(), (d["kind"], d["metadata"]["name"], got.stderr)
    # the images are referenced by the digests the build printed
    dep = install.client.get(Deployment, "tessera-scheduler", namespace=NS).to_dict()
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == \
        f"ghcr.io/tessera-gpu/tessera@{install.digests['tessera']}"


def test_runai_manifest_is_admitted_and_bound_through_the_installed_components(
        running: Install) -> None:
    inst = running
    ns = "runai-team-a"
    _project(inst, ns, deserved=1)
    _wait_project_seen(inst, ns)
    inst.client.create(codecs.from_dict(_runai_pod("quickstart", "0.5")), namespace=ns)
    pod = _bound(inst, ns, "quickstart")
    assert pod.spec is not None and pod.spec.nodeName == inst.nodes[0]
    assert pod.spec.schedulerName == "tessera"  # the webhook took it over from runai-scheduler
    ann = (pod.metadata.annotations if pod.metadata else None) or {}
    assert names.PLACEMENT in ann
    env = {e.name for c in pod.spec.containers for e in (c.env or [])}
    assert any(n.startswith("TESSERA_") for n in env), env  # wired to the share's config
    _delete_all(inst, ns)


def test_console_and_api_are_served_through_the_service(running: Install) -> None:
    svc = running.client.get(Service, "tessera-api", namespace=NS)
    assert svc.spec is not None
    base = f"http://{svc.spec.clusterIP}:{svc.spec.ports[0].port}"
    r = wait_until("API healthz", lambda: httpx.get(f"{base}/healthz", timeout=5),
                   alive=running.alive)
    assert r.status_code == 200
    # the API's own documentation page (served offline, from the image's files)
    page = httpx.get(f"{base}/docs", timeout=5, follow_redirects=True)
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert httpx.get(f"{base}/api/v1/workloads", timeout=5).status_code == 401  # token needed


def test_min_runtime_value_changes_what_is_preempted_and_upgrade_applies_it(
        running: Install) -> None:
    """Installed with policy.minRuntimeSeconds=3600: an inference pod does not preempt a young
    train pod. `helm upgrade --set policy.minRuntimeSeconds=0` rolls the scheduler's args; the
    scheduler restarted from the upgraded Deployment preempts it."""
    inst = running
    ns = "preempt-team"
    _project(inst, ns, deserved=1)
    _wait_project_seen(inst, ns)
    low = _runai_pod("train", "0.75")
    inst.client.create(codecs.from_dict(low), namespace=ns)
    _bound(inst, ns, "train")
    high = _runai_pod("serve", "0.75")
    high["metadata"]["annotations"][names.PRIORITY_CLASS] = "inference"
    inst.client.create(codecs.from_dict(high), namespace=ns)

    def waiting_message() -> str | None:
        pod = inst.client.get(Pod, "serve", namespace=ns)
        for c in (pod.status.conditions if pod.status else None) or []:
            if c.type == "PodScheduled" and c.status == "False":
                return c.message or "?"
        return None

    msg = wait_until("serve explained as waiting", waiting_message, alive=inst.alive)
    time.sleep(2)  # a few more cycles: still nothing preempted
    assert inst.client.get(Pod, "train", namespace=ns).metadata is not None
    assert not inst.client.get(Pod, "serve", namespace=ns).spec.nodeName  # type: ignore[union-attr]
    tls_before = inst.client.get(Secret, "tessera-webhook-tls", namespace=NS).data

    values = [v for v in inst.values if not v.startswith(("policy.minRuntimeSeconds",
                                                          "api.ingress"))]
    args = ["upgrade", RELEASE, str(local.CHART), "-n", NS]
    for v in [*values, "policy.minRuntimeSeconds=0", "api.ingress.enabled=false"]:
        args += ["--set", v]
    inst.helm(*args)
    dep = inst.client.get(Deployment, "tessera-scheduler", namespace=NS).to_dict()
    assert "--min-runtime-seconds=0" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    inst.restart("tessera-scheduler")

    def preempted() -> bool:
        try:
            inst.client.get(Pod, "train", namespace=ns)
            return False
        except ApiError as exc:
            return exc.status.code == 404
    wait_until(f"train preempted (was waiting: {msg})", preempted, alive=inst.alive)
    _bound(inst, ns, "serve")
    # the upgrade removed what it no longer renders, and kept the webhook's certificate
    got = inst.cluster.kubectl("get", "ingress", "tessera-api", "-n", NS, check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr
    assert inst.client.get(Secret, "tessera-webhook-tls", namespace=NS).data == tls_before
    _delete_all(inst, ns)


def test_uninstall_leaves_nothing_behind(running: Install) -> None:
    inst = running
    manifest = inst.manifest()
    wait_until("reservation pods released", lambda: not [
        p for p in inst.client.list(Pod, namespace=NS,
                                    labels={names.RESERVATION_LABEL: "true"})], timeout=60,
               alive=inst.alive)
    inst.stop()
    inst.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "60s")
    left = []
    for d in manifest:
        cluster_scoped = d["kind"] in ("ClusterRole", "ClusterRoleBinding", "PriorityClass",
                                       "MutatingWebhookConfiguration",
                                       "ValidatingWebhookConfiguration")
        ns = [] if cluster_scoped else ["-n", NS]
        got = inst.cluster.kubectl("get", d["kind"], d["metadata"]["name"], *ns, check=False)
        if got.returncode == 0:
            left.append((d["kind"], d["metadata"]["name"]))
    assert not left, left
    # nothing else carries the release's marks (helm's release Secrets included)
    out = inst.cluster.kubectl("get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,"
                               "clusterroles,clusterrolebindings,poddisruptionbudgets,ingresses,"
                               "mutatingwebhookconfigurations,validatingwebhookconfigurations,"
                               "priorityclasses", "-A", "-o", "json").stdout
    marked = [f"{i['kind']}/{i['metadata']['name']}" for i in json.loads(out)["items"]
              if (i["metadata"].get("annotations") or {}).get("meta.helm.sh/release-name") == RELEASE
              or (i["metadata"].get("labels") or {}).get("owner") == "helm"]
    assert not marked, marked
    # CRDs stay, as Helm does with crds/
    got = inst.cluster.kubectl("get", "crd", "projects.tessera.io", check=False)
    assert got.returncode == 0
