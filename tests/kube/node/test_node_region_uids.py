"""A pod's region shared by its UIDs, end to end on the test cluster (issue #12 item 3): a
Run:ai pod running as UID 1001 and stating no group gets a supplemental group from the webhook,
tessera-node writes the region root:that-group 2770/0660, and the pod's processes, started with
the pod's mounts and identity (tessera.testing.pod_process applies runAsUser and the groups),
share one budget under two UIDs; a process of the pod that dropped the group cannot open it and
fails closed.

cuprobe, the fake driver and a copy of the library are put where any UID can read them (the
build cache lies under /root); everything the pod reads of tessera's comes through its mounts."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.core_v1 import SecurityContext
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
from tests.kube.node_helpers import Process, own_node, readable_copy
from tests.waiting import wait_until

NODE = "uids-l4-0"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="processes under other UIDs need root "
                                "(the test sandbox and CI run as root)")


@pytest.fixture(scope="module")
def node(stack: TestCluster, kube_client: Client) -> Iterator[Any]:
    with own_node(stack, kube_client, "L4-24GB", "uids-l4-") as agent:
        yield agent


@pytest.fixture
def readable(node: Any) -> Iterator[Path]:
    with readable_copy(node, "cuprobe") as base:
        yield base


def start(node: Any, pod: Any, base: Path) -> Process:
    env = {k: v for k, v in node.env.items() if k != "FAKE_GPU_STATE"}  # the state file is root's
    env.update(CUDA_VISIBLE_DEVICES=node.uuids[0], LD_LIBRARY_PATH=str(base / "fake"))
    p = Process(pod_process.start(pod, pod.spec.containers[0].name, node.root,
                                  [str(base / "cuprobe"), "dlsym"], env, base / "libtessera-cuda.so"))
    assert p("init").startswith("rc=0")
    assert p("ctx 0").startswith("rc=0")
    return p


def as_user(pod: Any, uid: int, keep_groups: bool = True) -> Any:
    """The same pod's container, one of its processes running as ``uid`` (a launcher that
    changes user), keeping or dropping the pod's supplementary groups."""
    other = copy.deepcopy(pod)
    other.spec.containers[0].securityContext = SecurityContext(runAsUser=uid, runAsGroup=uid)
    if not keep_groups:
        other.spec.securityContext.supplementalGroups = None
        other.spec.securityContext.fsGroup = None
    return other


def test_two_uids_of_a_pod_share_its_region_and_a_process_without_its_group_cannot(
        node: Any, kube_client: Client, readable: Path) -> None:
    ns, _ = create_project_namespace(kube_client, "uids")
    wait_webhook_sees_project(kube_client, ns)
    procs: list[Process] = []
    try:
        manifest = runai_pod("uids", {"gpu-memory": "8192"})
        manifest["spec"].update(nodeSelector={"kubernetes.io/hostname": NODE},
                                securityContext={"runAsUser": 1001})
        create(kube_client, manifest, ns)
        pod = wait_until("bound", lambda: (p := kube_client.get(Pod, "uids", namespace=ns))
                         .spec.nodeName and p)
        assert pod.spec.securityContext.supplementalGroups == [61000]  # added by the webhook
        key = pod.metadata.annotations["tessera.io/gpu-config-key"]
        wait_until("the config", lambda: any((node.containers_dir / key).glob("conf/*/gpu-isolation.conf")))
        region = node.containers_dir / key / "region" / "gpu-usage.region"
        assert region.stat().st_gid == 61000 and region.stat().st_mode & 0o777 == 0o660

        first = start(node, pod, readable)  # UID 1001, groups [61000]
        procs.append(first)
        second = start(node, as_user(pod, 1002), readable)
        procs.append(second)
        dropped = start(node, as_user(pod, 1003, keep_groups=False), readable)
        procs.append(dropped)
        assert not dropped(f"alloc {1 * GiB}").startswith("rc=0")  # fail closed
        assert first(f"alloc {5 * GiB}").startswith("rc=0")
        assert not second(f"alloc {3 * GiB}").startswith("rc=0")  # one 8 GiB budget for both UIDs
        assert second(f"alloc {2 * GiB}").startswith("rc=0")

        dropped.popen.stdin.close()
        dropped.popen.wait(timeout=10)
        err = dropped.popen.stderr.read()
        assert "gpu-usage.region" in err and "Permission denied" in err and "fail closed" in err
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
        with contextlib.suppress(Exception):
            kube_client.delete(Pod, "uids", namespace=ns, grace_period=0)
