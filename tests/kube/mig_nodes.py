"""Test helpers for MIG on the test cluster: a node whose GPU is an A100-40GB in MIG mode with
its tessera-node on the fake NVML, the partitions its inventory lists, and waiting for a pod to
be gone."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from tessera.kube import names
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape, node_manifest
from tessera.testing.node_agents import NodeAgent, NodeAgents, start_node_agents
from tests.waiting import wait_until


@contextlib.contextmanager
def mig_node_agents(cluster: TestCluster, client: Client, name: str, index: int, taint: str,
                    env: dict[str, str] | None = None) -> Iterator[NodeAgents]:
    """A node with one A100-40GB advertised as no ``nvidia.com/gpu`` (the GPU operator's mixed
    strategy leaves a MIG-mode GPU out of it), tainted ``taint`` so other tests' pods stay off,
    and its tessera-node on the fake NVML (``env``: default, the GPU in MIG mode)."""
    manifest = node_manifest(name, NodeShape(gpus=1, model="A100-40GB"), index=index)
    for part in ("capacity", "allocatable"):
        manifest["status"][part][names.GPU_RESOURCE] = "0"
    manifest["spec"]["taints"] = [{"key": taint, "value": "true", "effect": "NoSchedule"}]
    client.create(codecs.from_dict(manifest))
    cluster.wait_nodes_ready([name])
    agents = start_node_agents(cluster, [name],
                               env_overrides={"FAKE_GPU_MIG_0": "1"} if env is None else env)
    try:
        agents.wait_ready()
        yield agents
    finally:
        agents.stop()
        client.delete(Node, name)


def partitions(client: Client, node: str) -> list[dict[str, Any]]:
    """The partitions ``node``'s tessera-node lists in its inventory."""
    got = client.get(Node, node)
    inv = json.loads((got.metadata.annotations or {})[names.NODE_GPU_INVENTORY])
    return [p for g in inv["gpus"] for p in g.get("partitions") or ()]


def pod_gone(client: Client, ns: str, pod: str,
             and_then: Callable[[], bool] = lambda: True) -> None:
    """Deletes the pod and waits until it is gone (and ``and_then`` holds)."""
    client.delete(Pod, pod, namespace=ns, grace_period=0)

    def check() -> bool:
        try:
            client.get(Pod, pod, namespace=ns)
        except ApiError:
            return and_then()
        return False
    wait_until(f"{pod} gone", check)


@contextlib.contextmanager
def agent_env(agent: NodeAgent, **extra: str) -> Iterator[dict[str, str]]:
    """The node's tessera-node restarted with ``extra`` in its environment (a fault of the fake
    NVML, say), and restarted with its own environment after; yields that own environment."""
    normal = dict(agent.env)
    agent.process.stop()
    agent.env = {**normal, **extra}
    agent.restart()
    try:
        yield normal
    finally:
        agent.process.stop()
        agent.env = normal
        agent.restart()
