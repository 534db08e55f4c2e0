"""The test cluster itself: real API server, kwok nodes, RBAC, CRD validation, webhooks."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, ObjectReference, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, PodBinding
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import GPU_RESOURCE, GPU_UUIDS_ANNOTATION
from tests.waiting import wait_until


def test_api_server_reports_pinned_version(kube_cluster: TestCluster) -> None:
    out = kube_cluster.kubectl("version", "-o", "json").stdout
    versions = json.loads(out)
    assert versions["serverVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION
    assert versions["clientVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION


def test_gpu_nodes_have_capacity_labels_and_uuids(
    kube_cluster: TestCluster, kube_client: Client
) -> None:
    names = kube_cluster.gpu_nodes  # type: ignore[attr-defined]
    assert len(names) == 2
    all_uuids: set[str] = set()
    for name in names:
        node = kube_client.get(Node, name)
        assert node.status is not None and node.metadata is not None
        assert node.status.capacity is not None and node.status.allocatable is not None
        assert node.status.capacity[GPU_RESOURCE] == "8"
        assert node.status.allocatable[GPU_RESOURCE] == "8"
        ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
        assert ready and ready[0].status == "True", "kwok did not make the node Ready"
        labels = node.metadata.labels or {}
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["nvidia.com/gpu.memory"] == "81559"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/mig.capable"] == "true"
        uuids = (node.metadata.annotations or {})[GPU_UUIDS_ANNOTATION].split(",")
        assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)
        all_uuids.update(uuids)
    assert len(all_uuids) == 16, "GPU UUIDs must be unique across nodes"


def _pod(name: str, gpus: int = 1) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name),
        spec=PodSpec(
            schedulerName="tessera-test-manual",
            containers=[
                Container(
                    name="main",
                    image="example.invalid/cuda:latest",
                    resources=ResourceRequirements(
                        requests={GPU_RESOURCE: str(gpus)}, limits={GPU_RESOURCE: str(gpus)}
                    ),
                )
            ],
        ),
    )


def bind_pod(client: Client, namespace: str, pod: str, node: str) -> None:
    """POST pods/<pod>/binding. The API server answers 201 with a ``Status`` body, which
    lightkube 1.0.1 tries to decode as a Binding and fails (``msgspec.ValidationError``)."""
    with contextlib.suppress(msgspec.ValidationError):
        client.create(
            PodBinding(
                metadata=ObjectMeta(name=pod, namespace=namespace),
                target=ObjectReference(apiVersion="v1", kind="Node", name=node),
            ),
            pod,
            namespace=namespace,
        )


def test_pod_bound_through_binding_subresource_runs_and_deletes(
    kube_cluster: TestCluster, kube_client: Client, kube_namespace: str
) -> None:
    node = kube_cluster.gpu_nodes[0]  # type: ignore[attr-defined]
    kube_client.create(_pod("bound"), namespace=kube_namespace)
    pod = kube_client.get(Pod, "bound", namespace=kube_namespace)
    assert pod.status is not None and pod.status.phase == "Pending"
    bind_pod(kube_client, kube_namespace, "bound", node)

    def running() -> bool:
        p = kube_client.get(Pod, "bound", namespace=kube_namespace)
        return p.status is not None and p.status.phase == "Running"

    wait_until("the bound pod to be Running (kwok)", running)
    pod = kube_client.get(Pod, "bound", namespace=kube_namespace)
    assert pod.spec is not None and pod.spec.nodeName == node

    # There is no kubelet: kwok's pod-delete stage finishes graceful deletion.
    kube_client.delete(Pod, "bound", namespace=kube_namespace)

    def gone() -> bool:
        try:
            kube_client.get(Pod, "bound", namespace=kube_namespace)
        except ApiError as exc:
            return exc.status.code == 404
        return False

    wait_until("the deleted pod to disappear", gone)


def test_rbac_denies_service_account_without_rights(
    kube_cluster: TestCluster, kube_client: Client, kube_namespace: str
) -> None:
    sa = kube_cluster.service_account_client(kube_namespace, "no-rights")
    with pytest.raises(ApiError) as denied:
        list(sa.list(Pod, namespace=kube_namespace))
    assert denied.value.status.code == 403

    kube_client.create(
        Role(
            metadata=ObjectMeta(name="pod-reader"),
            rules=[PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
        namespace=kube_namespace,
    )
    kube_client.create(
        RoleBinding(
            metadata=ObjectMeta(name="no-rights-reads-pods"),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[Subject(kind="ServiceAccount", name="no-rights", namespace=kube_namespace)],
        ),
        namespace=kube_namespace,
    )

    def can_list() -> bool:
        try:
            list(sa.list(Pod, namespace=kube_namespace))
        except ApiError as exc:
            if exc.status.code == 403:
                return False
            raise
        return True

    wait_until("the RoleBinding to take effect", can_list, timeout=10)
    with pytest.raises(ApiError) as still_denied:
        list(sa.list(Node))
    assert still_denied.value.status.code == 403
    with pytest.raises(ApiError) as no_write:
        sa.create(_pod("sneaky"), namespace=kube_namespace)
    assert no_write.value.status.code == 403


def test_lean_client_lists_watches_and_reports_errors(kube_cluster: TestCluster,
                                                      kube_namespace: str) -> None:
    """The lean client (tessera.kube.rawapi, the scheduler's bindings and bench.kube's load)
    against the real API server: a list's bytes, a create whose reply is not decoded, a watch
    streaming one event per line until the pod is deleted, and error statuses (a create that
    exists, a watch of a resource that does not) raised as KubeHTTPError with their code."""
    import asyncio

    from lightkube import KubeConfig

    from tessera.kube.rawapi import KubeHTTPError, RawApi

    config = KubeConfig.from_file(str(kube_cluster.kubeconfig)).get()
    assert config is not None
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    body = msgspec.json.encode({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lean"},
                                "spec": {"containers": [{"name": "c", "image": "x.invalid/a"}]}})

    async def run() -> list[tuple[str, str]]:
        raw = RawApi(config, connections=2)
        listed = msgspec.json.decode(await raw.request_bytes("GET", pods))
        seen: list[tuple[str, str]] = []

        async def watch() -> None:
            async for line in raw.stream_lines(
                    f"{pods}?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"):
                event = msgspec.json.decode(line)
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if event["type"] == "DELETED":
                    return

        task = asyncio.create_task(watch())
        assert await raw.request("POST", pods, body, decode=False) is None
        with pytest.raises(KubeHTTPError) as exists:
            await raw.request("POST", pods, body)
        assert exists.value.code == 409
        await raw.request("DELETE", f"{pods}/lean?gracePeriodSeconds=0")
        await asyncio.wait_for(task, 30)
        with pytest.raises(KubeHTTPError) as missing:
            async for _ in raw.stream_lines(f"/api/v1/namespaces/{kube_namespace}/nosuch?watch=1"):
                pass
        assert missing.value.code == 404
        await raw.close()
        return seen

    seen = asyncio.run(run())
    assert seen[0] == ("ADDED", "lean") and seen[-1] == ("DELETED", "lean")


def test_lean_pods_watch_resumes_from_the_last_version(
        kube_cluster: TestCluster, kube_namespace: str) -> None:
    """The pods informer's watch (kube.lean_watch.LeanSource): when the API server ends a
    watch (here after 1 s), the next one starts from the last version seen, so every event
    arrives once, in order, with no list in between."""
    import asyncio

    from lightkube import KubeConfig

    from tessera.kube.lean_watch import LeanSource
    from tessera.kube.rawapi import RawApi

    config = KubeConfig.from_file(str(kube_cluster.kubeconfig)).get()
    assert config is not None
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    mine = {"spec.schedulerName": "lean-watch-test"}

    def body(name: str) -> bytes:
        return msgspec.json.encode({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                    "spec": {"schedulerName": "lean-watch-test", "containers": [
                                        {"name": "c", "image": "x.invalid/a"}]}})

    async def run() -> tuple[list[tuple[str, str]], int]:
        raw = RawApi(config, connections=2)
        await raw.request("POST", pods, body("before"), decode=False)
        source = LeanSource(raw, pods, mine, watch_seconds=1)
        listed, rv = await source.list()
        assert [p.metadata.name for p in listed] == ["before"]
        seen: list[tuple[str, str]] = []

        async def watch() -> None:
            async for kind, pod in source.watch(rv):
                seen.append((kind, pod.metadata.name))
                if (kind, pod.metadata.name) == ("DELETED", "b"):
                    return

        task = asyncio.create_task(watch())
        await raw.request("POST", pods, body("a"), decode=False)
        async def two_more() -> None:
            while source.watches < 3:  # two watches ended by the API server since "a"
                await asyncio.sleep(0.1)

        await asyncio.wait_for(two_more(), 30)
        await raw.request("POST", pods, body("b"), decode=False)
        await raw.request("DELETE", f"{pods}/b?gracePeriodSeconds=0")
        await asyncio.wait_for(task, 60)
        for name in ("before", "a"):
            await raw.request("DELETE", f"{pods}/{name}?gracePeriodSeconds=0")
        await raw.close()
        return seen, source.watches

    seen, watches = asyncio.run(run())
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "b")] or \
        seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b")], seen
    assert watches >= 3


def test_lease_renewal_is_one_write_and_a_lease_taken_meanwhile_is_seen(
        kube_cluster: TestCluster, kube_client: Client, kube_namespace: str) -> None:
    """tessera-scheduler's leader election (kube.leader) against the real API server: the
    holder renews with one write each time (no read first, as client-go's fast path); a
    standby reads and stands by; when someone else has written the Lease meanwhile, the
    holder's write gets 409, it reads the Lease, sees the new holder and stops leading."""
    import asyncio
    from collections import Counter

    from lightkube import AsyncClient, KubeConfig
    from lightkube.resources.coordination_v1 import Lease

    from tessera.kube.leader import LeaderElector

    config = KubeConfig.from_file(str(kube_cluster.kubeconfig))
    calls: Counter[str] = Counter()

    def counted(client: AsyncClient) -> AsyncClient:
        for verb in ("get", "create", "replace"):
            real = getattr(client, verb)

            async def call(*a: Any, _real: Any = real, _verb: str = verb, **k: Any) -> Any:
                calls[_verb] += 1
                return await _real(*a, **k)

            setattr(client, verb, call)
        return client

    async def run() -> list[tuple[bool, dict[str, int]]]:
        a = LeaderElector(counted(AsyncClient(config)), kube_namespace, "lease-test", "a",
                          lease_duration=30, renew_deadline=20, retry_period=2)
        b = LeaderElector(AsyncClient(config), kube_namespace, "lease-test", "b",
                          lease_duration=30, renew_deadline=20, retry_period=2)
        steps = []
        for who in (a, a, a, b):
            calls.clear()
            steps.append((await who.try_acquire_or_renew(), dict(calls)))
        lease = kube_client.get(Lease, "lease-test", namespace=kube_namespace)
        assert lease.spec is not None
        lease.spec.holderIdentity = "c"  # taken over (as after a: paused past the lease)
        kube_client.replace(lease)
        calls.clear()
        steps.append((await a.try_acquire_or_renew(), dict(calls)))
        # A takeover: d holds a 1 s Lease and stops renewing; e, having seen d's Lease stand
        # unchanged for 1 s by its own clock, takes it, and then knows itself as the holder it
        # has seen (keep() stops at once on a failed renewal when the holder seen is another).
        d = LeaderElector(AsyncClient(config), kube_namespace, "lease-test-2", "d",
                          lease_duration=1, renew_deadline=0.6, retry_period=0.2)
        e = LeaderElector(AsyncClient(config), kube_namespace, "lease-test-2", "e",
                          lease_duration=1, renew_deadline=0.6, retry_period=0.2)
        assert await d.try_acquire_or_renew() and not await e.try_acquire_or_renew()
        while not await e.try_acquire_or_renew():
            await asyncio.sleep(0.2)
        assert e._observed is not None and e._observed[0] == "e"
        assert await e.try_acquire_or_renew() and not await d.try_acquire_or_renew()
        return steps

    steps = asyncio.run(run())
    assert steps == [(True, {"get": 1, "create": 1}), (True, {"replace": 1}),
                     (True, {"replace": 1}), (False, {}), (False, {"replace": 1, "get": 1})]
    for name in ("lease-test", "lease-test-2"):
        kube_client.delete(Lease, name, namespace=kube_namespace)


def test_crd_schema_is_enforced_by_api_server(kube_client: Client, kube_namespace: str) -> None:
    group = "clustertest.tessera.io"
    crd = CustomResourceDefinition.from_dict(  # type: ignore[attr-defined]
        {
            "metadata": {"name": f"widgets.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "required": ["gpus"],
                                        "properties": {
                                            "gpus": {"type": "integer", "minimum": 1},
                                        },
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        }
    )
    kube_client.create(crd)

    def established() -> bool:
        got = kube_client.get(CustomResourceDefinition, f"widgets.{group}")
        conditions = (got.status.conditions if got.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until("the CRD to be Established", established)
    widget = create_namespaced_resource(group, "v1", "Widget", "widgets")

    def create_ok() -> bool:
        try:
            kube_client.create(
                widget(metadata=ObjectMeta(name="ok"), spec={"gpus": 2}), namespace=kube_namespace
            )
        except ApiError as exc:
            if exc.status.code == 404:  # discovery of the new type may lag a moment
                return False
            raise
        return True

    wait_until("the Widget type to be served", create_ok, timeout=10)
    with pytest.raises(ApiError) as invalid:
        kube_client.create(
            widget(metadata=ObjectMeta(name="bad"), spec={"gpus": 0}), namespace=kube_namespace
        )
    assert invalid.value.status.code == 422
    assert "spec.gpus" in (invalid.value.status.message or "")
    with pytest.raises(ApiError) as missing:
        kube_client.create(widget(metadata=ObjectMeta(name="empty"), spec={}),
                           namespace=kube_namespace)
    assert missing.value.status.code == 422
    kube_client.delete(CustomResourceDefinition, f"widgets.{group}")


class _DenyLabelled(BaseHTTPRequestHandler):
    """Validating webhook: rejects objects labelled tessera-test/deny=true."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        labels = (request.get("object") or {}).get("metadata", {}).get("labels") or {}
        allowed = labels.get("tessera-test/deny") != "true"
        response: dict[str, Any] = {"uid": request["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": "denied by the test webhook"}
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook_server(kube_cluster: TestCluster) -> Iterator[tuple[int, bytes]]:
    cert, key, ca_bundle = kube_cluster.issue_serving_cert("test-webhook")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DenyLabelled)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca_bundle
    finally:
        server.shutdown()
        server.server_close()


def test_validating_webhook_is_called(
    kube_client: Client, kube_namespace: str, webhook_server: tuple[int, bytes]
) -> None:
    import base64

    from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration

    port, ca_bundle = webhook_server
    name = f"deny-labelled-{kube_namespace}"
    config = ValidatingWebhookConfiguration.from_dict(  # type: ignore[attr-defined]
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "deny.clustertest.tessera.io",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/validate",
                        "caBundle": base64.b64encode(ca_bundle).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"tessera-test": kube_namespace}},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    kube_client.create(config)
    try:
        def denied() -> bool:
            try:
                kube_client.create(
                    ConfigMap(metadata=ObjectMeta(
                        name=f"deny-{time.monotonic_ns()}", labels={"tessera-test/deny": "true"}
                    )),
                    namespace=kube_namespace,
                )
            except ApiError as exc:
                assert "denied by the test webhook" in (exc.status.message or "")
                return True
            return False

        # The API server picks up new webhook configurations asynchronously.
        wait_until("the webhook to deny a labelled ConfigMap", denied, timeout=15)
        kube_client.create(ConfigMap(metadata=ObjectMeta(name="allowed")), namespace=kube_namespace)
    finally:
        kube_client.delete(ValidatingWebhookConfiguration, name)


def test_stop_leaves_no_processes_or_files() -> None:
    cluster = TestCluster()
    cluster.start()
    pids = [p.popen.pid for p in cluster.processes if p.popen is not None]
    workdir = cluster.workdir
    assert len(pids) == 3 and workdir is not None and workdir.is_dir()
    cluster.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not workdir.exists()


def test_cli_up_serves_until_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.testing.cluster", "up", f"--kubeconfig={kubeconfig}",
         "--nodes=2", "--gpus-per-node=4", "--gpu-model=A100-40GB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        assert lines[-1:] == ["ready"], (lines, proc.stderr.read() if proc.stderr else "")
        kubectl = next(x.split(": ", 1)[1] for x in lines if x.startswith("kubectl: "))
        out = subprocess.run(
            [kubectl, f"--kubeconfig={kubeconfig}", "get", "nodes", "-o",
             "jsonpath={range .items[*]}{.metadata.labels.nvidia\\.com/gpu\\.product}"
             " {.status.allocatable.nvidia\\.com/gpu}{'\\n'}{end}"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split("\n")
        assert [x for x in out if x] == ["NVIDIA-A100-SXM4-40GB 4"] * 2
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.rstrip().endswith("stopped")


def test_cli_rejects_unknown_gpu_model(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "tessera.testing.cluster", "up",
         f"--kubeconfig={tmp_path / 'k'}", "--gpu-model=H100-81GB"],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2
    assert "--gpu-model: unknown model 'H100-81GB'" in done.stderr
