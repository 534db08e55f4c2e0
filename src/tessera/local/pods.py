"""Starting and stopping a workload's pods on this machine: processes (or an image's container
through podman/docker), their environment (the GPU share and the isolation library's settings),
noticing that they ended, stopping them (SIGTERM, SIGKILL after the grace period) and
re-attaching to those that survived a server restart.

Each change to a workload is written to the store before the call returns. Callers hold the
backend's lock; ``active`` is the backend's map of workloads not yet finished.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.api.backend import Conflict, NotFound
from tessera.core.errors import InvalidRequest
from tessera.core.state import Placement
from tessera.local import containers
from tessera.local.gpus import Machine
from tessera.local.isolation_hook import Isolation
from tessera.local.runner import Runner
from tessera.local.store import Store, Workload


class PodProcesses:
    """The processes of every active workload's pods on this machine."""

    def __init__(self, machine: Machine, runner: Runner, isolation: Isolation, store: Store,
                 grace: float, sim_bin: Path, active: dict[str, Workload],
                 wake: threading.Event) -> None:
        self.machine = machine
        self.runner = runner
        self.isolation = isolation
        self.store = store
        self.grace = grace
        self.sim_bin = sim_bin
        self.active = active
        self.wake = wake

    def write_sim_bin(self) -> None:
        self.sim_bin.mkdir(parents=True, exist_ok=True)
        shim = self.sim_bin / "nvidia-smi"
        text = f'#!/bin/sh\nexec "{sys.executable}" -m tessera.local.smi "$@"\n'
        if not shim.exists() or shim.read_text() != text:
            shim.write_text(text)
            shim.chmod(0o755)

    def recover(self) -> None:
        """Re-attach pods that survived a server restart; fail those that did not (under the
        backend's lock, before its loop starts)."""
        for w in self.store.active_workloads():
            self.active[w.id] = w
            if w.phase == "Pending":
                continue
            alive = [
                p for p in w.pods
                if p.get("pid") and p.get("phase") == "Running"
                and self.runner.adopt(p["pid"], p.get("startTicks", 0))
            ]
            here = {g.index: g.uuid for g in self.machine.node.gpus}
            gone = [
                u for p in w.pods if p.get("holds")
                for d, u in zip(p["devices"], p["uuids"], strict=True) if here.get(d) != u
            ]
            if gone:
                for p in alive:
                    self.terminate(p, self.grace)
                self.begin_stop(
                    w, "Failed", f"GPU {gone[0]} is no longer on this machine (the GPUs "
                    "changed while the server was down)", kind="Failed",
                )
                continue
            if w.phase == "Running":
                if len(alive) == len([p for p in w.pods if p.get("phase") == "Running"]):
                    self.store.add_event(
                        w.id, "Reattached",
                        f"server restarted; re-attached to {len(alive)} running pod(s)"
                        f" (pid {', '.join(str(p['pid']) for p in alive)})",
                    )
                    continue
                self.check(w, restarted=True)
            else:
                for p in alive:
                    self.terminate(p, self.grace)

    def terminate(self, pod: dict[str, Any], grace: float) -> None:
        """Stop a pod: SIGTERM to its process group, SIGKILL after ``grace``; a pod that is an
        image's container is also stopped through its runtime (a killed ``docker run`` client
        would leave the container running)."""
        self.runner.terminate(pod["pid"], grace)
        runtime, _, name = str(pod.get("env", {}).get("TESSERA_CONTAINER", "")).partition(":")
        path = shutil.which(runtime) if runtime in containers.RUNTIMES else None
        if path and name:
            with contextlib.suppress(OSError):
                subprocess.Popen(
                    containers.Runtime(runtime, path).stop_argv(name.removeprefix("tessera-"), grace),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True)

    def start(self, w: Workload, placements: Sequence[Placement], message: str) -> None:
        node = self.machine.node
        by_index = {g.index: g for g in node.gpus}
        argv = list(w.spec.get("_argv") or [])
        container = w.spec.get("_container")
        pods: list[dict[str, Any]] = []
        try:
            for i, p in enumerate(placements):
                env = self.env(w, i, p)
                pod_argv, cwd = argv, w.spec.get("workingDir")
                if container:
                    rt = containers.Runtime(container["runtime"], container["path"],
                                            bool(container.get("cdi")))
                    pod_argv = rt.run_argv(f"{w.id}-{i}", container["image"], env,
                                           [by_index[d].uuid for d in p.devices],
                                           containers.isolation_mounts(env),
                                           ports=[tuple(x) for x in w.spec.get("_ports") or []])
                    env["TESSERA_CONTAINER"] = f"{rt.name}:{rt.container_name(f'{w.id}-{i}')}"
                    cwd = None
                host_env = {**os.environ, **env}
                if container:  # the preload is for the container's processes, not the runtime's
                    host_env.pop("LD_PRELOAD", None)
                proc = self.runner.start(f"{w.id}-{i}", pod_argv, host_env, cwd)
                pods.append({
                    "index": i,
                    "phase": "Running",
                    "node": p.node,
                    "devices": list(p.devices),
                    "uuids": [by_index[d].uuid for d in p.devices],
                    "requestBytes": list(p.request_bytes),
                    "limitBytes": list(p.limit_bytes),
                    "exclusive": p.exclusive,
                    "pid": proc.pid,
                    "startTicks": proc.start_ticks,
                    "log": proc.log,
                    "exitFile": proc.exit_file,
                    "env": env,
                    "exitCode": None,
                    "holds": True,
                })
        except (OSError, InvalidRequest) as exc:
            for pod in pods:
                self.terminate(pod, 0)
            w.phase, w.phase_message, w.completed = "Failed", f"could not start: {exc}", time.time()
            self.active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
            return
        w.pods = pods
        w.phase = "Running"
        w.phase_message = message
        w.started = time.time()
        w.exit_code = None
        w.node = ",".join(sorted({p.node for p in placements}))
        w.devices = ",".join(str(d) for p in placements for d in p.devices)
        w.gpus_allocated = sum(self.gpus_of(pod) for pod in pods)
        pids = ", ".join(str(p["pid"]) for p in pods)
        self.store.save(w, ("Started", f"{message}; pid {pids}"))

    def gpus_of(self, pod: dict[str, Any]) -> float:
        if pod["exclusive"]:
            return float(len(pod["devices"]))
        mem = {g.index: g.schedulable for g in self.machine.node.gpus}
        return float(
            sum(b / mem[d] for d, b in zip(pod["devices"], pod["requestBytes"], strict=True))
        )

    def env(self, w: Workload, index: int, p: Placement) -> dict[str, str]:
        by_index = {g.index: g for g in self.machine.node.gpus}
        gpus = [by_index[d] for d in p.devices]
        env = {str(k): str(v) for k, v in (w.spec.get("_env") or {}).items()}
        uuids = ",".join(g.uuid for g in gpus)
        env.update({
            "TESSERA_WORKLOAD_NAME": w.name,
            "TESSERA_WORKLOAD_ID": w.id,
            "TESSERA_PROJECT": w.project_name,
            "TESSERA_POD_INDEX": str(index),
            "TESSERA_WORKERS": str(w.workers),
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
        ports = w.spec.get("_ports") or []
        if ports:
            env["PORT"] = str(ports[0][0])
            env["TESSERA_SERVICE_PORTS"] = ",".join(str(c) for c, _ in ports)
            env["TESSERA_SERVICE_URLS"] = ",".join(w.spec.get("_serviceUrls") or [])
        if self.machine.simulated:
            env["TESSERA_SIMULATED"] = "1"
            env["PATH"] = f"{self.sim_bin}{os.pathsep}{os.environ.get('PATH', '')}"
        env["TESSERA_ISOLATION"] = "off"
        if gpus and not p.exclusive:
            env.update(
                self.isolation.env(f"{w.id}-{index}", [g.uuid for g in gpus], p,
                                   {**os.environ, **env}, priority=w.priority)
            )
        return env

    def check(self, w: Workload, restarted: bool = False) -> None:
        changed = False
        failed: tuple[int | None, str] | None = None
        for pod in w.pods:
            if pod.get("phase") != "Running":
                continue
            ended = self.runner.check(pod["pid"], pod.get("startTicks", 0), pod["exitFile"])
            if ended is None:
                continue
            changed = True
            pod["exitCode"] = ended.code
            pod["holds"] = False
            if ended.code == 0:
                pod["phase"] = "Completed"
            else:
                pod["phase"] = "Failed"
                reason = ended.reason
                if ended.code is None and restarted:
                    reason = "the process was gone when the server restarted and left no exit code"
                if failed is None:
                    failed = (ended.code, f"pod {pod['index']}: {reason}")
        if not changed:
            return
        now = time.time()
        if failed is not None:
            for pod in w.pods:
                if pod.get("phase") == "Running":
                    self.terminate(pod, self.grace)
                    pod["phase"] = "Failed"
                    pod["holds"] = False
            w.phase, w.exit_code, w.completed = "Failed", failed[0], now
            w.phase_message = failed[1]
            w.gpus_allocated = 0.0
            self.active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
            self.wake.set()
        elif all(p.get("phase") == "Completed" for p in w.pods):
            w.phase, w.exit_code, w.completed = "Completed", 0, now
            w.phase_message = "all pods exited with code 0"
            w.gpus_allocated = 0.0
            self.active.pop(w.id, None)
            self.store.save(w, ("Completed", w.phase_message))
            self.wake.set()
        else:
            w.gpus_allocated = sum(self.gpus_of(p) for p in w.pods if p.get("holds"))
            self.store.save(w)

    def begin_stop(self, w: Workload, target: str, reason: str, kind: str = "Stopping") -> None:
        """Send SIGTERM to every pod; ``finish_stop`` completes once their groups are gone."""
        w.spec["_after_stop"] = target
        if target == "Deleted":
            w.phase = "Deleting"
        else:
            w.phase = "Stopping"
        w.phase_message = reason
        for pod in w.pods:
            if pod.get("phase") == "Running":
                self.terminate(pod, self.grace)
        self.store.save(w, (kind, reason))
        self.finish_stop(w)
        self.wake.set()

    def finish_stop(self, w: Workload) -> None:
        for pod in w.pods:
            if pod.get("phase") != "Running":
                continue
            ended = self.runner.check(pod["pid"], pod.get("startTicks", 0), pod["exitFile"])
            if ended is not None or not self.runner.group_alive(pod["pid"]):
                pod["phase"] = "Stopped"
                pod["holds"] = False
                pod["exitCode"] = None if ended is None else ended.code
        if any(p.get("phase") == "Running" for p in w.pods):
            return
        target = w.spec.pop("_after_stop", "Stopped")
        if target == "Deleted":
            self.active.pop(w.id, None)
            self.store.delete_workload(w.id)
            self.wake.set()
            return
        w.gpus_allocated = 0.0
        w.node = ""
        w.devices = ""
        if target == "Pending":
            w.phase = "Pending"
            w.pods = []
            self.store.save(w, ("Requeued", f"requeued after: {w.phase_message}"))
        elif target == "Failed":
            w.phase = "Failed"
            w.completed = time.time()
            self.active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
        else:
            w.phase = "Stopped"
            w.completed = time.time()
            self.active.pop(w.id, None)
            self.store.save(w, ("Stopped", "all pods stopped"))
        self.wake.set()

    def log(self, w: Workload, pod: int, offset: int) -> tuple[bytes, int]:
        """Up to 4 MiB of a pod's log from ``offset``, and the offset after it."""
        path, _ = self.runner.paths(f"{w.id}-{pod}")
        try:
            with open(path, "rb") as f:
                f.seek(max(offset, 0))
                data = f.read(4 * 2**20)
        except FileNotFoundError:
            if pod >= w.workers or pod < 0:
                raise NotFound(f"workload {w.name} has no pod {pod}") from None
            return b"", offset
        return data, max(offset, 0) + len(data)

    def exec(self, w: Workload, pod: int, command: list[str], timeout: float) -> dict[str, Any]:
        """COMMAND with the pod's environment (in its container, for an image)."""
        if w.phase != "Running":
            raise Conflict(f"workload {w.name} is {w.phase}; exec needs it Running")
        match = [p for p in w.pods if p["index"] == pod]
        if not match:
            raise NotFound(f"workload {w.name} has no pod {pod}")
        pod_env = match[0].get("env", {})
        if pod_env.get("TESSERA_CONTAINER"):
            rt_name, _, cname = pod_env["TESSERA_CONTAINER"].partition(":")
            container = w.spec.get("_container") or {}
            command = [str(container.get("path") or rt_name), "exec", "-i", cname, *command]
        try:
            done = subprocess.run(command, env={**os.environ, **pod_env},
                                  capture_output=True, timeout=timeout,
                                  cwd=w.spec.get("workingDir") or None)
        except FileNotFoundError:
            raise InvalidRequest("command", "not found", command[0]) from None
        except subprocess.TimeoutExpired:
            raise Conflict(f"the command did not finish within {timeout:g} s") from None
        return {"exitCode": done.returncode, "stdout": done.stdout.decode(errors="replace"),
                "stderr": done.stderr.decode(errors="replace")}
