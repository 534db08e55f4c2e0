"""The webhook answers reviews concurrently and each review's cost is bounded: a pod with
20,000 containers is refused naming the bound, and small reviews are answered while a big one
is being checked (tessera.kube.admission.server, shape.MAX_CONTAINERS)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest

from tessera.core.model import GpuDevice, Node
from tessera.core.units import MiB
from tessera.kube.admission.policy import ClusterView, WebhookConfig
from tessera.kube.admission.server import WebhookApp
from tessera.kube.admission.shape import MAX_CONTAINER_ENV, MAX_CONTAINERS, MAX_POD_ENV

NODES = [Node("n0", tuple(GpuDevice(f"u{i}", i, 81559 * MiB, "H100-80GB") for i in range(8)))]


def _app() -> WebhookApp:
    return WebhookApp(ClusterView(nodes=lambda: NODES, project_of=lambda ns: "team-a"),
                      WebhookConfig())


def _review(containers: int, uid: str, env: int = 1) -> bytes:
    pod: dict[str, Any] = {
        "metadata": {"name": uid, "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "tessera", "containers": [
            {"name": f"c{i}", "image": "busybox",
             "env": [{"name": f"E{j}", "value": "x"} for j in range(env)],
             "resources": {"limits": {"cpu": "1"}}} for i in range(containers)]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "kind": {"kind": "Pod"}, "operation": "CREATE",
                                   "namespace": "ns", "object": pod}}).encode()


async def _post(client: httpx.AsyncClient, path: str, body: bytes,
                done: list[str], name: str) -> dict[str, Any]:
    r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    done.append(name)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()["response"]
    return out


def test_a_20000_container_pod_is_refused_naming_the_bound() -> None:
    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                     base_url="https://webhook") as c:
            return await _post(c, "/mutate", _review(20_000, "huge"), [], "huge")

    out = asyncio.run(run())
    assert not out["allowed"]
    message = out["status"]["message"]
    assert message.startswith("spec.containers: ") and f"at most {MAX_CONTAINERS}" in message
    assert "(got 20000)" in message


def test_env_entries_of_a_container_are_bounded() -> None:
    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                     base_url="https://webhook") as c:
            return await _post(c, "/validate", _review(1, "env", env=MAX_CONTAINER_ENV + 1),
                               [], "env")

    out = asyncio.run(run())
    assert not out["allowed"]
    assert out["status"]["message"].startswith("spec.containers[0].env: ")
    assert f"at most {MAX_CONTAINER_ENV}" in out["status"]["message"]


def test_env_entries_of_a_pod_are_bounded_in_all() -> None:
    per = MAX_POD_ENV // 8 + 1  # under the per-container bound, over the pod's in 8 containers

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                     base_url="https://webhook") as c:
            return await _post(c, "/mutate", _review(8, "envs", env=per), [], "envs")

    out = asyncio.run(run())
    assert not out["allowed"]
    assert out["status"]["message"].startswith("spec.containers[*].env: ")
    assert f"(got {8 * per})" in out["status"]["message"]


def test_small_reviews_are_answered_while_a_big_one_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The largest pod allowed (MAX_CONTAINERS containers, MAX_POD_ENV env entries) is
    sent first, and its rules are held (an Event the test sets) until ten one-container reviews
    sent just after are all answered. Reviewed one at a time on the event loop (before), the
    held review blocked them all: it is released by its own timeout only, and answered first."""
    import tessera.kube.admission.server as server

    release = threading.Event()
    rules = server.review_mutate_claims

    def held(request: dict[str, Any], *args: Any) -> Any:
        if request.get("uid") == "big":
            release.wait(timeout=10)
        return rules(request, *args)

    monkeypatch.setattr(server, "review_mutate_claims", held)
    big = _review(MAX_CONTAINERS, "big", env=MAX_POD_ENV // MAX_CONTAINERS)

    async def run() -> list[str]:
        done: list[str] = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                     base_url="https://webhook") as c:
            first = asyncio.ensure_future(_post(c, "/mutate", big, done, "big"))
            await asyncio.sleep(0.01)
            small = [asyncio.ensure_future(_post(c, "/mutate", _review(1, f"s{i}"), done,
                                                 f"small{i}")) for i in range(10)]
            outs = await asyncio.gather(*small)
            release.set()
            assert all(o["allowed"] for o in outs), outs
            assert (await first)["allowed"]
        return done

    done = asyncio.run(run())
    assert done[-1] == "big", done
