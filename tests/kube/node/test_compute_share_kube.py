"""Compute share enforced on Kubernetes, end to end on the test cluster (issue 30): the webhook
(``--gpu-compute-mode fair``) resolves the pod's compute share and says it is enforced, the
scheduler places it, tessera-node (under the chart's capability set: tessera.testing.node_agents)
writes the pod's entry into its GPU's arbiter and ``gpu-compute.conf`` into the config directory
the container needs to start, and the pod's process (cuspin, launching kernels without
synchronising, under the isolation library, started with exactly the pod's mounts and as the
pod's user: tessera.testing.pod_process) is held to its limit on the fake driver's timing model.
A node that cannot set up the arbiter writes no files for the pod and says why (fail closed).

cuspin, the fake driver and a copy of the library are put where any UID can read them (the build
cache lies under /root); everything the pod reads of tessera's comes through its mounts."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from tessera.isolation import arbiter
from tessera.kube.admission.compute_spellings import ENFORCED, STATUS
from tessera.testing import pod_process
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    create,
    create_project_namespace,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.kube.node_helpers import events, own_node, readable_copy
from tests.waiting import wait_until

WEBHOOK_ARGS = ["--gpu-compute-mode=fair"]
"""The cluster's compute-share mode for this module's webhook (the stack fixture of tests/kube/conftest.py)."""
NODE = "compute-t4-0"
POD_UID = 4321

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="processes under other UIDs need root "
                                "(the test sandbox and CI run as root)")


@pytest.fixture(scope="module")
def node(stack: TestCluster, kube_client: Client) -> Iterator[Any]:
    with own_node(stack, kube_client, "T4-16GB", "compute-t4-") as agent:
        yield agent


@pytest.fixture
def readable(node: Any) -> Iterator[Path]:
    with readable_copy(node, "cuspin", writable=("sim",)) as base:
        yield base


def compute_pod(name: str, request: str, limit: str, mode: str) -> dict[str, Any]:
    pod = runai_pod(name, {"gpu-memory": "2048", "tessera.io/gpu-compute-request": request,
                           "tessera.io/gpu-compute-limit": limit, "tessera.io/gpu-compute-mode": mode},
                    securityContext={"runAsUser": POD_UID})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return pod


def bound_with_files(client: Client, node: Any, ns: str, name: str) -> tuple[Any, Path]:
    pod = wait_until(f"{name} bound", lambda: (p := client.get(Pod, name, namespace=ns)).spec.nodeName and p)
    key = pod.metadata.annotations["tessera.io/gpu-config-key"]
    conf = node.containers_dir / key / "conf" / pod.spec.containers[0].name
    wait_until(f"{name}'s config directory", lambda: (conf / "gpu-isolation.conf").is_file())
    return pod, conf


def spin(node: Any, pod: Any, base: Path, seconds: float) -> dict[str, Any]:
    """cuspin in the pod for ``seconds`` (1 ms kernels, 8 in flight): its last line."""
    env = {k: v for k, v in node.env.items() if k != "FAKE_GPU_STATE"}  # the state file is root's
    env.update(CUDA_VISIBLE_DEVICES=node.uuids[0], LD_LIBRARY_PATH=str(base / "fake"),
               FAKE_CUDA_KERNEL_TIME="grid", FAKE_GPU_SIM_DIR=str(base / "sim"))
    proc = pod_process.start(pod, pod.spec.containers[0].name, node.root,
                             [str(base / "cuspin"), "--us", "1000", "--inflight", "8",
                              "--seconds", str(seconds), "--report-ms", "100000"],
                             env, base / "libtessera-cuda.so")
    out, err = proc.communicate(timeout=seconds + 60)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_a_strict_share_is_held_to_its_limit_by_the_nodes_arbiter(node: Any, readable: Path,
                                                                   kube_client: Client) -> None:
    ns, _ = create_project_namespace(kube_client, "compute")
    wait_webhook_sees_project(kube_client, ns)
    try:
        create(kube_client, compute_pod("strict", "0.3", "0.3", "strict"), ns)
        pod, conf = bound_with_files(kube_client, node, ns, "strict")
        ann = pod.metadata.annotations
        assert ann[STATUS] == ENFORCED
        key = ann["tessera.io/gpu-config-key"]
        # The conf was in the directory from the moment it appeared, naming the arbiter as the
        # container sees it.
        assert (conf / "gpu-compute.conf").read_text().splitlines()[1:] == [
            f"arbiter /run/tessera-loans/compute/{node.uuids[0]}.share", f"workload {key}"]
        share = node.root / "loans" / "compute" / f"{node.uuids[0]}.share"
        (entry,) = [u for u in arbiter.usage(share) if u.key == key]
        assert (round(entry.request, 3), round(entry.limit, 3)) == (0.3, 0.3)

        done = spin(node, pod, readable, 4.0)
        used = done["executed_ns"] / (done["elapsed_ms"] * 1e6)
        # Alone, ungated, it would have the whole GPU (about 1.0): strict holds it to 0.3.
        assert 0.15 <= used <= 0.36, done
        (entry,) = [u for u in arbiter.usage(share) if u.key == key]
        assert entry.leases > 0 and entry.total_seconds > 0.5
        # tessera-node's /metrics: the pod's charged GPU time, next to its request and limit.
        body = httpx.get(node.metrics_url, timeout=5).text
        line = next(x for x in body.splitlines()
                    if x.startswith("tessera_workload_gpu_time_seconds_total{") and 'pod="strict"' in x)
        assert f'namespace="{ns}"' in line and f'gpu_uuid="{node.uuids[0]}"' in line
        assert float(line.rsplit(" ", 1)[1]) > 0.5
        assert any(x.startswith("tessera_workload_gpu_compute_limit{") and 'pod="strict"' in x
                   and x.endswith(" 0.3") for x in body.splitlines())
        # ... and its /usage, which the API server polls for the console's GPUs and workload
        # pages (tests/console/test_usage.py joins it).
        usage = httpx.get(node.metrics_url.replace("/metrics", "/usage"), timeout=5).json()
        (sh,) = [x for x in usage["shares"] if x["pod"] == "strict" and x["namespace"] == ns]
        assert sh["gpuUuid"] == node.uuids[0] and sh["gpuSecondsTotal"] > 0.5
        assert (sh["computeRequest"], sh["computeLimit"], sh["computeEnforced"]) == (0.3, 0.3, True)

        kube_client.delete(Pod, "strict", namespace=ns, grace_period=0)
        wait_until("its entry removed", lambda: key not in {u.key for u in arbiter.usage(share)})
    finally:
        with contextlib.suppress(Exception):
            kube_client.delete(Pod, "strict", namespace=ns, grace_period=0)


def test_no_arbiter_no_files_and_the_reason(node: Any, kube_client: Client) -> None:
    """The arbiters' directory cannot be made: the pod gets no config directory (its container
    cannot start, so it never runs ungated) and an Event saying why; once the node can make
    it, the files appear."""
    ns, _ = create_project_namespace(kube_client, "compute-closed")
    wait_webhook_sees_project(kube_client, ns)
    compute_dir = node.root / "loans" / "compute"
    aside = compute_dir.with_name("compute.aside")
    if compute_dir.exists():
        compute_dir.rename(aside)
    compute_dir.write_text("not a directory")
    try:
        create(kube_client, compute_pod("closed", "0.2", "1", "fair"), ns)
        pod = wait_until("bound", lambda: (p := kube_client.get(Pod, "closed", namespace=ns)).spec.nodeName and p)
        failed = wait_until("the Event", lambda: [e for e in events(kube_client, ns, "closed")
                                                  if e.reason == "GPUIsolationFailed"])
        assert "compute share" in (failed[0].message or "") and "not started ungated" in (failed[0].message or "")
        key = pod.metadata.annotations["tessera.io/gpu-config-key"]
        assert not (node.containers_dir / key / "conf").exists()
        compute_dir.unlink()
        if aside.exists():
            aside.rename(compute_dir)
        conf = node.containers_dir / key / "conf" / pod.spec.containers[0].name / "gpu-compute.conf"
        wait_until("the files once the arbiter can be made", conf.is_file)
    finally:
        if compute_dir.is_file():
            compute_dir.unlink()
        if aside.exists() and not compute_dir.exists():
            aside.rename(compute_dir)
        with contextlib.suppress(Exception):
            kube_client.delete(Pod, "closed", namespace=ns, grace_period=0)
