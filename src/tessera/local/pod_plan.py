"""One embedded pod, planned and launched: its stored record (devices, environment, command)
and the process started for it. ``tessera.local.pods`` starts a workload's pods with these (a
whole start attempt); ``tessera.local.elastic`` starts one more pod of a running elastic
workload with the same two steps, so a grown pod gets exactly what a first one gets (its GPU
share, the isolation library's limit, the same command)."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.core.state import Placement
from tessera.core.text import check_argv, check_env
from tessera.local import containers
from tessera.local.gpus import Machine
from tessera.local.isolation_hook import Isolation
from tessera.local.pod_env import pod_env
from tessera.local.records import PodPhase, PodRecord
from tessera.local.runner import Runner
from tessera.local.store import Workload

START_KEY = "TESSERA_START_KEY"
"""In every pod process's environment: WORKLOAD/ATTEMPT/POD, how a restarted server finds the
processes of a start it was killed in."""


def plan_pod(machine: Machine, isolation: Isolation, sim_bin: Path, runner: Runner, w: Workload,
             i: int, p: Placement, attempt: str) -> PodRecord:
    """The record of pod ``i`` of ``w`` at ``p`` (phase Starting, no pid yet), with what
    launching needs (``argv``, ``hostEnv``, ``cwd``; dropped once it runs)."""
    by_index = {g.index: g for g in machine.node.gpus}
    container = w.control.container
    mig = w.control.mig_device
    env = pod_env(w, i, p, machine, isolation, sim_bin)
    env[START_KEY] = f"{w.id}/{attempt}/{i}"
    pod_argv, cwd = list(w.control.argv), w.spec.get("workingDir")
    if container:
        rt = containers.Runtime(container["runtime"], container["path"], bool(container.get("cdi")))
        # A MIG workload's container gets its partition (the MIG-... UUID, by CDI name or
        # through the NVIDIA hook's NVIDIA_VISIBLE_DEVICES), never the whole GPU.
        pod_argv = rt.run_argv(f"{w.id}-{i}", container["image"], env,
                               [mig["uuid"]] if mig else [by_index[d].uuid for d in p.devices],
                               containers.isolation_mounts(env), ports=list(w.control.ports))
        env["TESSERA_CONTAINER"] = f"{rt.name}:{rt.container_name(f'{w.id}-{i}')}"
        cwd = None
    host_env = {**os.environ, **env}
    if container:  # the preload is for the container's processes, not the runtime's
        host_env.pop("LD_PRELOAD", None)
    check_argv(list(pod_argv), "spec.command")
    check_env(env, "spec.environmentVariables")
    log, exit_file = runner.paths(f"{w.id}-{i}")
    record: PodRecord = {
        "index": i,
        "phase": PodPhase.STARTING,
        "node": p.node,
        "devices": list(p.devices),
        "uuids": [by_index[d].uuid for d in p.devices],
        "requestBytes": list(p.request_bytes),
        "limitBytes": list(p.limit_bytes),
        "exclusive": p.exclusive, **({"compute": p.compute} if p.compute else {}),
        "pid": None,
        "startTicks": 0,
        "log": str(log),
        "exitFile": str(exit_file),
        "env": env,
        "exitCode": None,
        "holds": True,
        "argv": pod_argv,
        "hostEnv": host_env,
        "cwd": cwd,
    }
    if mig:
        record["mig"] = dict(mig)
    return record


def launch(runner: Runner, w: Workload, pod: PodRecord) -> None:
    """Start the planned pod's process; the record gets its pid and phase Running."""
    proc = runner.start(f"{w.id}-{pod['index']}", pod.pop("argv"), pod.pop("hostEnv"),
                        pod.pop("cwd"))
    pod.update({"pid": proc.pid, "startTicks": proc.start_ticks, "log": proc.log,
                "exitFile": proc.exit_file, "phase": PodPhase.RUNNING})
