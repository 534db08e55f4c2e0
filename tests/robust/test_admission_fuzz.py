"""The webhook's admission review under fuzzed input (issue 14): whatever the pod, the
AdmissionReview answers with ``allowed`` true or false — never an exception, never a crash —
and a refusal names a field. Bodies over the bound are refused unread. The review runs through
the webhook's real ASGI app (``WebhookApp``) over httpx's ASGI transport; the cluster view is
data (one node of 8 H100s), not a double of any component."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.model import GpuDevice, Node
from tessera.core.units import MiB
from tessera.kube.admission.policy import ClusterView, WebhookConfig
from tessera.kube.admission.server import MAX_REVIEW_BODY, WebhookApp

NODES = [Node("n0", tuple(GpuDevice(f"u{i}", i, 81559 * MiB, "H100-80GB") for i in range(8)))]
APP = WebhookApp(ClusterView(nodes=lambda: NODES, project_of=lambda ns: "team-a"),
                 WebhookConfig())

KEYS = ["gpu-fraction", "gpu-memory", "gpu-fraction-limit", "gpu-memory-limit",
        "gpu-fraction-num-devices", "gpu-fraction-container-name", "tessera.io/gpu-portion",
        "tessera.io/gpu-memory", "tessera.io/gpu-memory-limit", "tessera.io/gpu-devices",
        "tessera.io/gpu-model", "tessera.io/placement", "runai-gpu-memory"]
NASTY = st.sampled_from(["0.5", "1e999999", "1e400", "9" * 5000, "-1", "", "\x00", "\ud800",
                         "0." + "5" * 3000, "5G", "5000", "NaN", "inf", "1e-999999", "²",
                         "٣", " 1 ", "1\n", "10Gi", "0x10"])
TEXT = st.one_of(NASTY, st.text(max_size=30))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(TEXT, inner, max_size=3)),
                       max_leaves=8)
ENV = st.lists(st.fixed_dictionaries({"name": st.sampled_from(
    ["RUNAI_GPU_MEMORY_LIMIT", "NVIDIA_VISIBLE_DEVICES", "TESSERA_GPU_CONFIG", "X",
     "TESSERA_ISOLATION_FAULT"]), "value": TEXT}), max_size=3)
ENV_FROM = st.lists(st.fixed_dictionaries({"configMapRef": st.fixed_dictionaries(
    {"name": st.just("cm")})}, optional={"prefix": TEXT}), max_size=2)
CONTAINER = st.fixed_dictionaries({"name": st.sampled_from(["main", "side"]), "image": TEXT},
                                  optional={"env": ENV, "envFrom": ENV_FROM,
                                            "resources": st.fixed_dictionaries({"limits": st.dictionaries(
                                                st.sampled_from(["nvidia.com/gpu", "aliyun.com/gpu-mem",
                                                                 "cpu"]), JSONISH, max_size=2)}),
                                            "securityContext": JSONISH})
POD = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": TEXT}, optional={
        "annotations": st.dictionaries(st.sampled_from(KEYS), TEXT, max_size=3),
        "labels": st.dictionaries(st.sampled_from(["aliyun.com/gpu-count", "a"]), TEXT,
                                  max_size=2)}),
    "spec": st.fixed_dictionaries({"containers": st.lists(CONTAINER, min_size=1, max_size=2)},
                                  optional={"schedulerName": st.sampled_from(
                                      ["tessera", "default-scheduler", ""]),
                                      "ephemeralContainers": st.lists(CONTAINER, max_size=1),
                                      "initContainers": st.lists(CONTAINER, max_size=1)}),
}) | JSONISH


def review(pod: Any, operation: str, sub: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "u1", "kind": {"kind": "Pod"}, "operation": operation,
                               "namespace": "ns", "object": pod, "oldObject": pod,
                               "userInfo": {"username": "someone"}}
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


LOOP = asyncio.new_event_loop()
CLIENT = httpx.AsyncClient(transport=httpx.ASGITransport(app=APP), base_url="https://webhook")


def post(path: str, body: bytes) -> httpx.Response:
    return LOOP.run_until_complete(CLIENT.post(path, content=body, headers={
        "Content-Type": "application/json"}))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(pod=POD, operation=st.sampled_from(["CREATE", "UPDATE"]),
       sub=st.sampled_from([None, "ephemeralcontainers", "status"]),
       path=st.sampled_from(["/mutate", "/validate"]))
def test_any_review_gets_an_answer_that_names_a_field(pod: Any, operation: str, sub: str | None,
                                                      path: str) -> None:
    r = post(path, json.dumps(review(pod, operation, sub)).encode())
    assert r.status_code == 200
    out = r.json()["response"]
    assert out["uid"] == "u1"
    if not out["allowed"]:
        message = out["status"]["message"]
        assert "internal error" not in message, message
        assert ": " in message, message  # "FIELD: rule"
    if "patch" in out:
        json.loads(base64.b64decode(out["patch"]))


def test_a_review_body_over_the_bound_is_refused_unread() -> None:
    big = json.dumps(review({"metadata": {"name": "x" * MAX_REVIEW_BODY}}, "CREATE", None))
    r = post("/mutate", big.encode())
    assert r.status_code == 413
    r = post("/validate", b"{not json")
    assert r.status_code == 400
