"""A GPU request as the API's ``spec.compute`` fields (Run:ai's names), both ways it is written:
as a workload document shows it (:func:`compute_doc`) and as a client submits it
(:func:`submission_compute`, which the CLI sends). No pydantic here, so the CLI can import it
without the API's models."""

from __future__ import annotations

from typing import Any

from tessera.core.model import GpuKind, GpuRequest


def compute_doc(gpu: GpuRequest) -> dict[str, Any]:
    """A request as the API shows it: Run:ai's ``spec.compute`` fields."""
    doc: dict[str, Any] = {"gpuDevicesRequest": gpu.devices or None}
    if gpu.kind is GpuKind.PORTION:
        doc["gpuRequestType"] = "portion"
        doc["gpuPortionRequest"] = float(gpu.portion) if gpu.portion is not None else None
        doc["gpuPortionLimit"] = float(gpu.portion_limit) if gpu.portion_limit else None
    elif gpu.kind is GpuKind.MEMORY:
        doc["gpuRequestType"] = "memory"
        doc["gpuMemoryRequest"] = f"{gpu.memory}"
        doc["gpuMemoryLimit"] = None if gpu.memory_limit is None else f"{gpu.memory_limit}"
    if gpu.models:
        doc["gpuModel"] = "|".join(sorted(gpu.models))
    return doc


def submission_compute(req: GpuRequest, memory: str | None = None,
                       memory_limit: str | None = None) -> dict[str, Any]:
    """``spec.compute`` of a submission asking ``req`` (parsed by the core's rules); memory as
    the user wrote it (``memory``, ``memory_limit``: the units they chose are kept)."""
    compute: dict[str, Any] = {}
    if req.kind is GpuKind.WHOLE:
        compute["gpuDevicesRequest"] = req.devices
    elif req.kind is GpuKind.PORTION:
        compute.update(gpuRequestType="portion", gpuDevicesRequest=req.devices,
                       gpuPortionRequest=str(req.portion))
        if req.portion_limit is not None:
            compute["gpuPortionLimit"] = str(req.portion_limit)
    elif req.kind is GpuKind.MEMORY:
        compute.update(gpuRequestType="memory", gpuDevicesRequest=req.devices,
                       gpuMemoryRequest=str(memory if memory is not None else req.memory))
        if memory_limit is not None:
            compute["gpuMemoryLimit"] = str(memory_limit)
    return compute
