"""Headroom: the GPU memory the driver and a CUDA context keep, which no workload can be given.

Measured where the agent can create a CUDA context on the device: a child process loads the
driver (``libcuda.so.1``, the same one the workloads load), creates the primary context and
reports what it holds — NVML's memory for the child's PID when the driver lists it, else the
change in used memory. One measurement per GPU model (contexts cost the same on equal devices).
Where that fails (no ``libcuda``, a GPU in exclusive-process mode already taken, a timeout),
the per-model default of :func:`tessera.core.gpu_models.default_headroom` stands; never 0.

The same figure is written as ``context-overhead`` into each share's isolation config, so the
library charges every context a workload creates against its limit, and the scheduler's
capacity per device is its memory less this headroom.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
from dataclasses import dataclass

from tessera.core.gpu_models import default_headroom
from tessera.node.nvml import Inventory, Nvml

_CHILD = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
free, total = ctypes.c_size_t(), ctypes.c_size_t()
def ok(rc, what):
    if rc != 0:
        print(json.dumps({"error": f"{what} returned CUDA error {rc}"}), flush=True)
        sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ok(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
print(json.dumps({"free": free.value, "total": total.value}), flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class DeviceHeadroom:
    uuid: str
    bytes: int
    source: str
    """``measured`` (a context created here), ``configured`` (--headroom) or ``default``."""


def measure_context_bytes(nvml: Nvml, index: int, uuid: str, timeout: float = 30.0) -> int | None:
    """Bytes one CUDA context holds on GPU ``index``, or None where it cannot be measured."""
    before = _used(nvml, index)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TESSERA_GPU_CONFIG")}
    env.update(CUDA_VISIBLE_DEVICES=uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    try:
        child = subprocess.Popen([sys.executable, "-c", _CHILD], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        assert child.stdout is not None and child.stdin is not None
        line = _read_line(child, timeout)
        if not line:
            return None
        report = json.loads(line)
        if "error" in report:
            return None
        own = _process_bytes(nvml, index, child.pid)
        if own:
            return own
        if before is None:
            return None
        delta = int(report["total"]) - int(report["free"]) - before
        return delta if delta > 0 else None
    except (ValueError, KeyError, TypeError):
        return None
    finally:
        with contextlib.suppress(OSError):
            if child.stdin:
                child.stdin.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def headroom_for(inventory: Inventory, nvml: Nvml | None, configured: int | None = None,
                 measure: bool = True) -> dict[int, DeviceHeadroom]:
    """Headroom per GPU index: ``configured`` bytes where given, else measured once per model,
    else the model's default."""
    out: dict[int, DeviceHeadroom] = {}
    by_model: dict[str, int | None] = {}
    for g in inventory.gpus:
        if configured is not None:
            out[g.index] = DeviceHeadroom(g.uuid, configured, "configured")
            continue
        if g.model not in by_model:
            by_model[g.model] = (measure_context_bytes(nvml, g.index, g.uuid)
                                 if measure and nvml is not None and not g.mig_enabled else None)
        measured = by_model[g.model]
        if measured and measured < g.memory_total:
            out[g.index] = DeviceHeadroom(g.uuid, measured, "measured")
        else:
            out[g.index] = DeviceHeadroom(g.uuid, default_headroom(g.model, g.memory_total),
                                          "default")
    return out


def _used(nvml: Nvml, index: int) -> int | None:
    try:
        return next(u.memory_used for u in nvml.usage() if u.index == index)
    except Exception:  # NVML errors vary by driver
        return None


def _process_bytes(nvml: Nvml, index: int, pid: int) -> int | None:
    try:
        for u in nvml.usage():
            if u.index == index:
                return next((p.used_bytes for p in u.processes if p.pid == pid), None) or None
    except Exception:  # NVML errors vary by driver
        return None
    return None


def _read_line(child: subprocess.Popen[str], timeout: float) -> str:
    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return child.stdout.readline()
