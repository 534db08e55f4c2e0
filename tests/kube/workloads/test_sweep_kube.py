"""``tessera submit --parallelism P --completions C`` on the Kubernetes backend: an Indexed Job
that the real Job controller (kube-controller-manager) runs, at most P trials at once, each with
its completion index; tessera's webhook and scheduler place each trial (tessera.kube.sweeps,
docs/workloads.md). Named ``indexed_job`` so ``pytest -k indexed_job`` runs it with the rest.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from tessera.api.backend import WorkloadSubmission
from tessera.bench.inference_kube import MODEL_SERVER
from tessera.core.model import GpuRequest
from tessera.kube.api_backend import KubeBackend
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import project_namespace, wait_pods
from tests.waiting import wait_until


def test_indexed_job_sweep_from_tessera_submit(stack: TestCluster, tmp_path: Path) -> None:
    client: Client = stack.client()
    ns, project = project_namespace(client, "sweep-api")
    backend = KubeBackend(client, tmp_path)
    try:
        doc = backend.submit(WorkloadSubmission(
            name="hpo", project=project, type="Training", gpu=GpuRequest.fraction("0.25"),
            command=["python", "trial.py"],
            spec={"command": "python", "args": "trial.py", "completions": 6,
                  "parallelism": 2, "backoffLimit": 1}))
        job = client.get(Job, "hpo", namespace=ns)
        assert job.spec is not None
        assert (job.spec.completionMode, job.spec.completions, job.spec.parallelism,
                job.spec.backoffLimit) == ("Indexed", 6, 2, 1)
        owner = (job.metadata.ownerReferences or [])[0]  # type: ignore[union-attr]
        assert (owner.kind, owner.name) == ("PodGroup", "hpo")
        most = 0
        deadline = time.monotonic() + 120
        while True:
            trials = [p for p in client.list(Pod, namespace=ns)
                      if (p.metadata.labels or {}).get("job-name") == "hpo"]  # type: ignore[union-attr]
            running = [p for p in trials if p.status and p.status.phase == "Running"]
            most = max(most, len(running))
            got = backend.workload(doc["workloadId"])
            if got["phase"] == "Completed":
                break
            assert got["phase"] in ("Pending", "Running"), got["phaseMessage"]
            assert time.monotonic() < deadline, got["phaseMessage"]
            time.sleep(0.1)
        assert most <= 2  # parallelism 2, as the Job controller keeps it (kwok finishes trials fast)
        assert got["phaseMessage"] == "all 6 trials exited with code 0"
        indices = sorted(p["index"] for p in got["pods"] if p["phase"] == "Succeeded")
        assert indices == [0, 1, 2, 3, 4, 5]
        # Each trial pod carries tessera's share and its index, from the Job's template.
        for p in trials:
            ann = p.metadata.annotations or {}  # type: ignore[union-attr]
            assert ann["tessera.io/gpu-portion"] == "0.25"
            assert ann["batch.kubernetes.io/job-completion-index"] in {str(i) for i in range(6)}
            env = {e.name: e for e in p.spec.containers[0].env or []}  # type: ignore[union-attr]
            assert env["TESSERA_POD_INDEX"].valueFrom is not None
        # Deleting the workload deletes the PodGroup; the garbage collector removes the Job.
        backend.delete_workload(doc["workloadId"])
        wait_until("the Job gone", lambda: not [j for j in client.list(Job, namespace=ns)],
                   timeout=60)
    finally:
        backend.stop()


def test_indexed_job_sweep_refusals_name_the_field(stack: TestCluster, tmp_path: Path) -> None:
    """What the Job would refuse is refused before anything is made, naming the field."""
    from tessera.api.models import WorkloadSpec
    from tessera.core.errors import InvalidRequest

    for spec, field in [({"completions": 2, "parallelism": 3}, "parallelism"),
                        ({"parallelism": 2}, "completions"),
                        ({"completions": 4, "workers": 2}, "workers")]:
        with pytest.raises((InvalidRequest, ValueError)) as err:
            WorkloadSpec.model_validate(spec)
        assert field in str(err.value)


def test_workspace_port_service_and_external_url(stack: TestCluster, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``workspace submit --port 8888 --external-url`` on Kubernetes: a Service the real
    EndpointSlice controller fills with the workspace's pod, an Ingress of the configured class
    at the documented host, both URLs in the workload's document, both removed with it; with no
    ingress configured, the external URL is refused naming the field and nothing is made."""
    from lightkube.resources.core_v1 import Service
    from lightkube.resources.discovery_v1 import EndpointSlice
    from lightkube.resources.networking_v1 import Ingress

    from tessera.core.errors import InvalidRequest
    from tessera.kube.objects import PodGroupResource

    client: Client = stack.client()
    ns, project = project_namespace(client, "ports")
    backend = KubeBackend(client, tmp_path)
    spec = {"command": "jupyter", "args": "lab", "ports": [{"container": 8888,
                                                            "externalUrl": True}]}
    sub = WorkloadSubmission(name="nb", project=project, type="Workspace",
                             gpu=GpuRequest.fraction("0.25"), command=["jupyter", "lab"],
                             spec=spec)
    try:
        monkeypatch.delenv("TESSERA_INGRESS_CLASS", raising=False)
        with pytest.raises(InvalidRequest) as refused:
            backend.submit(sub)
        assert refused.value.field == "spec.ports[0].externalUrl"
        assert "TESSERA_INGRESS_CLASS" in str(refused.value)
        assert not list(client.list(PodGroupResource, namespace=ns))  # nothing half made
        assert not [s for s in client.list(Service, namespace=ns)]
        monkeypatch.setenv("TESSERA_INGRESS_CLASS", "nginx")
        monkeypatch.setenv("TESSERA_INGRESS_DOMAIN", "apps.example.test")
        doc = backend.submit(sub)
        urls = [f"http://nb.{ns}.svc.cluster.local:8888", f"https://nb-{ns}.apps.example.test"]
        assert doc["serviceUrls"] == urls
        assert backend.workload(doc["workloadId"])["serviceUrls"] == urls
        svc = client.get(Service, "nb", namespace=ns)
        assert svc.spec is not None and svc.spec.selector == {
            "tessera.io/workload-id": doc["workloadId"]}
        assert [(p.port, p.targetPort) for p in svc.spec.ports or []] == [(8888, 8888)]
        ing = client.get(Ingress, "nb", namespace=ns)
        assert ing.spec is not None and ing.spec.ingressClassName == "nginx"
        rule = (ing.spec.rules or [])[0]
        assert rule.host == f"nb-{ns}.apps.example.test"
        backend_ref = rule.http.paths[0].backend.service  # type: ignore[union-attr]
        assert (backend_ref.name, backend_ref.port.number) == ("nb", 8888)  # type: ignore[union-attr]
        # The real EndpointSlice controller lists the workspace's pod behind the Service.
        pod = wait_pods(client, ns, 1, timeout=60, **{"tessera.io/workload-id":
                                                      doc["workloadId"]})[0]

        def ready_ips() -> list[str]:
            return [a for sl in client.list(EndpointSlice, namespace=ns,
                                            labels={"kubernetes.io/service-name": "nb"})
                    for e in sl.endpoints or [] if (e.conditions and e.conditions.ready)
                    for a in e.addresses]
        ips = wait_until("the pod behind the Service", ready_ips, timeout=60)
        pod = client.get(Pod, pod.metadata.name, namespace=ns)  # type: ignore[union-attr]
        assert pod.status is not None and ips == [pod.status.podIP]
        backend.delete_workload(doc["workloadId"])
        wait_until("Service and Ingress removed with the workload", lambda: not list(
            client.list(Service, namespace=ns)) and not list(client.list(Ingress, namespace=ns)),
            timeout=60)
    finally:
        backend.stop()


