"""Webhook down: GPU-share pods are refused (no share without isolation), every other pod is
admitted (the webhooks never see pods that ask for no GPU)."""

from __future__ import annotations

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Pod

from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    _cgpu,
    create_project_namespace,
    delete_pods,
    plain_pod,
    runai_pod,
)


def test_webhook_down_refuses_gpu_pods_and_admits_the_rest(
    kube_cluster: TestCluster, kube_client: Client
) -> None:
    crds = [d for d in local.helm_template(include_crds=True)
            if d["kind"] == "CustomResourceDefinition"]
    local.apply(kube_cluster, crds)
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io")
    hook = local.start_webhook(kube_cluster, name="webhook-down")
    ns = ""
    try:
        local.register(kube_cluster, hook)
        ns, _ = create_project_namespace(kube_client, "down")
        hook.stop()
        gpu_pods = {
            "runai": runai_pod("frac05", {"gpu-fraction": "0.5"}),
            "cgpu": {**_cgpu("4", 8), "metadata": {"name": "binpack-1-0",
                                                  "labels": {"aliyun.com/gpu-count": "4"}}},
            "tessera": {**plain_pod("canon"), "metadata": {
                "name": "canon", "annotations": {"tessera.io/gpu-portion": "0.5"}}},
            "by-hand": plain_pod("byhand", containers=[{"name": "m", "image": "x", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
        }
        for label, manifest in gpu_pods.items():
            with pytest.raises(ApiError) as info:
                kube_client.create(codecs.from_dict(manifest), namespace=ns)
            message = str(info.value.status.message)
            assert "failed calling webhook" in message and "pods.mutate.tessera.io" in message, \
                (label, message)
        others = [plain_pod("cpu"),
                  plain_pod("whole-gpu", containers=[{"name": "m", "image": "x", "resources": {
                      "limits": {"nvidia.com/gpu": "1"}}}]),
                  {**plain_pod("labelled"), "metadata": {"name": "labelled", "labels": {
                      "app": "web"}, "annotations": {"example.com/x": "y"}}}]
        for manifest in others:
            kube_client.create(codecs.from_dict(manifest), namespace=ns)
        created = {p.metadata.name for p in kube_client.list(Pod, namespace=ns)}
        assert created == {"cpu", "whole-gpu", "labelled"}
        # An exempt namespace (label tessera.io/webhook=disabled, set by an admin) is not gated.
        kube_cluster.kubectl("label", "namespace", ns, "tessera.io/webhook=disabled")
        kube_client.create(codecs.from_dict(runai_pod("after", {"gpu-fraction": "0.5"})),
                           namespace=ns)
        assert kube_client.get(Pod, "after", namespace=ns).spec.schedulerName == "runai-scheduler"
    finally:
        local.unregister(kube_cluster)
        hook.stop()
        if ns:
            delete_pods(kube_client, ns)
