"""The one text for what a workload asked for, shown everywhere a user reads it.

The API's ``gpus.request``, ``tessera list``/``describe``, the submit line, the Submitted event and
the console all print :func:`request_text`, so a dynamic fraction reads "0.25 GPU, bursting to
0.8" in every one of them, a 3-worker job "3 × 0.1 GPU", memory as it was typed next to its
binary size ("5G (4.66 GiB)"), and a MIG partition "MIG 3g.20gb". Where a partition sits is
:func:`mig_placement_text` ("MIG 3g.20gb on GPU 0, slot 0"). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera.core.model import GpuRequest
from tessera.core.units import format_bytes

__all__ = ["devices_text", "mig_placement_text", "request_text"]


def request_text(gpu: GpuRequest, workers: int = 1, mig: str | None = None) -> str:
    """What a workload of ``workers`` pods, each asking ``gpu`` (or the MIG profile ``mig``),
    asked for, in words."""
    one = f"MIG {mig}" if mig else gpu.describe()
    return f"{workers} × {one}" if workers > 1 else one


def mig_placement_text(device: Mapping[str, Any] | None) -> str:
    """A MIG partition's place, from a pod's ``migDevice`` (``profile``, ``gpuIndex``,
    ``start``): "MIG 3g.20gb on GPU 0, slot 0"; "" when there is none."""
    if not device:
        return ""
    text = f"MIG {device.get('profile') or '?'}"
    gpu = device.get("gpuIndex")
    if gpu is not None:  # an index (embedded mode), or a GPU's UUID (Kubernetes' annotation)
        text += f" on GPU {gpu}" if str(gpu).isdigit() else f" on {gpu}"
        if device.get("start") is not None:
            text += f", slot {device['start']}"
    return text


def devices_text(devices: Sequence[Mapping[str, Any]], exclusive: bool) -> str:
    """A pod's shares in words, from its ``gpuDevices`` (``index``, ``requestBytes``,
    ``limitBytes``): "GPU 0 7.8 GiB (limit 12.5 GiB), GPU 1 7.8 GiB", "GPU 2 whole"; "" when
    it holds none."""
    parts = []
    for d in devices:
        if exclusive:
            parts.append(f"GPU {d['index']} whole")
            continue
        text = f"GPU {d['index']} {format_bytes(d['requestBytes'])}"
        if d.get("limitBytes") not in (None, d["requestBytes"]):
            text += f" (limit {format_bytes(d['limitBytes'])})"
        parts.append(text)
    return ", ".join(parts)
