"""The domain: nodes with GPU devices, and what a workload asks for.

Objects here are immutable and validated when built, so an invalid request cannot exist.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from tessera.core.errors import InvalidRequest
from tessera.core.units import format_bytes, memory_text, portion_bytes


@dataclass(frozen=True, slots=True)
class GpuDevice:
    uuid: str
    index: int
    memory: int
    """Bytes of device memory."""
    model: str
    """Short model name used in constraints, e.g. ``V100M16`` or ``H100-80GB``."""
    product: str = ""
    """Marketing name as NVML or GPU feature discovery reports it."""
    mig_capable: bool = False
    headroom: int = 0
    """Bytes the driver and CUDA contexts keep on this device (tessera-node measures it, else a
    per-model default): not schedulable, so a workload does not run out of memory below its
    request."""

    def __post_init__(self) -> None:
        if self.memory <= 0:
            raise InvalidRequest(f"gpu[{self.index}].memory", "must be greater than 0 bytes", self.memory)
        if not 0 <= self.headroom < self.memory:
            raise InvalidRequest(f"gpu[{self.index}].headroom",
                                 "must be 0 or more and less than the device's memory", self.headroom)
        if self.index < 0:
            raise InvalidRequest("gpu.index", "must be 0 or more", self.index)

    @property
    def schedulable(self) -> int:
        """The bytes workloads can be given: memory less headroom (portions are of this)."""
        return self.memory - self.headroom


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: tuple[GpuDevice, ...] = ()
    cpu_milli: int = 0
    memory: int = 0
    """Bytes of host memory."""
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    nvlink: tuple[int, ...] | None = None
    """NVLink island of each device, by index (:mod:`tessera.core.nvlink`); None: unknown."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequest("node.name", "must not be empty")
        if self.cpu_milli < 0 or self.memory < 0:
            raise InvalidRequest(f"node {self.name}", "cpu and memory must be 0 or more")
        if sorted(g.index for g in self.gpus) != list(range(len(self.gpus))):
            raise InvalidRequest(f"node {self.name}.gpus", "indices must be 0..n-1, each once")
        if self.nvlink is not None and len(self.nvlink) != len(self.gpus):
            raise InvalidRequest(f"node {self.name}.nvlink", "must give one island per GPU",
                                 len(self.nvlink))


