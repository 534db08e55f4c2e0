"""The webhook's translation run in-process on one H100 node (the spelling tests share the view and
the pod builder)."""

from __future__ import annotations

from typing import Any

from tessera.core.model import GpuDevice, Node
from tessera.core.units import MiB
from tessera.kube.admission.policy import ClusterView

NODES = [Node("n0", tuple(GpuDevice(f"u{i}", i, 81559 * MiB, "H100-80GB") for i in range(8)))]


VIEW = ClusterView(nodes=lambda: NODES, project_of=lambda ns: "team-a")


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        **container: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "x", **container}]}}
