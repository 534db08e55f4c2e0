"""An embedded pod's environment (tessera.local.pods starts the process with it)."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.core.state import Placement
from tessera.local import distributed
from tessera.local.gpus import Machine
from tessera.local.isolation_hook import Isolation
from tessera.local.spelling_env import cgpu_env
from tessera.local.store import Workload


def pod_env(w: Workload, index: int, p: Placement, machine: Machine, isolation: Isolation,
            sim_bin: Path) -> dict[str, str]:
    """The environment of pod ``index`` of ``w`` placed at ``p``: who it is, its GPUs (or MIG
    device), the isolation library's settings, torchrun's variables for a distributed workload,
    its service ports, its compute share. An elastic workload's pods get torchrun's elastic
    settings instead of fixed ranks (tessera.local.distributed.elastic_env)."""
    by_index = {g.index: g for g in machine.node.gpus}
    gpus = [by_index[d] for d in p.devices]
    env = {str(k): str(v) for k, v in w.control.env.items()}
    uuids = ",".join(g.uuid for g in gpus)
    env.update({
        "TESSERA_WORKLOAD_NAME": w.name,
        "TESSERA_WORKLOAD_ID": w.id,
        "TESSERA_PROJECT": w.project_name,
        "TESSERA_POD_INDEX": str(index),
        "TESSERA_WORKERS": str(w.workers),
        **(distributed.elastic_env(w.id, index, w.min_workers, w.workers, w.control.master_port, env)
           if w.min_workers < w.workers else  # elastic: torchrun's settings, it sets the ranks
           distributed.torchrun_env(w.id, index, w.workers, w.control.master_port, env.get("TESSERA_FRAMEWORK"))),
        "CUDA_VISIBLE_DEVICES": uuids if gpus else "",
        "NVIDIA_VISIBLE_DEVICES": uuids if gpus else "none",
    })
    if gpus:
        env.update({
            "TESSERA_SHARE_UUIDS": uuids,
            "TESSERA_SHARE_PRODUCTS": ",".join(g.product or g.model for g in gpus),
            "TESSERA_SHARE_DEVICE_BYTES": ",".join(str(g.memory) for g in gpus),
            "TESSERA_SHARE_HEADROOM_BYTES": ",".join(str(g.headroom) for g in gpus),
            "TESSERA_SHARE_REQUEST_BYTES": ",".join(str(b) for b in p.request_bytes),
            "TESSERA_SHARE_LIMIT_BYTES": ",".join(str(b) for b in p.limit_bytes),
            "TESSERA_SHARE_EXCLUSIVE": "1" if p.exclusive else "0",
        })
        if not p.exclusive:  # cGPU's variables, as on Kubernetes (tessera.local.spelling_env)
            env.update(cgpu_env([g.memory for g in gpus], p.request_bytes))
    mig = w.control.mig_device
    if mig:  # a MIG partition (tessera.local.mig): the process sees only that MIG device
        env.update({"CUDA_VISIBLE_DEVICES": mig["uuid"], "NVIDIA_VISIBLE_DEVICES": mig["uuid"],
                    "TESSERA_MIG_PROFILE": mig["profile"], "TESSERA_MIG_GPU": mig["gpu"]})
    ports = w.control.ports
    if ports:
        env["PORT"] = str(ports[0][0])
        env["TESSERA_SERVICE_PORTS"] = ",".join(str(c) for c, _ in ports)
        env["TESSERA_SERVICE_URLS"] = ",".join(w.control.service_urls)
    if machine.simulated:
        env["TESSERA_SIMULATED"] = "1"
        env["PATH"] = f"{sim_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    env["TESSERA_ISOLATION"] = "off"
    if gpus and not p.exclusive:
        env.update(
            isolation.env(f"{w.id}-{index}", [g.uuid for g in gpus], p,
                               {**os.environ, **env}, priority=w.priority)
        )
        iso_dir = getattr(isolation, "dir", None)
        if w.control.compute and env.get("TESSERA_ISOLATION") == "on" and iso_dir is not None:
            from tessera.local import compute_share

            env.update(compute_share.env(iso_dir.parent, w.id, [g.uuid for g in gpus], w.control.compute,
                                         latency=w.type == "Inference"))
    return env
