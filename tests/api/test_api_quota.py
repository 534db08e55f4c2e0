"""Projects and quota through the API: limits, deserved quota, reclaim of over-quota work."""

from __future__ import annotations

import httpx

from tessera.testing.embedded import EmbeddedServer, submit_body


def _project(c: httpx.Client, name: str, deserved: float, limit: float | None = None) -> None:
    r = c.post("/api/v1/org-unit/projects", json={
        "name": name, "resources": {"gpu": {"deserved": deserved, "limit": limit}}})
    assert r.status_code == 201, r.text


def _submit(c: httpx.Client, kind: str, body: dict) -> str:  # type: ignore[type-arg]
    r = c.post(f"/api/v1/workloads/{kind}", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["workloadId"])


def test_limit_and_deserved_quota(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "q-lim", deserved=0.5, limit=0.6)
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "too-big", "q-lim", gpuPortionRequest=0.7))
        assert r.status_code == 422 and "limit" in r.json()["message"]
        first = _submit(c, "trainings", submit_body("first", "q-lim", gpuPortionRequest=0.4))
        server.wait_phase(c, "trainings", first, "Running")
        second = _submit(c, "trainings", submit_body("second", "q-lim", gpuPortionRequest=0.3))
        w = server.wait_phase(c, "trainings", second, "Pending")
        for _ in range(100):
            w = c.get(f"/api/v1/workloads/trainings/{second}").json()
            if "limit" in w["phaseMessage"]:
                break
        assert "project q-lim is at its limit" in w["phaseMessage"]
        ws = _submit(c, "workspaces", submit_body("ws", "q-lim", gpuPortionRequest=0.2))
        for _ in range(100):
            w = c.get(f"/api/v1/workloads/workspaces/{ws}").json()
            if "deserved" in w["phaseMessage"]:
                break
        assert w["phase"] == "Pending"
        assert "non-preemptible workloads must fit in project q-lim's deserved quota" in w[
            "phaseMessage"]
        for wid, kind in ((first, "trainings"), (second, "trainings"), (ws, "workspaces")):
            c.delete(f"/api/v1/workloads/{kind}/{wid}")


def test_reclaim_over_quota_workload(server: EmbeddedServer) -> None:
    """Project B (deserved 2) takes back GPUs that A (deserved 0) borrowed; A's train requeues."""
    with server.http() as c:
        _project(c, "q-a", deserved=0)
        _project(c, "q-b", deserved=2)
        borrowed = _submit(c, "trainings", submit_body("borrow", "q-a", gpuDevicesRequest=2))
        server.wait_phase(c, "trainings", borrowed, "Running")
        owner = _submit(c, "workspaces", submit_body("owner", "q-b", gpuDevicesRequest=1))
        server.wait_phase(c, "workspaces", owner, "Running")
        w = server.wait_phase(c, "trainings", borrowed, "Pending")
        kinds = [e["kind"] for e in w["events"]]
        assert "Preempted" in kinds and "Requeued" in kinds
        preempted = next(e for e in w["events"] if e["kind"] == "Preempted")
        assert "reclaimed" in preempted["message"] and "q-b" in preempted["message"]
        c.delete(f"/api/v1/workloads/workspaces/{owner}")
        server.wait_phase(c, "trainings", borrowed, "Running")
        c.delete(f"/api/v1/workloads/trainings/{borrowed}")
