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
from tessera.core.model import GpuRequest
from tessera.kube.api_backend import KubeBackend
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import project_namespace
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
