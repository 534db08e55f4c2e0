"""What NVML says about this machine's GPUs: the inventory (once) and usage (every scrape).

Loaded through nvidia-ml-py exactly as on a GPU node: ``libnvidia-ml.so.1`` from the dynamic
linker's search path. Tests put the fake driver of ``native/fakedriver`` on ``LD_LIBRARY_PATH``;
no code path here is replaced by a Python fake.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

from tessera.core.units import GiB

TOPOLOGY_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node",
                   50: "system"}
"""nvmlGpuTopologyLevel_t -> name (NVML_TOPOLOGY_*): the closest common PCIe ancestor."""
_NVLINK_P2P_INDEX = 2  # NVML_P2P_CAPS_INDEX_NVLINK
_P2P_OK = 0


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised, or finds no GPU; the message is one line."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    """The product name as NVML reports it (``NVIDIA H100 80GB HBM3``)."""
    model: str
    """Short model, family and memory (``H100-80GB``)."""
    memory_total: int
    minor: int | None
    mig_enabled: bool
    compute_capability: tuple[int, int] | None


@dataclass(frozen=True)
class Link:
    """Topology between two devices (a < b)."""

    a: int
    b: int
    ancestor: str
    """The closest common ancestor: single (one PCIe switch), multiple, hostbridge, node (same
    NUMA node), system (across CPU sockets), internal."""
    nvlink: bool


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_version: str
    """The CUDA version the driver supports, ``12.8``."""
    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...] = ()

    def by_uuid(self) -> dict[str, Gpu]:
        return {g.uuid: g for g in self.gpus}


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    used_bytes: int
    sm_util: int | None = None


@dataclass(frozen=True)
class GpuUsage:
    uuid: str
    index: int
    memory_total: int
    memory_used: int
    utilization: int | None
    processes: tuple[ProcessUsage, ...] = field(default_factory=tuple)


def short_model(product: str, memory: int) -> str:
    """``Tesla V100-SXM2-16GB`` to ``V100-16GB``: the family and its memory."""
    words = re.findall(r"[A-Z]+\d+[A-Za-z]*", product.replace("NVIDIA", "").replace("Tesla", ""))
    family = words[0] if words else re.sub(r"\W+", "", product) or "GPU"
    return f"{family}-{round(memory / GiB)}GB"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """One NVML session (``nvmlInit`` .. ``nvmlShutdown``); not thread-safe, use from one thread."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: list[Any] = []
        self._last_sample: dict[int, int] = {}

    def open(self) -> Nvml:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a dependency of tessera
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not be initialised: {exc} "
                                  "(no NVIDIA driver or libnvidia-ml.so.1 on this machine)") from exc
        self._nv = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML could not list GPUs: {exc}") from exc
        if not self._handles:
            self.close()
            raise NvmlUnavailable("NVML found no GPU on this machine")
        return self

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
        self._nv = None
        self._handles = []

    def __enter__(self) -> Nvml:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def lib(self) -> Any:
        """The open pynvml module (for tessera.node.mig's calls)."""
        if self._nv is None:
            raise NvmlUnavailable("NVML is not open")
        return self._nv

    def handle(self, index: int) -> Any:
        """The device handle of GPU ``index``."""
        return self._handles[index]

    def _optional(self, fn: Any, *args: Any) -> Any:
        """A call an older driver or GPU may not support: None instead of an error."""
        try:
            return fn(*args)
        except (self._nv.NVMLError, AttributeError):
            return None

    def mig_modes(self) -> tuple[bool, ...]:
        """Each GPU's current MIG mode (False where the product has none): cheap enough to ask
        every sync, so an operator's switch (``nvidia-smi -mig 1`` and a reset) is seen."""
        if self._nv is None:
            raise NvmlUnavailable("NVML is not open")
        modes = (self._optional(self._nv.nvmlDeviceGetMigMode, h) for h in self._handles)
        return tuple(bool(m and m[0]) for m in modes)

    def inventory(self) -> Inventory:
        nv = self._nv
        if nv is None:
            raise NvmlUnavailable("NVML is not open")
        driver = _text(nv.nvmlSystemGetDriverVersion())
        cuda = self._optional(nv.nvmlSystemGetCudaDriverVersion)
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else ""
        gpus: list[Gpu] = []
        for i, h in enumerate(self._handles):
            name = _text(nv.nvmlDeviceGetName(h))
            total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            mig = self._optional(nv.nvmlDeviceGetMigMode, h)
            cc = self._optional(nv.nvmlDeviceGetCudaComputeCapability, h)
            gpus.append(Gpu(
                index=i, uuid=_text(nv.nvmlDeviceGetUUID(h)), name=name,
                model=short_model(name, total), memory_total=total,
                minor=self._optional(nv.nvmlDeviceGetMinorNumber, h),
                mig_enabled=bool(mig and mig[0]),
                compute_capability=(int(cc[0]), int(cc[1])) if cc else None))
        links: list[Link] = []
        for a in range(len(self._handles)):
            for b in range(a + 1, len(self._handles)):
                ha, hb = self._handles[a], self._handles[b]
                level = self._optional(nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
                p2p = self._optional(nv.nvmlDeviceGetP2PStatus, ha, hb, _NVLINK_P2P_INDEX)
                links.append(Link(a=a, b=b, ancestor=TOPOLOGY_LEVELS.get(level, "unknown")
                                  if level is not None else "unknown",
                                  nvlink=p2p == _P2P_OK))
        return Inventory(driver_version=driver, cuda_version=cuda_version, gpus=tuple(gpus),
                         links=tuple(links))

    def usage(self) -> list[GpuUsage]:
        """Memory, utilisation and compute processes of every GPU, now."""
        nv = self._nv
        if nv is None:
            raise NvmlUnavailable("NVML is not open")
        out: list[GpuUsage] = []
        for i, h in enumerate(self._handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            util = self._optional(nv.nvmlDeviceGetUtilizationRates, h)
            procs = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            sm: dict[int, int] = {}
            try:
                for s in nv.nvmlDeviceGetProcessUtilization(h, self._last_sample.get(i, 0)):
                    sm[int(s.pid)] = int(s.smUtil)
                    self._last_sample[i] = max(self._last_sample.get(i, 0), int(s.timeStamp))
            except nv.NVMLError:
                pass  # NOT_FOUND: no sample since the last call
            out.append(GpuUsage(
                uuid=_text(nv.nvmlDeviceGetUUID(h)), index=i, memory_total=int(mem.total),
                memory_used=int(mem.used), utilization=int(util.gpu) if util is not None else None,
                processes=tuple(ProcessUsage(pid=int(p.pid), used_bytes=int(p.usedGpuMemory or 0),
                                             sm_util=sm.get(int(p.pid))) for p in procs)))
        return out


def read_inventory() -> Inventory:
    """Opens NVML, reads the inventory, closes it; raises NvmlUnavailable (one line)."""
    with Nvml() as nvml:
        return nvml.inventory()
