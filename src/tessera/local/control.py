"""The local control plane: store, runner and scheduler joined by one loop.

Each cycle (every ``interval`` seconds, or at once when something is submitted or changed) it
learns which pods ended, turns the store's workloads into the core's ``Snapshot``
(``tessera.local.scheduling``), runs the core's cycle and applies its ``Plan``: start pods, stop
evicted ones, record why the rest wait. Every change is written to the
store before the API answers, so the loop can be killed at any moment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.api.auth import TokenAuth
from tessera.api.backend import Conflict, NotFound, ProjectFields, WorkloadSubmission
from tessera.api.models import compute_doc
from tessera.api.token_store import TokenStore
from tessera.api.validation import check_limit, check_project, check_submission
from tessera.core.cycle import Plan
from tessera.core.cycle import Workload as CoreWorkload
from tessera.core.errors import InvalidRequest
from tessera.core.requests import (
    check_against_cluster,
    gpu_request_from_dict,
    gpu_request_to_dict,
)
from tessera.core.state import Placement
from tessera.local import containers, isolation_hook
from tessera.local.containers import Runtime
from tessera.local.gpus import Machine
from tessera.local.runner import Runner
from tessera.local.scheduling import LocalCycle, core_workload, pod_placement, refused
from tessera.local.store import Project, Store, Workload


class LocalBackend(TokenAuth):
    """Implements ``tessera.api.backend.Backend`` on this machine."""

    def __init__(
        self,
        data_dir: Path,
        machine: Machine,
        policy: str = "fgd",
        grace: float = 10.0,
        interval: float = 0.25,
        runtime: Runtime | None = None,
        runtime_note: str = "no container runtime was looked for",
    ) -> None:
        self.data_dir = data_dir
        self.runtime = runtime
        """podman or docker, for images with no command (tessera.local.containers)."""
        self.runtime_note = runtime_note
        self.machine = machine
        self.scheduler = LocalCycle(policy)
        self.grace = grace
        self.interval = interval
        self.store = Store(data_dir / "tessera.db")
        self.auth_store: TokenStore = TokenStore(data_dir / "tessera.db")
        self.runner = Runner(data_dir)
        self.isolation = isolation_hook.load(data_dir)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active: dict[str, Workload] = {}
        self._awaiting: dict[str, tuple[str, ...]] = {}
        """Pending workloads held back until the workloads evicted for them have stopped."""
        self._sim_bin = data_dir / "sim-bin"
        self.cycles = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.machine.simulated:
            self._write_sim_bin()
        self._recover()
        self._thread = threading.Thread(target=self._loop, name="tessera-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()
        self.auth_store.close()

    def stop_all_workloads(self) -> int:
        """Stop every running pod (``tessera down --stop-workloads``); they become Stopped."""
        with self._lock:
            count = 0
            for w in list(self._active.values()):
                if w.phase in ("Running", "Pending"):
                    self._begin_stop(w, "Stopped", "stopped by tessera down")
                    count += 1
        deadline = time.monotonic() + self.grace + 2
        while time.monotonic() < deadline:
            self.cycle()
            with self._lock:
                if not any(w.phase in ("Stopping", "Deleting") for w in self._active.values()):
                    break
            time.sleep(0.05)
        return count

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.cycle()
            except Exception as exc:
                print(f"tessera: control cycle failed: {exc!r}", file=sys.stderr, flush=True)

    def _write_sim_bin(self) -> None:
        self._sim_bin.mkdir(parents=True, exist_ok=True)
        shim = self._sim_bin / "nvidia-smi"
        text = f'#!/bin/sh\nexec "{sys.executable}" -m tessera.local.smi "$@"\n'
        if not shim.exists() or shim.read_text() != text:
            shim.write_text(text)
            shim.chmod(0o755)

    def _recover(self) -> None:
        """Re-attach pods that survived a server restart; fail those that did not."""
        with self._lock:
            for w in self.store.active_workloads():
                self._active[w.id] = w
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
                        self._terminate(p, self.grace)
                    self._begin_stop(
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
                    self._check_pods(w, restarted=True)
                else:
                    for p in alive:
                        self._terminate(p, self.grace)

    # -- the cycle -------------------------------------------------------------------------------

    def cycle(self) -> Plan:
        with self._lock:
            self.cycles += 1
            self.runner.reap_kills()
            for w in list(self._active.values()):
                if w.phase == "Running":
                    self._check_pods(w)
                elif w.phase in ("Stopping", "Deleting"):
                    self._finish_stop(w)
            now = time.time()
            workloads = self._workloads(now)
            pending = [w for w in workloads if not w.placements]
            plan = refused((), "")
            if pending:
                try:
                    plan = self.scheduler.run((self.machine.node,), self.store.projects(),
                                              workloads, now)
                except InvalidRequest as exc:
                    plan = refused(pending, f"the scheduling cycle refused this machine's state: {exc}")
            self._apply(plan, {w.id for w in pending})
            return plan

    def _workloads(self, now: float) -> list[CoreWorkload]:
        """The active workloads as the cycle sees them: pending ones (except those waiting for
        their victims to stop) and those holding GPUs of this machine."""
        out: list[CoreWorkload] = []
        here = {g.index: g.uuid for g in self.machine.node.gpus}
        for wid, victims in list(self._awaiting.items()):
            if not any(v in self._active and self._active[v].phase != "Pending" for v in victims):
                del self._awaiting[wid]
        for w in self._active.values():
            if w.phase == "Pending":
                if w.id not in self._awaiting:
                    out.append(core_workload(w, None, now))
            elif w.phase in ("Running", "Stopping", "Deleting"):
                placements = [
                    pod_placement(p) for p in w.pods
                    if p.get("holds", True)
                    and all(here.get(d) == u for d, u in zip(p["devices"], p["uuids"], strict=True))
                ]
                if placements:
                    out.append(core_workload(w, placements, now))
        return out

    def _apply(self, plan: Plan, pending: set[str]) -> None:
        for ev in plan.evictions:
            w = self._active.get(ev.workload_id)
            if w is not None and w.phase == "Running":
                if w.spec.get("onEviction") == "fail":
                    self._begin_stop(
                        w, "Failed", f"evicted (onEviction: fail): {ev.reason}", kind="Preempted"
                    )
                else:
                    self._begin_stop(w, "Pending", ev.reason, kind="Preempted")
        waiting = {x.workload_id: x.reason for x in plan.waiting if x.workload_id in pending}
        for b in plan.bindings:
            w = self._active.get(b.workload_id)
            if b.workload_id not in pending or w is None or w.phase != "Pending":
                continue
            if b.after_evictions:
                victims = ", ".join(self._active[v].name if v in self._active else v
                                    for v in b.after_evictions)
                waiting[b.workload_id] = f"waiting for {victims} to stop: {b.message}"
                self._awaiting[b.workload_id] = tuple(b.after_evictions)
                continue
            placements = [pb.placement for pb in sorted(b.pods, key=lambda pb: pb.pod)]
            self._start(w, placements, b.message)
        for wid, reason in waiting.items():
            w = self._active.get(wid)
            if w is not None and w.phase == "Pending" and w.phase_message != reason:
                w.phase_message = reason
                self.store.save(w, ("Waiting", reason))

    def _terminate(self, pod: dict[str, Any], grace: float) -> None:
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

    def _start(self, w: Workload, placements: Sequence[Placement], message: str) -> None:
        node = self.machine.node
        by_index = {g.index: g for g in node.gpus}
        argv = list(w.spec.get("_argv") or [])
        container = w.spec.get("_container")
        pods: list[dict[str, Any]] = []
        try:
            for i, p in enumerate(placements):
                env = self._pod_env(w, i, p)
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
                self._terminate(pod, 0)
            w.phase, w.phase_message, w.completed = "Failed", f"could not start: {exc}", time.time()
            self._active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
            return
        w.pods = pods
        w.phase = "Running"
        w.phase_message = message
        w.started = time.time()
        w.exit_code = None
        w.node = ",".join(sorted({p.node for p in placements}))
        w.devices = ",".join(str(d) for p in placements for d in p.devices)
        w.gpus_allocated = sum(self._pod_gpus(pod) for pod in pods)
        pids = ", ".join(str(p["pid"]) for p in pods)
        self.store.save(w, ("Started", f"{message}; pid {pids}"))

    def _pod_gpus(self, pod: dict[str, Any]) -> float:
        if pod["exclusive"]:
            return float(len(pod["devices"]))
        mem = {g.index: g.memory for g in self.machine.node.gpus}
        return float(
            sum(b / mem[d] for d, b in zip(pod["devices"], pod["requestBytes"], strict=True))
        )

    def _pod_env(self, w: Workload, index: int, p: Placement) -> dict[str, str]:
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
            env["PATH"] = f"{self._sim_bin}{os.pathsep}{os.environ.get('PATH', '')}"
        env["TESSERA_ISOLATION"] = "off"
        if gpus and not p.exclusive:
            env.update(
                self.isolation.env(f"{w.id}-{index}", [g.uuid for g in gpus], p, {**os.environ, **env})
            )
        return env

    def _check_pods(self, w: Workload, restarted: bool = False) -> None:
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
                    self._terminate(pod, self.grace)
                    pod["phase"] = "Failed"
                    pod["holds"] = False
            w.phase, w.exit_code, w.completed = "Failed", failed[0], now
            w.phase_message = failed[1]
            w.gpus_allocated = 0.0
            self._active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
            self._wake.set()
        elif all(p.get("phase") == "Completed" for p in w.pods):
            w.phase, w.exit_code, w.completed = "Completed", 0, now
            w.phase_message = "all pods exited with code 0"
            w.gpus_allocated = 0.0
            self._active.pop(w.id, None)
            self.store.save(w, ("Completed", w.phase_message))
            self._wake.set()
        else:
            w.gpus_allocated = sum(self._pod_gpus(p) for p in w.pods if p.get("holds"))
            self.store.save(w)

    def _begin_stop(self, w: Workload, target: str, reason: str, kind: str = "Stopping") -> None:
        """Send SIGTERM to every pod; ``_finish_stop`` completes once their groups are gone."""
        w.spec["_after_stop"] = target
        if target == "Deleted":
            w.phase = "Deleting"
        else:
            w.phase = "Stopping"
        w.phase_message = reason
        for pod in w.pods:
            if pod.get("phase") == "Running":
                self._terminate(pod, self.grace)
        self.store.save(w, (kind, reason))
        self._finish_stop(w)
        self._wake.set()

    def _finish_stop(self, w: Workload) -> None:
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
            self._active.pop(w.id, None)
            self.store.delete_workload(w.id)
            self._wake.set()
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
            self._active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
        else:
            w.phase = "Stopped"
            w.completed = time.time()
            self._active.pop(w.id, None)
            self.store.save(w, ("Stopped", "all pods stopped"))
        self._wake.set()

    # -- auth ------------------------------------------------------------------------------------

    # -- cluster ---------------------------------------------------------------------------------

    def simulated(self) -> bool:
        return self.machine.simulated

    def cluster(self) -> dict[str, Any]:
        node = self.machine.node
        used: dict[int, list[tuple[str, int, bool]]] = {g.index: [] for g in node.gpus}
        with self._lock:
            for w in self._active.values():
                for pod in w.pods:
                    if not pod.get("holds"):
                        continue
                    for d, b in zip(pod["devices"], pod["requestBytes"], strict=True):
                        used[d].append((w.name, b, pod["exclusive"]))
        gpus = []
        for g in node.gpus:
            tenants = used[g.index]
            gpus.append({
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "product": g.product,
                "memoryBytes": g.memory,
                "allocatedBytes": sum(b for _, b, _ in tenants),
                "workloads": [
                    {"name": n, "bytes": b, "exclusive": e} for n, b, e in tenants
                ],
            })
        return {
            "backend": "embedded",
            "simulated": self.machine.simulated,
            "driver": self.machine.driver,
            "scheduler": self.scheduler.name,
            "isolation": self.isolation.describe(),
            "containerRuntime": self.runtime.name if self.runtime else None,
            "containerRuntimeNote": self.runtime_note if self.runtime is None else "",
            "nodes": [{"name": node.name, "gpus": gpus}],
        }

    # -- projects --------------------------------------------------------------------------------

    def _project_dict(self, p: Project) -> dict[str, Any]:
        allocated = 0.0
        with self._lock:
            for w in self._active.values():
                if w.project_id == p.id:
                    allocated += w.gpus_allocated
        return {
            "id": str(p.id),
            "name": p.name,
            "resources": {
                "gpu": {
                    "deserved": p.deserved,
                    "limit": p.limit,
                    "overQuotaWeight": p.over_quota_weight,
                }
            },
            "priority": p.priority,
            "status": {"allocated": {"gpu": round(allocated, 4)}},
            "createdAt": _iso(p.created),
        }

    def create_project(self, fields: ProjectFields) -> dict[str, Any]:
        check_project(fields)
        with self._lock:
            if self.store.project(fields.name) is not None:
                raise Conflict(f"project {fields.name} already exists")
            p = self.store.create_project(
                fields.name, fields.deserved, fields.limit, fields.over_quota_weight,
                fields.priority,
            )
        self._wake.set()
        return self._project_dict(p)

    def projects(self) -> list[dict[str, Any]]:
        return [self._project_dict(p) for p in self.store.projects()]

    def _get_project(self, id_or_name: str) -> Project:
        p = self.store.project(id_or_name)
        if p is None:
            raise NotFound(f"project {id_or_name} not found")
        return p

    def project(self, id_or_name: str) -> dict[str, Any]:
        return self._project_dict(self._get_project(id_or_name))

    def update_project(self, id_or_name: str, fields: ProjectFields) -> dict[str, Any]:
        with self._lock:
            p = self._get_project(id_or_name)
            fields.name = p.name
            check_project(fields)
            p.deserved, p.limit = fields.deserved, fields.limit
            p.over_quota_weight, p.priority = fields.over_quota_weight, fields.priority
            self.store.update_project(p)
        self._wake.set()
        return self._project_dict(p)

    def delete_project(self, id_or_name: str) -> None:
        with self._lock:
            p = self._get_project(id_or_name)
            count = self.store.count_workloads(p.id)
            if count:
                raise Conflict(f"project {p.name} has {count} workload(s); delete them first")
            self.store.delete_project(p.id)

    # -- workloads -------------------------------------------------------------------------------

    def submit(self, s: WorkloadSubmission) -> dict[str, Any]:
        admitted = check_submission(s)
        if not s.command and self.runtime is None:
            raise InvalidRequest("spec.image", containers.refusal(self.runtime_note))
        for i, port in enumerate(s.spec.get("ports") or []):
            ext = port.get("external")
            if s.command and ext is not None and ext != port["container"]:
                raise InvalidRequest(
                    f"spec.ports[{i}].external", "must equal the container port for a command "
                    "(it runs on this machine and listens there itself; only an image in a "
                    "container can be published on another port)", ext)
        if s.spec.get("ports") and s.workers > 1:
            raise InvalidRequest("spec.ports", "needs a single pod (workers 1): every pod would "
                                 "listen on the same port of this machine", s.workers)
        check_against_cluster(s.gpu, [self.machine.node])
        with self._lock:
            project = self.store.project(s.project)
            if project is None:
                raise InvalidRequest("projectId", "no project with this id or name", s.project)
            estimate = check_limit(s.gpu, [self.machine.node], s.workers, project.name,
                                   project.limit)
            if self.store.workload_by_name(project.id, s.name) is not None:
                raise Conflict(f"a workload named {s.name} already exists in project {project.name}")
            spec = {k: v for k, v in s.spec.items() if not k.startswith("_")}
            spec["_argv"] = list(s.command)
            ports = [(int(p["container"]), int(p.get("external") or p["container"]))
                     for p in s.spec.get("ports") or []]
            if ports:
                spec["_ports"] = ports
                spec["_serviceUrls"] = [f"http://127.0.0.1:{ext}" for _, ext in ports]
            if not s.command and self.runtime is not None:
                spec["_container"] = {"runtime": self.runtime.name, "path": self.runtime.path,
                                      "cdi": self.runtime.cdi, "image": s.image}
            spec["_env"] = dict(s.env)
            if s.working_dir:
                spec["workingDir"] = s.working_dir
            now = time.time()
            w = Workload(
                seq=0,
                id=str(uuid.uuid4()),
                name=s.name,
                project_id=project.id,
                project_name=project.name,
                type=s.type,
                phase="Pending",
                phase_message="waiting for the next scheduling cycle",
                spec=spec,
                request=gpu_request_to_dict(s.gpu),
                preemptible=admitted.preemptible,
                priority_class=admitted.priority_class,
                priority=admitted.priority,
                workers=s.workers,
                min_workers=admitted.min_workers,
                gpus_requested=estimate,
                gpus_allocated=0.0,
                node="",
                devices="",
                exit_code=None,
                created=now,
                started=None,
                completed=None,
                request_text=s.gpu.describe(),
            )
            self.store.insert_workload(w, f"submitted to project {project.name}: {s.gpu.describe()}")
            self._active[w.id] = w
        self._wake.set()
        return self.workload_dict(w)

    def _get(self, workload_id: str, kind: str | None) -> Workload:
        with self._lock:
            w = self._active.get(workload_id) or self.store.workload(workload_id)
        if w is None or (kind is not None and w.type != kind):
            raise NotFound(f"workload {workload_id} not found")
        return w

    def workloads_json(
        self,
        filters: list[tuple[str, str, str]],
        search: str | None,
        sort_by: str,
        descending: bool,
        offset: int,
        limit: int,
        fields: list[str] | None = None,
        rows: bool = False,
    ) -> tuple[str, int]:
        return self.store.list_json(
            filters, search, sort_by, descending, offset, limit, self.machine.simulated, fields,
            rows,
        )

    def workload(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        w = self._get(workload_id, kind)
        out = self.workload_dict(w)
        out["events"] = [
            {"time": _iso(e.time), "kind": e.kind, "message": e.message}
            for e in self.store.events(w.id)
        ]
        return out

    def delete_workload(self, workload_id: str, kind: str | None = None) -> None:
        with self._lock:
            w = self._get(workload_id, kind)
            active = self._active.get(w.id)
            if active is None:
                self.store.delete_workload(w.id)
                return
            if active.phase == "Pending":
                self._active.pop(w.id, None)
                self.store.delete_workload(w.id)
                self._wake.set()
                return
            self._begin_stop(active, "Deleted", "deleted by user")

    def suspend(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        with self._lock:
            w = self._get(workload_id, kind)
            active = self._active.get(w.id)
            if active is None or active.phase in ("Stopping", "Deleting"):
                raise Conflict(f"workload {w.name} is {w.phase}; only Pending or Running suspend")
            if active.phase == "Pending":
                active.phase, active.phase_message = "Stopped", "suspended by user"
                self._active.pop(w.id, None)
                self.store.save(active, ("Stopped", "suspended by user"))
            else:
                self._begin_stop(active, "Stopped", "suspended by user")
            return self.workload_dict(active)

    def resume(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        with self._lock:
            w = self._get(workload_id, kind)
            if w.phase != "Stopped":
                raise Conflict(f"workload {w.name} is {w.phase}; only Stopped workloads resume")
            w.phase, w.phase_message, w.pods = "Pending", "resumed by user", []
            w.completed = None
            w.exit_code = None
            self._active[w.id] = w
            self.store.save(w, ("Resumed", "resumed by user"))
        self._wake.set()
        return self.workload_dict(w)

    def logs(self, workload_id: str, pod: int, offset: int) -> tuple[bytes, int]:
        w = self._get(workload_id, None)
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

    def pods(self, workload_id: str) -> list[dict[str, Any]]:
        w = self._get(workload_id, None)
        return [self._pod_dict(p) for p in w.pods]

    def exec_command(self, workload_id: str, pod: int, command: list[str],
                     timeout: float) -> dict[str, Any]:
        """COMMAND with the pod's environment, on this machine (the API's exec; the CLI on the
        server's machine runs it itself, attached to the terminal)."""
        import subprocess

        w = self._get(workload_id, None)
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

    # -- documents -------------------------------------------------------------------------------

    def _pod_dict(self, p: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": p["index"],
            "phase": p.get("phase"),
            "nodeName": p["node"],
            "gpuDevices": [
                {"index": d, "uuid": u, "requestBytes": r, "limitBytes": lim}
                for d, u, r, lim in zip(
                    p["devices"], p["uuids"], p["requestBytes"], p["limitBytes"], strict=True
                )
            ],
            "exclusive": p["exclusive"],
            "pid": p.get("pid"),
            "exitCode": p.get("exitCode"),
            "logPath": p.get("log"),
            "env": p.get("env", {}),
            "container": p.get("env", {}).get("TESSERA_CONTAINER"),
        }

    def workload_dict(self, w: Workload, brief: bool = False) -> dict[str, Any]:
        gpu = gpu_request_from_dict(w.request)
        compute = compute_doc(gpu)
        out: dict[str, Any] = {
            "workloadId": w.id,
            "name": w.name,
            "requestedName": w.name,
            "type": w.type,
            "projectId": str(w.project_id),
            "projectName": w.project_name,
            "phase": w.phase,
            "phaseMessage": w.phase_message,
            "createdAt": _iso(w.created),
            "startedAt": _iso(w.started) if w.started else None,
            "completedAt": _iso(w.completed) if w.completed else None,
            "exitCode": w.exit_code,
            "priorityClass": w.priority_class,
            "preemptible": w.preemptible,
            "nodeName": w.node or None,
            "gpuDevices": w.devices,
            "workers": w.workers,
            "minWorkers": w.min_workers,
            "runningPods": sum(1 for p in w.pods if p.get("phase") == "Running"),
            "gpus": {
                "requested": round(w.gpus_requested, 4),
                "allocated": round(w.gpus_allocated, 4),
                "request": gpu.describe(),
            },
            "simulated": self.machine.simulated,
            "image": w.spec.get("image") or "",
            "serviceUrls": list(w.spec.get("_serviceUrls") or []),
        }
        if brief:
            return out
        spec = {k: v for k, v in w.spec.items() if not k.startswith("_")}
        argv = w.spec.get("_argv") or []
        spec["command"] = argv[0] if argv else ""
        import shlex

        spec["args"] = shlex.join(argv[1:])
        spec["environmentVariables"] = [
            {"name": k, "value": v} for k, v in (w.spec.get("_env") or {}).items()
        ]
        spec["compute"] = compute
        out["spec"] = spec
        out["pods"] = [self._pod_dict(p) for p in w.pods]
        out["isolation"] = self.isolation.describe()
        out["scheduler"] = self.scheduler.name
        return out


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
