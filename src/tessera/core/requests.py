"""Turning what users type (CLI flags, API fields, annotations) into a validated GpuRequest.

Every front end calls these functions, so a rule is written once and every refusal names the
field the user wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from tessera.core.elastic import check_elastic_max
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest, Node
from tessera.core.text import MAX_SHORT, check_text
from tessera.core.units import (
    GiB,
    format_bytes,
    parse_decimal,
    parse_gpu_memory,
    parse_memory,
    parse_portion,
)

_GPU_RULE = "must be a GPU portion in (0, 1) such as 0.5, or a whole number of GPUs such as 2"


def parse_models(value: str | Iterable[str] | None, field: str = "gpu_model") -> frozenset[str]:
    """``V100M16|V100M32`` (or a list) to a set of allowed GPU models; empty means any."""
    if value is None:
        return frozenset()
    if isinstance(value, str):
        check_text(value, field, MAX_SHORT)
    parts = [p.strip() for p in (value.split("|") if isinstance(value, str) else value)]
    if any(not p for p in parts) and parts != [""]:
        raise InvalidRequest(field, "must be model names separated by '|', with none empty", value)
    return frozenset(p for p in parts if p)


def parse_gpu_request(
    *,
    gpu: object = None,
    gpu_devices: object = None,
    gpu_portion: object = None,
    gpu_portion_limit: object = None,
    gpu_memory: object = None,
    gpu_memory_limit: object = None,
    gpu_model: str | Iterable[str] | None = None,
    memory_unit_required: bool = False,
) -> GpuRequest:
    """Build a GpuRequest from the fields of the CLI and REST API.

    ``gpu`` is the short form (``-g 0.5`` or ``-g 2``); the others are the explicit forms of
    Run:ai's v2 CLI and API. Each field is checked here, once, before anything is placed.
    ``memory_unit_required``: a bare memory number is refused (what users type: CLI flags and
    API fields); else it is bytes (tessera's annotations are Kubernetes quantities).
    """
    memory_of = parse_gpu_memory if memory_unit_required else parse_memory
    models = parse_models(gpu_model)
    portion = None if gpu_portion is None else parse_portion(gpu_portion, "gpu_portion")
    devices = None if gpu_devices is None else _parse_devices(gpu_devices)
    if gpu is not None:
        if gpu_portion is not None or gpu_memory is not None:
            raise InvalidRequest("gpu", "give the GPUs once: a count or portion here, or a portion or memory request, not both")
        number = parse_decimal(gpu, "gpu", _GPU_RULE)
        if 0 < number < 1:
            portion = parse_portion(gpu, "gpu")
        elif number >= 1 and number == number.to_integral_value():
            if devices is not None and devices != int(number):
                raise InvalidRequest("gpu_devices", f"contradicts the GPU count {gpu} given too", gpu_devices)
            if gpu_portion_limit is not None or gpu_memory_limit is not None:
                raise InvalidRequest("gpu_portion_limit", "whole GPUs take no limit")
            return GpuRequest.whole(int(number), models)
        else:
            raise InvalidRequest("gpu", _GPU_RULE, gpu)

    memory = None if gpu_memory is None else memory_of(gpu_memory, "gpu_memory")
    if portion is not None and memory is not None:
        raise InvalidRequest("gpu_memory", "give a GPU portion or a GPU memory amount, not both")
    if portion is None and gpu_portion_limit is not None:
        raise InvalidRequest("gpu_portion_limit", "needs a portion request to raise (a GPU portion such as 0.25)")
    if memory is None and gpu_memory_limit is not None:
        raise InvalidRequest("gpu_memory_limit", "needs a memory request to raise (GPU memory such as 5G)")

    if portion is not None:
        limit = (
            None
            if gpu_portion_limit is None
            else parse_portion(gpu_portion_limit, "gpu_portion_limit", allow_whole=True)
        )
        return _build(GpuKind.PORTION, devices or 1, models, portion=portion, portion_limit=limit)
    if memory is not None:
        mlimit = None if gpu_memory_limit is None else memory_of(gpu_memory_limit, "gpu_memory_limit")
        return _build(GpuKind.MEMORY, devices or 1, models, memory=memory, memory_limit=mlimit)
    if devices is not None:
        return GpuRequest.whole(devices, models)
    if models:
        raise InvalidRequest("gpu_model", "needs a GPU request to constrain")
    return GpuRequest.none()


def cgpu_request(total_gib: object, gpu_count: object = None) -> GpuRequest:
    """Alibaba cGPU: ``aliyun.com/gpu-mem: N`` GiB over ``aliyun.com/gpu-count: M`` GPUs.

    Each GPU gets N/M GiB, which must be a whole number of GiB, as cGPU requires.
    """
    from tessera.core.units import parse_aliyun_gpu_mem

    total = parse_aliyun_gpu_mem(total_gib)
    count = 1 if gpu_count is None else _parse_devices(gpu_count, "aliyun.com/gpu-count")
    if (total // GiB) % count:
        raise InvalidRequest(
            "aliyun.com/gpu-mem",
            f"must divide evenly over aliyun.com/gpu-count={count} GPUs (N/M whole GiB)",
            total // GiB,
        )
    return GpuRequest.of_memory(total // count, devices=count)


def _parse_devices(value: object, field: str = "gpu_devices") -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,6}", text) or int(text) < 1:
        raise InvalidRequest(field, "must be a whole number of devices, 1 or more",
                             value if len(text) <= 20 else f"{text[:20]}…")
    return int(text)


def _build(kind: GpuKind, devices: int, models: frozenset[str], **kw: object) -> GpuRequest:
    return GpuRequest(kind, devices=devices, models=models, **kw)  # type: ignore[arg-type]


def estimate_gpus(request: GpuRequest, nodes: Iterable[Node], workers: int = 1) -> float:
    """GPUs a request counts as before it is placed (for quota checks and listings): whole
    devices, or the share of the largest device it may use."""
    if request.kind is GpuKind.NONE:
        return 0.0
    sizes = [g.schedulable for n in nodes for g in n.gpus if request.allows(g.model)]
    return request.gpus_on(max(sizes, default=1)) * workers


def check_against_cluster(request: GpuRequest, nodes: Iterable[Node],
                          workers: tuple[int, int] | None = None) -> None:
    """Refuse a request no node of this cluster could ever hold, even empty; with ``workers``
    (minimum, maximum), also an elastic maximum the cluster could never hold (core.elastic).

    This is bad input, not a wait: more devices than any node has, more memory than any device
    has, or a model the cluster does not have.
    """
    if request.kind is GpuKind.NONE:
        return
    nodes = list(nodes)
    eligible = [[g for g in n.gpus if request.allows(g.model)] for n in nodes]
    if request.models and not any(eligible):
        have = sorted({g.model for n in nodes for g in n.gpus})
        raise InvalidRequest(
            "gpu_model",
            f"no GPU of model {'|'.join(sorted(request.models))} in the cluster "
            f"(models here: {', '.join(have) or 'none'})",
        )
    most = max((len(e) for e in eligible), default=0)
    if request.devices > most:
        raise InvalidRequest(
            "gpu_devices",
            f"asks for {request.devices} GPUs on one node; the largest node has {most}",
            request.devices,
        )
    if request.kind is GpuKind.MEMORY:
        assert request.memory is not None
        best = max((g for e in eligible for g in e), key=lambda g: g.schedulable, default=None)
        largest = best.schedulable if best else 0
        if request.memory > largest:
            usable = "" if best is None or not best.headroom else (
                f", of which {format_bytes(largest)} can be given to workloads")
            raise InvalidRequest(
                "gpu_memory",
                "is larger than every GPU in the cluster (largest is "
                f"{format_bytes(best.memory if best else 0)}{usable})",
                format_bytes(request.memory),
            )
    if workers is not None:
        check_elastic_max(request, nodes, *workers)


def as_portion(value: Decimal | float | str) -> Decimal:
    return parse_portion(value, "gpu_portion")


def gpu_request_to_dict(gpu: GpuRequest) -> dict[str, object]:
    """A plain JSON-able record of a request, as the stores keep it."""
    return {
        "kind": gpu.kind.value,
        "devices": gpu.devices,
        "portion": None if gpu.portion is None else str(gpu.portion),
        "portionLimit": None if gpu.portion_limit is None else str(gpu.portion_limit),
        "memory": gpu.memory,
        "memoryLimit": gpu.memory_limit,
        "models": sorted(gpu.models),
        **({"compute": str(gpu.compute)} if gpu.compute is not None else {}),
    }


def gpu_request_from_dict(d: Mapping[str, Any]) -> GpuRequest:
    """The inverse of ``gpu_request_to_dict`` (validated again on the way in)."""
    return GpuRequest(
        GpuKind(d["kind"]),
        devices=int(d["devices"]),
        portion=None if d["portion"] is None else Decimal(d["portion"]),
        portion_limit=None if d["portionLimit"] is None else Decimal(d["portionLimit"]),
        memory=d["memory"],
        memory_limit=d["memoryLimit"],
        models=frozenset(d["models"]),
        compute=None if d.get("compute") is None else Decimal(str(d["compute"])),
    )
