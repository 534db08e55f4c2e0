"""Device truth (issue 27, item 8): a whole-GPU pod the device plugin gave other GPUs than
tessera planned gets its ``tessera.io/placement`` and ``tessera.io/gpu-uuids`` rewritten to the
GPUs the kubelet reports for it (pod-resources), with a GPUsReassigned Event: tessera-node against
the real API server and the kubelet double's device assignment (the device plugin's lowest free
GPUs)."""

from __future__ import annotations

import json

from lightkube import Client, codecs
from lightkube.resources.core_v1 import Event, Pod

from tessera import wire
from tessera.node.podresources.client import gpus_by_pod, list_devices
from tessera.testing.cluster import TestCluster
from tests.waiting import wait_until


def test_the_record_follows_the_gpus_the_kubelet_gave(kube_cluster: TestCluster,
                                                     kube_client: Client,
                                                     kube_namespace: str) -> None:
    node = kube_cluster.gpu_nodes[-1]  # type: ignore[attr-defined]
    agents = kube_cluster.node_agents[0]
    agents.wait_ready()
    agent = agents.agents[node]
    ns = kube_namespace
    planned = (6, 7)
    placement = {"node": node, "devices": list(planned), "request": [1, 1], "limit": [1, 1],
                 "exclusive": True, "cpu": 0, "memory": 0}
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "whole", "namespace": ns,
                     "annotations": {wire.PLACEMENT: json.dumps(placement)}},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "example.invalid/cuda:12",
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}))
    socket = agent.root / "kubelet.sock"

    def given() -> list[str] | None:
        return gpus_by_pod(list_devices(socket)).get((ns, "whole"))
    ids = wait_until("the device plugin double assigns the pod's GPUs", given, 30)
    held = [agent.uuids.index(i) if i in agent.uuids else int(i) for i in ids]
    assert set(held) != set(planned), "precondition: the plugin chose other GPUs"

    def followed() -> dict[str, str] | None:
        ann = kube_client.get(Pod, "whole", namespace=ns).metadata.annotations or {}
        got = wire.placement_from_json(ann[wire.PLACEMENT])
        return ann if list(got.devices) == held else None
    ann = wait_until("tessera-node rewrites the placement", followed, 30)
    assert ann[wire.POD_GPU_UUIDS] == ",".join(agent.uuids[d] for d in held)
    assert wire.placement_from_json(ann[wire.PLACEMENT]).exclusive
    events = wait_until("a GPUsReassigned Event", lambda: [
        e for e in kube_client.list(Event, namespace=ns)
        if e.involvedObject.name == "whole" and e.reason == "GPUsReassigned"], 30)
    assert "planned 6, 7" in (events[0].message or "")