BOUND = 1.0
"""The scale-down decision is taken between the delay and the delay + this many seconds after
the last connection closed (docs/workloads.md: the autoscaler looks again when it is due)."""
SEEN_LATE = 0.25
"""The test's clients see the end of their answer after the proxy saw the connection close (the
model server closes first): up to this much later on a loaded machine."""


def test_inference_autoscaling_on_kubernetes(stack: TestCluster, tmp_path: Path) -> None:
    """``inference submit --min-replicas 1 --max-replicas 3 --metric concurrency
    --metric-threshold 1 --scale-down-delay 3`` on Kubernetes: a Deployment (scaled by
    kube-controller-manager's Deployment and ReplicaSet controllers) behind a Service; three
    connections held open through replica 0's real tessera proxy make the autoscaler, reading the
    proxies' counters, scale to 3, and idle it returns to 1 after the delay; deleting the
    workload removes it all (garbage collector)."""
    import subprocess
    import sys
    import threading

    import httpx
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Service

    from tessera.kube.autoscaling import KubeAutoscaler
    from tessera.testing.embedded import free_port
    from tessera.testing.replica_proxies import ReplicaProxies

    client: Client = stack.client()
    ns, project = project_namespace(client, "infer")
    backend = KubeBackend(client, tmp_path)
    scaler = KubeAutoscaler(client, interval=0.5).start()
    delay = 3.0
    port = free_port()
    model = subprocess.Popen([sys.executable, "-c", MODEL_SERVER, str(port)])
    try:
        doc = backend.submit(WorkloadSubmission(
            name="llm", project=project, type="Inference", gpu=GpuRequest.fraction("0.25"),
            command=["python", "serve.py"],
            spec={"command": "python", "args": "serve.py", "ports": [{"container": port}],
                  "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "metric": "concurrency",
                                  "metricThreshold": 1, "scaleDownDelaySeconds": delay}}))
        wid = doc["workloadId"]
        assert doc["serviceUrls"] == [f"http://llm.{ns}.svc.cluster.local:{port}"]
        dep = client.get(Deployment, "llm", namespace=ns)
        assert dep.spec is not None and dep.spec.replicas == 1
        svc = client.get(Service, "llm", namespace=ns)
        assert [(p.port, p.targetPort) for p in svc.spec.ports or []] == [(port, 8013)]  # type: ignore[union-attr]

        def replicas() -> int:
            d = client.get(Deployment, "llm", namespace=ns)
            return int(d.spec.replicas)  # type: ignore[union-attr]

        with ReplicaProxies(client, ns, wid) as proxies:
            first = wait_until("replica 0's proxy", lambda: proxies.running() or None,
                               timeout=60)[0]
            ip = proxies.ips[first]
            wait_until("replica 0 answers through its proxy", lambda: _answers(
                f"http://{ip}:8013/0"), timeout=30)
            t0 = time.monotonic()
            answers: list[int] = []
            ends: list[float] = []

            def hold(seconds: float) -> None:
                answers.append(httpx.get(f"http://{ip}:8013/{seconds}", timeout=30).status_code)
                ends.append(time.time())

            load = [threading.Thread(target=hold, args=(8,)) for _ in range(3)]
            for t in load:
                t.start()
            wait_until("3 replicas with their proxies", lambda: replicas() == 3
                       and len(proxies.running()) == 3, timeout=60)
            scale_up = time.monotonic() - t0
            for t in load:
                t.join()
            time.sleep(delay / 2)  # a lull shorter than the delay: no replica goes
            lull_end = time.time()
            again = [threading.Thread(target=hold, args=(2,)) for _ in range(3)]
            for t in again:
                t.start()
            for t in again:
                t.join()
            assert answers == [200] * 6
            end = max(ends)  # the last connection closed (its client saw it just after)
            wait_until("back to 1 replica", lambda: replicas() == 1
                       and len(proxies.running()) == 1, timeout=60)
            wait_until("the other pods gone", lambda: len(list(client.list(
                Pod, namespace=ns, labels={"tessera.io/workload-id": wid}))) == 1, timeout=60)
            gone = time.time() - end
            # The replica kept still serves; the scaling went 1 -> 3 -> 1, no dip in the lull,
            # and the decision came the delay after the last connection closed (not the
            # scaler's later look, nor a window on top): within [delay, delay + BOUND].
            kept = proxies.running()[0]
            assert _answers(f"http://{proxies.ips[kept]}:8013/0")
            history = scaler.state[wid].history  # up (in one step or as connections came)
            after_up = history[[n for _, n in history].index(3):]
            early = [h for h in after_up if h[1] < 3 and h[0] < lull_end + 1.9]
            assert history[-1][1] == 1 and not early, (history, lull_end)
            decided = history[-1][0] - end
            assert delay - SEEN_LATE <= decided <= delay + BOUND, (decided, history, end)
            print(f"kubernetes inference: 1 -> 3 replicas in {scale_up:.1f} s of load; back to "
                  f"1 decided {decided:.2f} s after the last connection closed (delay {delay} "
                  f"s), pods gone after {gone:.2f} s")
            # Suspended: no replica, and the autoscaler leaves it so; resumed: the minimum.
            backend.suspend(wid)
            wait_until("suspended: no replica", lambda: replicas() == 0
                       and not proxies.running(), timeout=60)
            time.sleep(1.5)  # three autoscaler steps
            assert replicas() == 0 and backend.workload(wid)["phase"] == "Stopped"
            backend.resume(wid)
            try:
                wait_until("resumed: 1 replica", lambda: replicas() == 1
                           and len(proxies.running()) == 1, timeout=60)
            except AssertionError:
                raise AssertionError((replicas(), proxies.running(), proxies.last_error, [
                    (p.metadata.name, p.status.phase, p.status.podIP,  # type: ignore[union-attr]
                     (p.metadata.annotations or {}).get("tessera.io/scheduling-message"))  # type: ignore[union-attr]
                    for p in client.list(Pod, namespace=ns)])) from None
        backend.delete_workload(wid)
        wait_until("Deployment, Service and pods removed", lambda: not list(
            client.list(Deployment, namespace=ns)) and not list(client.list(Service, namespace=ns))
            and not list(client.list(Pod, namespace=ns)), timeout=60)
    finally:
        scaler.stop()
        model.terminate()
        model.wait()
        backend.stop()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