class GpuKind(enum.StrEnum):
    NONE = "none"
    WHOLE = "whole"
    PORTION = "portion"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a workload asks of GPUs, per pod.

    ``devices`` is the number of distinct devices of one node: whole GPUs for ``WHOLE``, shared
    devices for ``PORTION``/``MEMORY`` (each takes the same share). The request is guaranteed and
    is what placement and quota use; the optional limit is a burst cap above it.
    """

    kind: GpuKind = GpuKind.NONE
    devices: int = 0
    portion: Decimal | None = None
    portion_limit: Decimal | None = None
    memory: int | None = None
    memory_limit: int | None = None
    models: frozenset[str] = frozenset()
    compute: Decimal | None = None
    """Compute request per device (tessera.core.compute): the share of each device's time it is
    promised. Placement keeps the promises on a device within 1; None: none promised."""

    def __post_init__(self) -> None:
        _validate_gpu_request(self)

    @property
    def compute_units(self) -> int:
        """The compute request in millionths of a device's time (0 when none)."""
        return compute_units(self.compute)

    @classmethod
    def none(cls) -> GpuRequest:
        return cls()

    @classmethod
    def whole(cls, count: int, models: frozenset[str] = frozenset()) -> GpuRequest:
        return cls(GpuKind.WHOLE, devices=count, models=models)

    @classmethod
    def fraction(
        cls,
        portion: Decimal | str | float,
        devices: int = 1,
        limit: Decimal | str | float | None = None,
        models: frozenset[str] = frozenset(),
    ) -> GpuRequest:
        return cls(
            GpuKind.PORTION,
            devices=devices,
            portion=Decimal(str(portion)),
            portion_limit=None if limit is None else Decimal(str(limit)),
            models=models,
        )

    @classmethod
    def of_memory(
        cls,
        nbytes: int,
        devices: int = 1,
        limit: int | None = None,
        models: frozenset[str] = frozenset(),
    ) -> GpuRequest:
        return cls(GpuKind.MEMORY, devices=devices, memory=nbytes, memory_limit=limit, models=models)

    @property
    def shared(self) -> bool:
        return self.kind in (GpuKind.PORTION, GpuKind.MEMORY)

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def bytes_on(self, device_memory: int) -> int:
        """Guaranteed bytes this request takes on one device of that size."""
        if self.kind is GpuKind.WHOLE:
            return device_memory
        if self.kind is GpuKind.PORTION:
            assert self.portion is not None
            return portion_bytes(self.portion, device_memory)
        if self.kind is GpuKind.MEMORY:
            assert self.memory is not None
            return self.memory
        return 0

    def limit_bytes_on(self, device_memory: int) -> int:
        """Burst cap in bytes on one device: the limit if given, else the request."""
        if self.kind is GpuKind.PORTION and self.portion_limit is not None:
            return portion_bytes(self.portion_limit, device_memory)
        if self.kind is GpuKind.MEMORY and self.memory_limit is not None:
            return min(self.memory_limit, device_memory)
        return self.bytes_on(device_memory)

    def gpus_on(self, device_memory: int) -> float:
        """GPUs this request counts as on devices of that size (quota and reporting)."""
        if self.kind is GpuKind.WHOLE:
            return float(self.devices)
        compute = 0.0 if self.compute is None else float(self.compute)
        if self.kind is GpuKind.PORTION:
            assert self.portion is not None
            return max(float(self.portion), compute) * self.devices
        if self.kind is GpuKind.MEMORY:
            # max(memory portion, compute request): a share promised more of the GPU's time
            # than of its memory counts as that time (docs/compute-share.md).
            return max(self.bytes_on(device_memory) / device_memory, compute) * self.devices
        return 0.0

    def describe(self) -> str:
        """What one pod asks for, in words: "0.25 GPU, bursting to 0.8", "5G (4.66 GiB) of GPU
        memory", "2 whole GPUs". A workload's text (workers, MIG) is
        tessera.core.request_text.request_text, which every view prints."""
        models = f" of model {'|'.join(sorted(self.models))}" if self.models else ""
        if self.kind is GpuKind.WHOLE:
            return f"{self.devices} whole GPU{'s' if self.devices != 1 else ''}{models}"
        each = f" on each of {self.devices} GPUs" if self.devices > 1 else ""
        if self.kind is GpuKind.PORTION:
            assert self.portion is not None
            burst = ("" if self.portion_limit is None or self.portion_limit == self.portion
                     else f", bursting to {_portion_text(self.portion_limit)}")
            return f"{_portion_text(self.portion)} GPU{each}{models}{burst}"
        if self.kind is GpuKind.MEMORY:
            assert self.memory is not None
            burst = ("" if self.memory_limit is None or self.memory_limit == self.memory
                     else f", bursting to {memory_text(self.memory_limit)}")
            time = ("" if not self.compute else
                    f", promised {_portion_text(self.compute)} of its time")
            return f"{memory_text(self.memory)} of GPU memory{each}{models}{burst}{time}"
        return "no GPU"


COMPUTE_FULL = 1_000_000
"""A device's whole time in compute units (millionths)."""


def compute_units(value: Decimal | None) -> int:
    """A compute request (a fraction of a device's time) in millionths, rounded to nearest."""
    return 0 if value is None else int((value * COMPUTE_FULL).to_integral_value())


def _portion_text(value: Decimal) -> str:
    """A portion exactly as given, without trailing zeros: ``0.25``, ``0.025``, ``1``."""
    return format(value.normalize(), "f")


