"""Isolation bound to the container, end to end on the test cluster: the webhook wires the
config mount, the scheduler binds, tessera-node writes the files the mounts name; bad input gets
an Event and no files (the hostPath mounts are ``type: Directory``: the container cannot start
uncapped)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from tessera.isolation.config import CONFIG_HEADER
from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    create,
    create_project_namespace,
    delete_pods,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.kube.node_helpers import agent_of
from tests.waiting import wait_until

CONTAINERS_HOST_DIR = "/var/lib/tessera/containers"


def test_share_container_gets_its_config_file_from_the_node(stack: TestCluster,
                                                            kube_client: Client) -> None:
    ns, _ = create_project_namespace(kube_client, "iso-files")
    wait_webhook_sees_project(kube_client, ns)
    try:
        create(kube_client, runai_pod("frac05", {"gpu-fraction": "0.5"}), ns)
        pod = wait_until("bound", lambda: (p := kube_client.get(Pod, "frac05", namespace=ns))
                         .spec.nodeName and p)
        ann = pod.metadata.annotations
        key = ann[names.GPU_CONFIG_KEY]
        assert len(key) == 16
        container = pod.spec.containers[0].name
        volumes = {v.name: v for v in pod.spec.volumes}
        assert volumes["tessera-gpu-config"].hostPath.path == \
            f"{CONTAINERS_HOST_DIR}/{key}/conf/{container}"
        assert volumes["tessera-gpu-config"].hostPath.type == "Directory"
        assert volumes["tessera-gpu-region"].hostPath.path == f"{CONTAINERS_HOST_DIR}/{key}/region"
        mounts = {m.mountPath: m for m in pod.spec.containers[0].volumeMounts}
        assert mounts["/etc/tessera"].name == "tessera-gpu-config" and mounts["/etc/tessera"].readOnly
        assert mounts["/run/tessera"].name == "tessera-gpu-region"
        # The node's loans ledger directory, read-write: every share's processes write it.
        assert volumes["tessera-gpu-loans"].hostPath.path == "/var/lib/tessera/loans"
        assert mounts["/run/tessera-loans"].name == "tessera-gpu-loans"
        assert not mounts["/run/tessera-loans"].readOnly

        agent = agent_of(stack, pod.spec.nodeName)
        conf = agent.containers_dir / key / "conf" / container / "gpu-isolation.conf"
        text = wait_until("the config file", lambda: conf.is_file() and conf.read_text())
        placement = json.loads(ann[names.PLACEMENT])
        uuid = ann[names.NODE_GPU_UUIDS]
        # Each context is charged the GPU's headroom, as the agent published it on the Node.
        node_ann = kube_client.get(Node, pod.spec.nodeName).metadata.annotations
        headroom = int(node_ann[names.NODE_GPU_HEADROOM].split(",")[0])
        assert headroom > 0
        assert text.splitlines() == [
            CONFIG_HEADER, "region /run/tessera/gpu-usage.region", f"context-overhead {headroom}",
            # Every share joins its node's loans ledger (mounted at /run/tessera-loans).
            f"loans dir=/run/tessera-loans share={key} priority=50 wait-ms=10000 "
            f"headroom={headroom}",
            f"device index=0 uuid={uuid} request={placement['request'][0]} "
            f"limit={placement['limit'][0]}"]
        # The region: root (the agent) and the group the webhook gave the pod (it stated none),
        # shared by every UID of the pod, not world-writable.
        assert pod.spec.securityContext.supplementalGroups == [61000]
        region = agent.containers_dir / key / "region" / "gpu-usage.region"
        assert region.is_file()
        assert (stat.S_IMODE(region.stat().st_mode), region.stat().st_gid) == (0o660, 61000)
        assert (stat.S_IMODE(region.parent.stat().st_mode), region.parent.stat().st_gid) == (0o2770, 61000)
        assert json.loads((agent.containers_dir / key / "pod.json").read_text())["group"] == 61000
        identity = json.loads((agent.containers_dir / key / "pod.json").read_text())
        assert (identity["namespace"], identity["pod"], identity["uid"]) == (
            ns, "frac05", pod.metadata.uid)
        # The agent's metrics list the container with its request and limit.
        body = httpx.get(agent.metrics_url, timeout=5).text
        line = next(x for x in body.splitlines()
                    if x.startswith("tessera_container_gpu_memory_request_bytes{")
                    and 'pod="frac05"' in x)
        assert f'namespace="{ns}"' in line and f'gpu_uuid="{uuid}"' in line
        assert float(line.rsplit(" ", 1)[1]) == placement["request"][0]
        # Pod gone: its files go too.
        kube_client.delete(Pod, "frac05", namespace=ns, grace_period=0)
        wait_until("files removed", lambda: not (agent.containers_dir / key).exists())
    finally:
        delete_pods(kube_client, ns)


def test_agent_config_dir_matches_the_webhook_default() -> None:
    from tessera.kube.admission.policy import WebhookConfig
    from tessera.node.agent import AgentOptions

    assert WebhookConfig().containers_host_dir == CONTAINERS_HOST_DIR
    assert AgentOptions(node_name="n").containers_host_dir == Path(CONTAINERS_HOST_DIR)


def test_region_belongs_to_the_group_the_pod_states(stack: TestCluster,
                                                    kube_client: Client) -> None:
    """A pod with its own fsGroup keeps it (the webhook adds nothing) and its region is that
    group's."""
    ns, _ = create_project_namespace(kube_client, "iso-group")
    wait_webhook_sees_project(kube_client, ns)
    try:
        manifest = runai_pod("fsgroup", {"gpu-fraction": "0.25"})
        manifest["spec"]["securityContext"] = {"runAsUser": 1000, "fsGroup": 4242}
        create(kube_client, manifest, ns)
        pod = wait_until("bound", lambda: (p := kube_client.get(Pod, "fsgroup", namespace=ns))
                         .spec.nodeName and p)
        assert pod.spec.securityContext.supplementalGroups is None
        key = pod.metadata.annotations[names.GPU_CONFIG_KEY]
        region = agent_of(stack, pod.spec.nodeName).containers_dir / key / "region" / "gpu-usage.region"
        wait_until("the region", region.is_file)
        assert (stat.S_IMODE(region.stat().st_mode), region.stat().st_gid) == (0o660, 4242)
    finally:
        delete_pods(kube_client, ns)
