"""What tessera-node may write into a per-pod ConfigMap through the webhook (found on the real
node: the webhook refused tessera-node's MIG UUID, so a MIG-served share never started): only a
MIG pod's partition UUID, as the chart's tessera-node-agent ServiceAccount; anything else is
still the scheduler's alone."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.kube.admission.policy import WebhookConfig, check_configmap

CONFIG = WebhookConfig()
UUID = "MIG-643dd1fa-2a92-5eb3-475c-f467741930ea"


def cm(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "p-tessera-gpu", "labels": {"app.kubernetes.io/managed-by":
                                                              "tessera"}},
            "data": {"TESSERA_MIG_PROFILE": "1g.10gb", "TESSERA_GPU_MEMORY_LIMIT": "1",
                     "NVIDIA_VISIBLE_DEVICES": "", **data}}


def review(user: str, new: dict[str, Any] | None, old: dict[str, Any] | None,
           operation: str = "UPDATE") -> dict[str, Any]:
    return {"userInfo": {"username": user}, "operation": operation, "object": new,
            "oldObject": old}


def test_tessera_node_writes_the_partition_uuid_of_a_mig_pod() -> None:
    check_configmap(review(CONFIG.node_user, cm(NVIDIA_VISIBLE_DEVICES=UUID,
                                                TESSERA_MIG_UUID=UUID), cm()), CONFIG)


@pytest.mark.parametrize("user,new,old,operation", [
    ("system:serviceaccount:default:someone", cm(NVIDIA_VISIBLE_DEVICES=UUID,
                                                 TESSERA_MIG_UUID=UUID), cm(), "UPDATE"),
    (CONFIG.node_user, cm(NVIDIA_VISIBLE_DEVICES=UUID, TESSERA_MIG_UUID=UUID), None, "CREATE"),
    (CONFIG.node_user, cm(NVIDIA_VISIBLE_DEVICES="GPU-1", TESSERA_MIG_UUID="GPU-1"), cm(),
     "UPDATE"),
    (CONFIG.node_user, cm(NVIDIA_VISIBLE_DEVICES=UUID, TESSERA_MIG_UUID=UUID,
                          TESSERA_GPU_MEMORY_LIMIT="99"), cm(), "UPDATE"),
    (CONFIG.node_user, {**cm(NVIDIA_VISIBLE_DEVICES=UUID, TESSERA_MIG_UUID=UUID),
                        "metadata": {"name": "p-tessera-gpu"}}, cm(), "UPDATE"),
    (CONFIG.node_user, {"metadata": cm()["metadata"], "data": {
        "NVIDIA_VISIBLE_DEVICES": UUID, "TESSERA_MIG_UUID": UUID}},
     {"metadata": cm()["metadata"], "data": {"NVIDIA_VISIBLE_DEVICES": ""}}, "UPDATE"),
])
def test_anything_else_stays_the_schedulers(user: str, new: dict[str, Any],
                                            old: dict[str, Any] | None, operation: str) -> None:
    """Another user; a create; a GPU UUID; another key changed (the limit); a label dropped;
    a ConfigMap not of a MIG pod."""
    with pytest.raises(InvalidRequest, match="written by tessera's scheduler only"):
        check_configmap(review(user, new, old, operation), CONFIG)
