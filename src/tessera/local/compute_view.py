"""A workload's compute share as describe and the API show it: what it asked for, what the
arbiter charged it over 1 s and 10 s, and whether it is enforced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.local.compute_metrics import read


def compute_view(directory: Path, workload_id: str, share: dict[str, Any]) -> dict[str, Any]:
    used = [(gpu, u) for (gpu, key), u in read(directory).items() if key == workload_id]
    out: dict[str, Any] = {
        "gpuComputeRequest": share["gpuComputeRequest"], "gpuComputeLimit": share["gpuComputeLimit"],
        "gpuComputeMode": share["gpuComputeMode"],
        "gpus": [{"gpu": gpu, "gpuTime1s": round(u.share_1s, 3), "gpuTime10s": round(u.share_10s, 3),
                  "gpuSecondsTotal": round(u.total_seconds, 3), "enforced": not u.multi_gpu} for gpu, u in used],
    }
    text = (f"request {share['gpuComputeRequest']}, limit {share['gpuComputeLimit']} "
            f"({share['gpuComputeMode']})")
    if used:
        text += "; GPU time " + ", ".join(f"{g['gpuTime1s']:.2f} (1 s) {g['gpuTime10s']:.2f} (10 s)"
                                          for g in out["gpus"])
    if len(used) > 1:
        text += "; compute share not enforced: multi-GPU"
    out["text"] = text
    return out


def annotate_gpus(gpus: list[dict[str, Any]], directory: Path, names: dict[str, tuple[str, str]]) -> None:
    """Adds to each GPU's holders the share of its time the arbiter charged them (1 s, 10 s),
    for `tessera top`. names: workload id -> (project, name)."""
    by_name = {(gpu, names[key]): u for (gpu, key), u in read(directory).items() if key in names}
    for g in gpus:
        for h in g["workloads"]:
            u = by_name.get((g["uuid"], (h["project"], h["name"])))
            if u is not None:
                h["gpuTime1s"], h["gpuTime10s"] = round(u.share_1s, 3), round(u.share_10s, 3)
                h["computeRequest"], h["computeLimit"] = round(u.request, 6), round(u.limit, 6)
