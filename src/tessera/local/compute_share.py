"""Compute share in embedded mode: the per-GPU arbiter files and each share's entry.

The runner keeps one arbiter per GPU (``DATA/compute/<uuid>.share``, created at first use),
writes each workload's request, limit and class into it, and points the workload's library at it
(``gpu-compute.conf`` through TESSERA_GPU_COMPUTE_CONFIG). tessera-node does the same on a
Kubernetes node (docs/compute-share.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.core.compute import ComputeShare
from tessera.core.errors import InvalidRequest
from tessera.isolation import arbiter


def arbiter_dir(data_dir: Path) -> Path:
    return data_dir / "compute"


def ensure_arbiter(data_dir: Path, uuid: str) -> Path:
    path = arbiter_dir(data_dir) / f"{uuid}.share"
    if not path.exists():
        arbiter.create(path, mode="fair")
    return path


def env(data_dir: Path, key: str, uuids: list[str], share: dict[str, Any], *, latency: bool = False) -> dict[str, str]:
    """The environment that puts a share's kernels under its GPUs' arbiters (fail closed: a share
    whose arbiter cannot be written does not start)."""
    s = ComputeShare.from_dict(share)
    try:
        paths = [ensure_arbiter(data_dir, u) for u in uuids]
        for p in paths:
            arbiter.set_share(p, arbiter.Share(key, float(s.request), float(s.limit), latency))
        conf = arbiter_dir(data_dir) / "workloads" / f"{key}.conf"
        arbiter.write_config(conf, paths, key)
    except (OSError, arbiter.ArbiterError) as exc:
        raise InvalidRequest("spec.compute.gpuComputeRequest",
                             f"cannot set up this share's compute arbiter, so it does not run: {exc}") from exc
    out = {"TESSERA_GPU_COMPUTE_CONFIG": str(conf)}
    if len(uuids) > 1:
        out["TESSERA_COMPUTE_STATUS"] = "compute share not enforced: multi-GPU"
    return out
