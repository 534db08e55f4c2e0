"""``POST /api/v1/workloads/{kind}/{id}/exec`` in embedded mode: the command runs on the server's
machine with the pod's GPU environment (the Kubernetes backend's exec is in tests/kube)."""

from __future__ import annotations

from tessera.testing.embedded import EmbeddedServer, submit_body


def test_exec_runs_in_the_pods_environment(server: EmbeddedServer) -> None:
    with server.http() as c:
        c.post("/api/v1/org-unit/projects", json={
            "name": "p-exec", "resources": {"gpu": {"deserved": 1}}}).raise_for_status()
        r = c.post("/api/v1/workloads/trainings", json=submit_body(
            "shell", "p-exec", gpuRequestType="portion", gpuPortionRequest=0.25))
        wid = r.json()["workloadId"]
        server.wait_phase(c, "trainings", wid, "Running")
        uuid = c.get(f"/api/v1/workloads/trainings/{wid}/pods").json()["pods"][0][
            "gpuDevices"][0]["uuid"]
        r = c.post(f"/api/v1/workloads/trainings/{wid}/exec", json={"command": [
            "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; echo oops >&2; exit 4"]})
        assert r.status_code == 200, r.text
        assert r.json() == {"exitCode": 4, "stdout": f"{uuid}\n", "stderr": "oops\n"}
        r = c.post(f"/api/v1/workloads/trainings/{wid}/exec", json={"command": []})
        assert r.status_code == 422 and r.json()["message"].startswith("command:")
        r = c.post(f"/api/v1/workloads/trainings/{wid}/exec",
                   json={"command": ["true"], "pod": 3})
        assert r.status_code == 404 and "no pod 3" in r.json()["message"]
        c.post(f"/api/v1/workloads/trainings/{wid}/suspend").raise_for_status()
        server.wait_phase(c, "trainings", wid, "Stopped")
        r = c.post(f"/api/v1/workloads/trainings/{wid}/exec", json={"command": ["true"]})
        assert r.status_code == 409 and "exec needs it Running" in r.json()["message"]
        c.delete(f"/api/v1/workloads/trainings/{wid}")
