"""The REST API against a real server: validation, conflicts, auth, listing, lifecycle."""

from __future__ import annotations

import sqlite3

import httpx

from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.shares import share


def _project(c: httpx.Client, name: str, deserved: float = 2, limit: float | None = None) -> None:
    r = c.post("/api/v1/org-unit/projects", json={
        "name": name, "resources": {"gpu": {"deserved": deserved, "limit": limit}}})
    assert r.status_code == 201, r.text


def _names(c: httpx.Client, project: str) -> list[str]:
    r = c.get("/api/v1/workloads", params={"filterBy": f"projectName=={project}"})
    return [w["name"] for w in r.json()["workloads"]]


def test_submit_portion_runs_with_device_uuid(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "p-run")
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "half", "p-run", gpuRequestType="portion", gpuPortionRequest=0.5))
        assert r.status_code == 202, r.text
        w = server.wait_phase(c, "trainings", r.json()["workloadId"], "Running")
        pods = c.get(f"/api/v1/workloads/trainings/{w['workloadId']}/pods").json()["pods"]
        uuid = pods[0]["gpuDevices"][0]["uuid"]
        assert pods[0]["env"]["CUDA_VISIBLE_DEVICES"] == uuid
        assert pods[0]["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert pods[0]["gpuDevices"][0]["requestBytes"] == share(0.5)
        assert w["simulated"] is True
        assert w["gpus"]["allocated"] == 0.5


def test_invalid_requests_are_422_naming_the_field_and_change_nothing(
    server: EmbeddedServer,
) -> None:
    cases = [
        ({"gpuPortionRequest": 1.5}, "spec.compute.gpuPortionRequest"),
        ({"gpuPortionRequest": 0.5, "gpuPortionLimit": 0.2}, "spec.compute.gpuPortionLimit"),
        ({"gpuMemoryRequest": "5X"}, "spec.compute.gpuMemoryRequest"),
        ({"gpuMemoryRequest": "4G", "gpuMemoryLimit": "2G"}, "spec.compute.gpuMemoryLimit"),
        ({"gpuMemoryRequest": "40G"}, "spec.compute.gpuMemoryRequest"),
        ({"gpuDevicesRequest": 3}, "spec.compute.gpuDevicesRequest"),
        ({"gpuDevicesRequest": 0}, "spec.compute.gpuDevicesRequest"),
        ({"gpuRequestType": "portion"}, "spec.compute.gpuPortionRequest"),
        ({"gpuPortionRequest": 0.5, "gpuMemoryRequest": "1G"}, "spec.compute.gpuMemoryRequest"),
        ({"gpuModel": "H100-80GB", "gpuDevicesRequest": 1}, "spec.compute.gpuModel"),
        # compute shares are off on this server (tessera up --gpu-compute-mode off, the default)
        ({"gpuPortionRequest": 0.5, "gpuComputeRequest": 0.3}, "spec.compute.gpuComputeRequest"),
        ({"gpuPortionRequest": 0.5, "gpuComputeMode": "turbo"}, "spec.compute.gpuComputeMode"),
    ]
    with server.http() as c:
        _project(c, "p-bad")
        for compute, field in cases:
            r = c.post("/api/v1/workloads/trainings", json=submit_body("bad", "p-bad", **compute))
            assert r.status_code == 422, (compute, r.text)
            assert r.json()["message"].startswith(field), (compute, r.json()["message"])
        r = c.post("/api/v1/workloads/trainings", json=submit_body("Bad_Name", "p-bad"))
        assert r.status_code == 422 and r.json()["message"].startswith("name:")
        r = c.post("/api/v1/workloads/trainings", json=submit_body("x", "no-such-project"))
        assert r.status_code == 422 and r.json()["message"].startswith("projectId:")
        body = submit_body("x", "p-bad")
        body["spec"]["priorityClass"] = "urgent"
        r = c.post("/api/v1/workloads/trainings", json=body)
        assert r.status_code == 422 and r.json()["message"].startswith("spec.priorityClass")
        assert _names(c, "p-bad") == []


def test_duplicate_name_in_project_is_409(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "p-dup")
        _project(c, "p-dup2")
        body = submit_body("same", "p-dup", gpuPortionRequest=0.1)
        assert c.post("/api/v1/workloads/trainings", json=body).status_code == 202
        r = c.post("/api/v1/workloads/workspaces", json=body)
        assert r.status_code == 409 and "already exists" in r.json()["message"]
        other = submit_body("same", "p-dup2", gpuPortionRequest=0.1)
        assert c.post("/api/v1/workloads/trainings", json=other).status_code == 202
        assert c.post("/api/v1/org-unit/projects", json={"name": "p-dup"}).status_code == 409


def test_auth_401_and_nothing_changes(server: EmbeddedServer) -> None:
    url = server.url
    body = submit_body("sneaky", "p-auth", gpuPortionRequest=0.1)
    with server.http() as c:
        _project(c, "p-auth")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        assert httpx.post(f"{url}/api/v1/workloads/trainings", json=body,
                          headers=headers).status_code == 401
        assert httpx.get(f"{url}/api/v1/workloads", headers=headers).status_code == 401
        assert httpx.post(f"{url}/api/v1/org-unit/projects", json={"name": "evil"},
                          headers=headers).status_code == 401
        assert httpx.delete(f"{url}/api/v1/org-unit/projects/p-auth",
                            headers=headers).status_code == 401
    r = httpx.post(f"{url}/api/v1/token", json={"clientId": "admin", "clientSecret": "nope"})
    assert r.status_code == 401
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert httpx.get(f"{url}/openapi.json").status_code == 200
    with server.http() as c:
        assert _names(c, "p-auth") == []
        assert c.get("/api/v1/org-unit/projects/evil").status_code == 404
        assert c.get("/api/v1/org-unit/projects/p-auth").status_code == 200
    token = server.token()
    db = sqlite3.connect(str(server.data / "tessera.db"))
    stored = [row[0] for row in db.execute("SELECT token_hash FROM tokens")]
    secrets_stored = [row[0] for row in db.execute("SELECT secret_hash FROM clients")]
    db.close()
    assert stored and token not in stored
    assert server.credentials()["clientSecret"] not in secrets_stored


def test_suspend_resume_delete_free_the_share(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "p-life")
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "life", "p-life", gpuMemoryRequest="3G"))
        wid = r.json()["workloadId"]
        server.wait_phase(c, "trainings", wid, "Running")
        assert c.get(f"/api/v1/workloads/workspaces/{wid}").status_code == 404
        assert c.post(f"/api/v1/workloads/trainings/{wid}/suspend").status_code == 202
        w = server.wait_phase(c, "trainings", wid, "Stopped")
        assert w["gpus"]["allocated"] == 0
        assert c.post(f"/api/v1/workloads/trainings/{wid}/suspend").status_code == 409
        assert c.post(f"/api/v1/workloads/trainings/{wid}/resume").status_code == 202
        server.wait_phase(c, "trainings", wid, "Running")
        assert c.delete(f"/api/v1/workloads/trainings/{wid}").status_code == 202
        for _ in range(200):
            if c.get(f"/api/v1/workloads/trainings/{wid}").status_code == 404:
                break
            import time

            time.sleep(0.05)
        assert c.get(f"/api/v1/workloads/trainings/{wid}").status_code == 404
        held = [h["name"] for n in c.get("/api/v1/cluster").json()["nodes"] for g in n["gpus"]
                for h in g["workloads"]]
        assert "life" not in held


