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
        for wid in (first, second):
            c.delete(f"/api/v1/workloads/trainings/{wid}")


def test_non_preemptible_stays_in_deserved_quota(server: EmbeddedServer) -> None:
    """A build (not preemptible) beyond deserved waits; a train of the same size runs over quota."""
    with server.http() as c:
        _project(c, "q-np", deserved=0.5)
        ws = _submit(c, "workspaces", submit_body("ws", "q-np", gpuPortionRequest=0.75))
        train = _submit(c, "trainings", submit_body("tr", "q-np", gpuPortionRequest=0.75))
        server.wait_phase(c, "trainings", train, "Running")
        w = c.get(f"/api/v1/workloads/workspaces/{ws}").json()
        for _ in range(100):
            w = c.get(f"/api/v1/workloads/workspaces/{ws}").json()
            if "quota" in w["phaseMessage"]:
                break
        assert w["phase"] == "Pending"
        assert "quota" in w["phaseMessage"] and "q-np" in w["phaseMessage"], w["phaseMessage"]
        c.delete(f"/api/v1/workloads/workspaces/{ws}")
        c.delete(f"/api/v1/workloads/trainings/{train}")


def test_reclaim_over_quota_workload(server: EmbeddedServer) -> None:
    """Project B (deserved 2) takes back a GPU that A (deserved 0) borrowed; A's train requeues."""
    with server.http() as c:
        _project(c, "q-a", deserved=0)
        _project(c, "q-b", deserved=2)
        borrowed = [_submit(c, "trainings", submit_body(f"borrow{i}", "q-a", gpuDevicesRequest=1))
                    for i in range(2)]
        for wid in borrowed:
            server.wait_phase(c, "trainings", wid, "Running")
        owner = _submit(c, "workspaces", submit_body("owner", "q-b", gpuDevicesRequest=1))
        server.wait_phase(c, "workspaces", owner, "Running")
        states = {}
        for wid in borrowed:
            states[wid] = c.get(f"/api/v1/workloads/trainings/{wid}").json()
        requeued = [w for w in states.values() if w["phase"] == "Pending"]
        assert len(requeued) == 1, [w["phase"] for w in states.values()]
        kinds = [e["kind"] for e in requeued[0]["events"]]
        assert "Preempted" in kinds and "Requeued" in kinds
        owner_doc = c.get(f"/api/v1/workloads/workspaces/{owner}").json()
        assert owner_doc["nodeName"] and owner_doc["gpus"]["allocated"] == 1
        c.delete(f"/api/v1/workloads/workspaces/{owner}")
        server.wait_phase(c, "trainings", requeued[0]["workloadId"], "Running")
        for wid in borrowed:
            c.delete(f"/api/v1/workloads/trainings/{wid}")


def test_on_eviction_fail(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "e-a", deserved=0)
        _project(c, "e-b", deserved=2)
        ids = []
        for i in range(2):
            body = submit_body(f"borrow{i}", "e-a", gpuDevicesRequest=1)
            body["spec"]["onEviction"] = "fail"
            ids.append(_submit(c, "trainings", body))
        for wid in ids:
            server.wait_phase(c, "trainings", wid, "Running")
        owner = _submit(c, "workspaces", submit_body("owner", "e-b", gpuDevicesRequest=1))
        server.wait_phase(c, "workspaces", owner, "Running")
        docs = [c.get(f"/api/v1/workloads/trainings/{wid}").json() for wid in ids]
        failed = [d for d in docs if d["phase"] == "Failed"]
        assert len(failed) == 1, [d["phase"] for d in docs]
        assert failed[0]["phaseMessage"].startswith("evicted (onEviction: fail)")
        body = submit_body("bad", "e-a")
        body["spec"]["onEviction"] = "retry"
        r = c.post("/api/v1/workloads/trainings", json=body)
        assert r.status_code == 422 and r.json()["message"].startswith("spec.onEviction")
        c.delete(f"/api/v1/workloads/workspaces/{owner}")
        for wid in ids:
            c.delete(f"/api/v1/workloads/trainings/{wid}")
