"""Embedded mode's elastic training as the cycle sees it (tessera.local.elastic): its pod 0,
the c10d rendezvous host, is the gang's anchor in the core (tessera.core.cycle.anchors), the
rule Kubernetes' anchors follow too: the core's shrink never gives it back (the translation's
order, pod 0 first, kept it so before; now the core's own rule does as well)."""

from __future__ import annotations

from typing import Any

from tessera.core.cycle import CycleConfig, Snapshot, run_cycle
from tessera.core.model import GpuRequest
from tessera.core.requests import gpu_request_to_dict
from tessera.local.elastic import ElasticPods
from tessera.local.records import Phase, PodPhase
from tessera.local.store import Workload
from tests.core.cycle.scenario import nodes, project, workload

N = nodes(1, 4, memory_gib=16)


def pod(index: int, gpu: int, ticks: int) -> dict[str, Any]:
    mem = 16 * 2**30
    return {"index": index, "phase": PodPhase.RUNNING, "node": "n1", "devices": [gpu],
            "uuids": [f"GPU-n1-{gpu}"], "requestBytes": [mem], "limitBytes": [mem],
            "exclusive": True, "startTicks": ticks}


def elastic(pods: list[dict[str, Any]]) -> Workload:
    return Workload(
        seq=1, id="e", name="e", project_id=1, project_name="a", type="training",
        phase=Phase.RUNNING, phase_message="", spec={}, request=gpu_request_to_dict(GpuRequest.whole(1)),
        preemptible=True, priority_class="train", priority=50, workers=4, min_workers=1,
        gpus_requested=1.0, gpus_allocated=float(len(pods)), node="n1", devices="", exit_code=None,
        created=0.0, started=0.0, completed=None, pods=pods)


def test_pod_0_is_the_anchor_and_the_cores_shrink_never_takes_it() -> None:
    # Pod 0 started last of the three (its process restarted): still the core's pod 0, and an
    # anchor; the newest other pod is the one given back.
    w = elastic([pod(1, 1, 100), pod(2, 2, 200), pod(0, 0, 300)])
    here = {i: f"GPU-n1-{i}" for i in range(4)}
    pods = ElasticPods(processes=None)  # type: ignore[arg-type]  # translation only
    core = pods.running(w, here, now=10.0)
    assert core is not None and core.anchors == (0,) and pods.slots["e"][0] == 0
    wanted = workload(N, "w", "b", 1, pods=2, min_members=2)  # two GPUs: one idle, one to free
    plan = run_cycle(Snapshot(tuple(N), (project("a", 0), project("b", 2)), (core, wanted), 1000.0),
                     CycleConfig())
    (ev,) = plan.evictions
    assert ev.action == "shrink" and 0 not in ev.pods, ev
