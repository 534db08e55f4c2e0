"""Dynamic fractions on Kubernetes, end to end (issue #11 item 4): Run:ai manifests admitted by the
webhook, placed by tessera-scheduler on one simulated L4, the node's tessera-node writing each
share's config (with its place in the node's loans ledger), and real CUDA processes (cuprobe on
the fake driver) started with exactly the pod's mounts (tessera.testing.pod_process).

The borrower (request 2 GiB, limit 20 GiB) takes 18 GiB while the GPU is free; the owner (8 GiB)
then allocates 6 GiB within its request: the allocation waits, tessera-node's reclaimer kills the
borrower's GPU process, the owner is served, and both pods get an Event saying why."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from tessera.testing import pod_process
from tessera.testing.cluster import TestCluster
from tests.isolation.conftest import GiB
from tests.kube.admission_helpers import (
    create,
    create_project_namespace,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.kube.node_helpers import Process, events, own_node
from tests.waiting import wait_until

NODE = "loans-l4-0"


@pytest.fixture(scope="module")
def node(stack: TestCluster, kube_client: Client) -> Iterator[Any]:
    with own_node(stack, kube_client, "L4-24GB", "loans-l4-") as agent:
        yield agent


def start_pod_process(agent: Any, pod: Any) -> Process:
    from tessera.isolation.build import ensure_built

    native = ensure_built()
    env = {**agent.env, "CUDA_VISIBLE_DEVICES": agent.uuids[0]}
    p = Process(pod_process.start(pod, pod.spec.containers[0].name, agent.root,
                                  [str(native.program("cuprobe")), "dlsym"], env,
                                  agent.library_dir / "libtessera-cuda.so"))
    assert p("init").startswith("rc=0")
    assert p("ctx 0").startswith("rc=0")
    return p


def test_a_loan_is_taken_back_for_the_owner_on_a_node(node: Any, kube_client: Client) -> None:
    ns, _ = create_project_namespace(kube_client, "loans")
    wait_webhook_sees_project(kube_client, ns)
    pin = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
    procs: list[Process] = []
    try:
        borrower_pod = runai_pod("borrower", {"gpu-memory": "2048", "gpu-memory-limit": "20480"})
        borrower_pod["spec"].update(pin)
        create(kube_client, borrower_pod, ns)
        pod = wait_until("the borrower bound", lambda: (
            p := kube_client.get(Pod, "borrower", namespace=ns)).spec.nodeName and p)
        wait_until("the borrower's config", lambda: any(
            (node.containers_dir / pod.metadata.annotations["tessera.io/gpu-config-key"]).glob(
                "conf/*/gpu-isolation.conf")))
        borrower = start_pod_process(node, pod)
        procs.append(borrower)
        assert borrower(f"alloc {18 * GiB}").startswith("rc=0")  # 16 GiB on loan

        owner_pod = runai_pod("owner", {"gpu-memory": "8192"})
        owner_pod["spec"].update(pin)
        create(kube_client, owner_pod, ns)
        pod = wait_until("the owner bound", lambda: (
            p := kube_client.get(Pod, "owner", namespace=ns)).spec.nodeName and p)
        wait_until("the owner's config", lambda: any(
            (node.containers_dir / pod.metadata.annotations["tessera.io/gpu-config-key"]).glob(
                "conf/*/gpu-isolation.conf")))
        owner = start_pod_process(node, pod)
        procs.append(owner)
        # Within its request, the GPU short only because of the loan: waits, then is served.
        assert owner(f"alloc {6 * GiB}").startswith("rc=0")
        assert borrower.popen.wait(timeout=10) != 0  # its GPU process was killed
        reclaimed = wait_until("the borrower's Event", lambda: [
            e for e in events(kube_client, ns, "borrower") if e.reason == "GPUMemoryLoanReclaimed"])
        msg = reclaimed[0].message or ""
        assert "GPU memory loan of" in msg and f"reclaimed for {ns}/owner on GPU-" in msg
        assert wait_until("the owner's Event", lambda: [
            e for e in events(kube_client, ns, "owner") if e.reason == "GPUMemoryLoanReturned"])
        assert owner.popen.poll() is None  # nothing within a request is ever taken
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
        for name in ("borrower", "owner"):
            with contextlib.suppress(Exception):
                kube_client.delete(Pod, name, namespace=ns, grace_period=0)
