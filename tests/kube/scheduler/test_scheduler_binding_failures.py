"""The janitor deletes a ConfigMap only on the API server's word (a real API server); the
binding back-off itself is tested without a cluster in test_scheduler_seams.py."""

from __future__ import annotations

import asyncio
from typing import Any

from tessera.kube.scheduler import KubeScheduler


def test_a_configmap_is_deleted_only_when_the_api_server_says_its_pod_is_unbound(
        kube_cluster: Any, kube_client: Any, kube_namespace: str) -> None:
    """The scheduler's cache says nothing of a pod (a watch still reconnecting after an
    outage), but the API server has it bound (a binding whose answer was lost): its ConfigMap
    stays. Once the API server says the pod is gone, the ConfigMap is deleted. (Seen as one
    failed trial in 100 of `tessera.bench.faults_kube --scenarios apiserver`: a pod bound with
    no ConfigMap.)"""
    from lightkube import AsyncClient, KubeConfig
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap, Pod

    from tessera.kube import names
    from tessera.kube.caches import ConfigMapInfo

    ns = kube_namespace
    node = kube_cluster.gpu_nodes[0]
    kube_client.create(Pod(metadata=ObjectMeta(name="bound", namespace=ns),
                           spec=PodSpec(nodeName=node, containers=[Container(name="c", image="x")])))
    kube_client.create(ConfigMap(metadata=ObjectMeta(
        name="bound-tessera-gpu", namespace=ns, labels={names.MANAGED_BY: "tessera"},
        annotations={names.CONFIGMAP_POD: "bound"}), data={"NVIDIA_VISIBLE_DEVICES": "GPU-x"}))

    async def run() -> None:
        client = AsyncClient(KubeConfig.from_file(str(kube_cluster.kubeconfig)))
        try:
            sched = KubeScheduler(client=client)
            sched.caches.configmaps.items[(ns, "bound-tessera-gpu")] = ConfigMapInfo(
                ns, "bound-tessera-gpu", "bound")
            await sched.janitor.run()
            await asyncio.gather(*list(sched.background))
            kube_client.get(ConfigMap, "bound-tessera-gpu", namespace=ns)  # still there
            kube_client.delete(Pod, "bound", namespace=ns, grace_period=0)
            while True:
                try:
                    kube_client.get(Pod, "bound", namespace=ns)
                except Exception:
                    break
                await asyncio.sleep(0.05)
            await sched.janitor.run()
            await asyncio.gather(*list(sched.background))
        finally:
            await client.close()

    asyncio.run(run())
    assert not [c for c in kube_client.list(ConfigMap, namespace=ns)
                if c.metadata.name == "bound-tessera-gpu"]