def _validate_gpu_request(r: GpuRequest) -> None:
    if r.compute is not None:
        if r.kind not in (GpuKind.PORTION, GpuKind.MEMORY):
            raise InvalidRequest("gpu_compute_request", "needs a shared GPU (a portion or a memory "
                                 "amount); whole GPUs' time is not shared", str(r.compute))
        if not (r.compute.is_finite() and 0 <= r.compute <= 1):
            raise InvalidRequest("gpu_compute_request", "must be a number in [0, 1], such as 0.3",
                                 str(r.compute))
    if r.kind is GpuKind.NONE:
        if r.devices or r.portion is not None or r.memory is not None:
            raise InvalidRequest("gpu", "a request without GPUs must not name devices, portion or memory")
        return
    if r.devices < 1:
        raise InvalidRequest("gpu_devices", "must be 1 or more", r.devices)
    if r.portion is not None and r.memory is not None:
        raise InvalidRequest("gpu_portion", "give a GPU portion or a GPU memory amount, not both")
    if r.kind is GpuKind.WHOLE:
        if r.portion is not None or r.memory is not None or r.portion_limit or r.memory_limit:
            raise InvalidRequest("gpu", "whole GPUs take no portion, memory or limit")
        return
    if r.kind is GpuKind.PORTION:
        if r.portion is None:
            raise InvalidRequest("gpu_portion", "is required for a portion request")
        rule = "must be a decimal GPU portion in (0, 1), such as 0.5"
        if not 0 < r.portion < 1:
            raise InvalidRequest("gpu_portion", rule, str(r.portion))
        if r.portion_limit is not None:
            if not 0 < r.portion_limit <= 1:
                raise InvalidRequest("gpu_portion_limit", "must be a GPU portion in (0, 1]", str(r.portion_limit))
            if r.portion_limit < r.portion:
                raise InvalidRequest(
                    "gpu_portion_limit",
                    f"must be at least the request {r.portion}",
                    str(r.portion_limit),
                )
        if r.memory_limit is not None:
            raise InvalidRequest("gpu_memory_limit", "a portion request takes a portion limit")
        return
    if r.memory is None or r.memory <= 0:
        raise InvalidRequest("gpu_memory", "must be greater than 0 bytes", r.memory)
    if r.memory_limit is not None and r.memory_limit < r.memory:
        raise InvalidRequest(
            "gpu_memory_limit",
            f"must be at least the request {format_bytes(r.memory)}",
            format_bytes(r.memory_limit),
        )
    if r.portion_limit is not None:
        raise InvalidRequest("gpu_portion_limit", "a memory request takes a memory limit")


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """Everything one pod (or local process) asks for."""

    gpu: GpuRequest = GpuRequest()
    cpu_milli: int = 0
    memory: int = 0
    """Bytes of host memory."""
    gpus: float | None = None
    """GPUs it counts as for quota and fair share when its GPU is none of the node's devices
    (MIG partitions: each profile's fraction, tessera.core.mig; ``gpu`` is then none); None:
    counted from ``gpu``. Placements made for it carry it (``Placement.gpus``)."""
    mig: str | None = None
    """The MIG profile of its partition (``3g.20gb``, tessera.core.mig), with ``gpus`` its
    fraction: the cycle makes MIG room for it by eviction (``Snapshot.mig``)."""

    def __post_init__(self) -> None:
        if self.gpus is not None and not 0 < self.gpus <= (1 if self.mig is not None else 1024):
            raise InvalidRequest("gpus", "must be in (0, 1] for one MIG partition (its profile's "
                                         "fraction), at most 1024 GPUs in all", self.gpus)
        if self.mig is not None and (self.gpus is None or self.gpu.kind is not GpuKind.NONE):
            raise InvalidRequest("mig", "a MIG profile is the pod's whole GPU request: give its "
                                        "fraction as gpus and no other GPU", self.mig)
        if self.cpu_milli < 0:
            raise InvalidRequest("cpu", "must be 0 or more", self.cpu_milli)
        if self.memory < 0:
            raise InvalidRequest("memory", "must be 0 or more", self.memory)

    def describe(self) -> str:
        return self.gpu.describe()