def test_projects_crud(server: EmbeddedServer) -> None:
    with server.http() as c:
        r = c.post("/api/v1/org-unit/projects", json={
            "name": "p-crud", "resources": {"gpu": {"deserved": 1, "limit": 2,
                                                    "overQuotaWeight": 3}}, "priority": 70})
        assert r.status_code == 201
        pid = r.json()["id"]
        assert c.get(f"/api/v1/org-unit/projects/{pid}").json()["name"] == "p-crud"
        r = c.put("/api/v1/org-unit/projects/p-crud", json={
            "resources": {"gpu": {"deserved": 2, "limit": 1}}})
        assert r.status_code == 422 and r.json()["message"].startswith("resources.gpu.limit")
        r = c.put("/api/v1/org-unit/projects/p-crud", json={"resources": {"gpu": {"deserved": 2}}})
        assert r.json()["resources"]["gpu"]["deserved"] == 2
        r = c.post("/api/v1/org-unit/projects", json={"name": "x", "resources": {
            "gpu": {"deserved": -1}}})
        assert r.status_code == 422 and "deserved" in r.json()["message"]
        assert c.post("/api/v1/workloads/trainings", json=submit_body(
            "w", "p-crud")).status_code == 202
        assert c.delete("/api/v1/org-unit/projects/p-crud").status_code == 409
        names = [p["name"] for p in c.get("/api/v1/org-unit/projects").json()["projects"]]
        assert "p-crud" in names


def test_memory_on_each_of_several_devices(server: EmbeddedServer) -> None:
    """cGPU's shape (seed 002): a share of memory on each of several GPUs of one node."""
    with server.http() as c:
        _project(c, "p-multi")
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "multi", "p-multi", gpuDevicesRequest=2, gpuMemoryRequest="2Gi"))
        assert r.status_code == 202, r.text
        w = server.wait_phase(c, "trainings", r.json()["workloadId"], "Running")
        pod = w["pods"][0]
        uuids = [d["uuid"] for d in pod["gpuDevices"]]
        assert len(set(uuids)) == 2
        assert [d["requestBytes"] for d in pod["gpuDevices"]] == [2 * 2**30, 2 * 2**30]
        assert pod["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
        if pod["env"]["TESSERA_ISOLATION"] == "on":
            from pathlib import Path

            config = Path(pod["env"]["TESSERA_GPU_CONFIG"]).read_text()
            for i, uuid in enumerate(uuids):
                assert f"device index={i} uuid={uuid} request={2 * 2**30}" in config
        c.delete(f"/api/v1/workloads/trainings/{w['workloadId']}")


def test_workers_gang_each_pod_with_its_own_share_and_log(server: EmbeddedServer) -> None:
    with server.http() as c:
        _project(c, "p-gang")
        body = submit_body("gang", "p-gang", command="sh",
                           args="-c 'echo pod $TESSERA_POD_INDEX of $TESSERA_WORKERS; sleep 600'",
                           gpuPortionRequest=0.25)
        body["spec"]["workers"] = 2
        r = c.post("/api/v1/workloads/trainings", json=body)
        assert r.status_code == 202, r.text
        w = server.wait_phase(c, "trainings", r.json()["workloadId"], "Running")
        assert w["runningPods"] == 2 and w["gpus"]["allocated"] == 0.5
        assert [p["env"]["TESSERA_POD_INDEX"] for p in w["pods"]] == ["0", "1"]
        assert len({p["pid"] for p in w["pods"]}) == 2
        base = f"/api/v1/workloads/trainings/{w['workloadId']}"
        for pod in (0, 1):
            for _ in range(100):
                text = c.get(f"{base}/logs", params={"pod": pod}).text
                if "pod" in text.split("\n", 1)[-1]:
                    break
                import time

                time.sleep(0.05)
            assert f"pod {pod} of 2" in text
        assert c.get(f"{base}/logs", params={"pod": 5}).status_code == 404
        c.delete(base)
