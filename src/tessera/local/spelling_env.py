"""Environment variables of the other products' spellings, in embedded mode as on Kubernetes.

- Run:ai's ``RUNAI_GPU_MEMORY_LIMIT`` given with ``-e`` is the burst limit of a share, as the
  admission webhook reads it on a pod (docs/admission.md): a GPU portion for a portion request
  (``0.8``), a quantity for a memory request (``8G``). Given with a limit of its own, or on a
  request that takes none, it is refused naming the variable; never accepted and ignored.
- cGPU's ``ALIYUN_COM_GPU_MEM_CONTAINER`` (whole GiB of the share on each GPU) and
  ``ALIYUN_COM_GPU_MEM_DEV`` (whole GiB of each GPU) are set in every shared pod's environment,
  as the webhook and the scheduler set them on Kubernetes (the smallest where devices differ).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.units import GiB, parse_gpu_memory, parse_portion

RUNAI_LIMIT = "RUNAI_GPU_MEMORY_LIMIT"
FIELD = f"spec.environmentVariables[{RUNAI_LIMIT}]"


def with_runai_limit(gpu: GpuRequest, env: Mapping[str, str]) -> GpuRequest:
    """``gpu`` with the burst limit ``RUNAI_GPU_MEMORY_LIMIT`` sets, if the variable is given."""
    value = env.get(RUNAI_LIMIT)
    if value is None:
        return gpu
    if gpu.kind is GpuKind.PORTION:
        limit = parse_portion(value, FIELD, allow_whole=True)
        if gpu.portion_limit is not None and gpu.portion_limit != limit:
            raise InvalidRequest(FIELD, f"{RUNAI_LIMIT} contradicts the portion limit {gpu.portion_limit} given "
                                 "with the request; give the limit once", value)
        return dataclasses.replace(gpu, portion_limit=limit)
    if gpu.kind is GpuKind.MEMORY:
        mlimit = parse_gpu_memory(value, FIELD)
        if gpu.memory_limit is not None and gpu.memory_limit != mlimit:
            raise InvalidRequest(FIELD, f"{RUNAI_LIMIT} contradicts the memory limit given with the request; "
                                 "give the limit once", value)
        return dataclasses.replace(gpu, memory_limit=mlimit)
    raise InvalidRequest(FIELD, f"{RUNAI_LIMIT} is the burst limit of a GPU share (a portion or GPU memory "
                         "request); this request has none to raise", value)


def cgpu_env(device_bytes: Sequence[int], request_bytes: Sequence[int]) -> dict[str, str]:
    """cGPU's variables for a pod holding ``request_bytes`` of devices of ``device_bytes``."""
    if not device_bytes:
        return {}
    return {"ALIYUN_COM_GPU_MEM_CONTAINER": str(min(request_bytes) // GiB),
            "ALIYUN_COM_GPU_MEM_DEV": str(min(device_bytes) // GiB)}
