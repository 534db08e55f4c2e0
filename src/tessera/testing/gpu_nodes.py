"""Simulated GPU nodes: Node objects shaped like real NVIDIA GPU nodes, managed by kwok.

A node carries what the NVIDIA device plugin and GPU feature discovery (GFD) put on a real one:

- ``status.capacity`` / ``status.allocatable``: ``nvidia.com/gpu`` (whole GPUs), cpu, memory, pods;
- GFD labels: ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` (MiB per GPU),
  ``nvidia.com/gpu.count``, ``nvidia.com/gpu.family``, ``nvidia.com/gpu.compute.major|minor``,
  ``nvidia.com/gpu.present``, ``nvidia.com/mig.capable``, ``nvidia.com/mps.capable``,
  ``nvidia.com/gpu.replicas``, ``nvidia.com/gpu.sharing-strategy``,
  ``nvidia.com/cuda.driver.major|minor|rev``;
- the annotation ``kwok.x-k8s.io/node: fake`` (kwok manages nodes that carry it);
- the annotation ``tessera.io/gpu-uuids``: the node's GPU UUIDs as a comma-separated list in
  device-index order (``GPU-<uuid>``), deterministic in the node name. On a real node the UUIDs come
  from NVML / the kubelet's pod-resources API; on a simulated node this annotation is where the
  kubelet double and the fake NVML of the node's tessera-node take them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tessera.core.gpu_models import GPU_MODELS, GpuModel

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_UUIDS_ANNOTATION = "tessera.io/gpu-uuids"
SIMULATED_LABEL = "tessera.io/simulated"
GPU_RESOURCE = "nvidia.com/gpu"

_UUID_NAMESPACE = uuid.UUID("6c1d7a52-3f0e-4c55-9d0b-7f1f3a4e2b10")


def gpu_model(key: str) -> GpuModel:
    try:
        return GPU_MODELS[key]
    except KeyError:
        raise ValueError(
            f"--gpu-model: unknown model {key!r}; choose one of {', '.join(GPU_MODELS)}"
        ) from None


def gpu_uuids(node_name: str, count: int) -> list[str]:
    """Stable per-node GPU UUIDs in NVML's ``GPU-<uuid>`` form."""
    return [f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{i}')}" for i in range(count)]


@dataclass(frozen=True)
class NodeShape:
    gpus: int = 8
    model: str = "H100-80GB"
    cpu: str = "96"
    memory: str = "1024Gi"
    pods: str = "250"

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"--gpus-per-node must be >= 0, got {self.gpus}")
        gpu_model(self.model)


def node_manifest(name: str, shape: NodeShape, *, index: int = 0) -> dict[str, Any]:
    """The Node object (as a plain dict) for a simulated GPU node."""
    model = gpu_model(shape.model)
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": shape.pods,
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(shape.gpus),
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SIMULATED_LABEL: "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": model.product,
        "nvidia.com/gpu.memory": str(model.memory_mib),
        "nvidia.com/gpu.count": str(shape.gpus),
        "nvidia.com/gpu.family": model.family,
        "nvidia.com/gpu.compute.major": str(model.compute[0]),
        "nvidia.com/gpu.compute.minor": str(model.compute[1]),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": str(model.mig_capable).lower(),
        "nvidia.com/mps.capable": "false",
        "nvidia.com/cuda.driver.major": "570",
        "nvidia.com/cuda.driver.minor": "133",
        "nvidia.com/cuda.driver.rev": "20",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "8",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
                GPU_UUIDS_ANNOTATION: ",".join(gpu_uuids(name, shape.gpus)),
            },
        },
        "spec": {"podCIDR": f"10.{64 + index // 256}.{index % 256}.0/24"},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
        },
    }
