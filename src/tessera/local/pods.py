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
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.api.backend import Conflict, NotFound
from tessera.api.storage import storage_error
from tessera.core.errors import InvalidRequest
from tessera.core.state import Placement
from tessera.local import containers, distributed, faultpoints
from tessera.local.exec_run import run_capped
from tessera.local.gpus import Machine
from tessera.local.isolation_hook import Isolation
from tessera.local.pod_plan import launch, plan_pod
from tessera.local.records import LIVE, Phase, PodPhase, PodRecord, pid_of
from tessera.local.runner import Runner
from tessera.local.store import Store, Workload, all_or_nothing


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
            if w.phase == Phase.PENDING:
                if w.control.starting:
                    self.resume_start(w)
                continue
            alive = [
                p for p in w.pods
                if p.get("pid") and p.get("phase") in LIVE
                and self.runner.adopt(pid_of(p), p.get("startTicks", 0))
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
            if w.phase == Phase.RUNNING:
                if len(alive) == len([p for p in w.pods if p.get("phase") in LIVE]):
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

    def terminate(self, pod: PodRecord, grace: float) -> None:
        """Stop a pod: SIGTERM to its process group, SIGKILL after ``grace``; a pod that is an
        image's container is also stopped through its runtime (a killed ``docker run`` client
        would leave the container running)."""
        self.runner.terminate(pid_of(pod), grace)
        runtime, _, name = str(pod.get("env", {}).get("TESSERA_CONTAINER", "")).partition(":")
        path = shutil.which(runtime) if runtime in containers.RUNTIMES else None
        if path and name:
            with contextlib.suppress(OSError):
                subprocess.Popen(
                    containers.Runtime(runtime, path).stop_argv(name.removeprefix("tessera-"), grace),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True)

    def start(self, w: Workload, placements: Sequence[Placement], message: str) -> None:
        """Start the workload's pods: intent, then start, then confirm.

        The pods to start (devices, environment, command) are written to the store first, with
        an attempt id that every pod process carries in its environment
        (``TESSERA_START_KEY``); only then are processes launched, and the pids are written
        once all run. A server killed in between finds the intent on restart
        (``resume_start``) and re-attaches to the attempt's processes or kills them, so a pod
        is never left running untracked nor started twice. Anything that fails here fails
        this workload only, never the cycle."""
        attempt = uuid.uuid4().hex[:12]
        try:
            pods = self._planned(w, placements, attempt)
        except Exception as exc:  # a bad stored spec fails its workload, not every cycle
            if storage_error(exc) is not None:
                self._requeue_start(w, [], exc)
            else:
                self._fail_start(w, [], exc)
            return
        with all_or_nothing(w, self.active):
            w.control.starting = attempt
            w.pods = pods
            self.store.save(w, ("Starting", f"starting {len(pods)} pod(s) (attempt {attempt})"))
        faultpoints.hit("start-intent")
        launched: list[PodRecord] = []
        try:
            for pod in pods:
                if launched:
                    faultpoints.hit("start-between-pods")
                launch(self.runner, w, pod)
                launched.append(pod)
        except Exception as exc:
            if storage_error(exc) is not None:
                self._requeue_start(w, launched, exc)
            else:
                self._fail_start(w, launched, exc)
            return
        faultpoints.hit("start-launched")
        self._confirm(w, message, ("Started", f"{message}; pid "
                                   f"{', '.join(str(p['pid']) for p in pods)}"))

    def _planned(self, w: Workload, placements: Sequence[Placement],
                 attempt: str) -> list[PodRecord]:
        """The pod records to start (phase Starting, no pid yet), with what launching needs."""
        w.control.master_port = distributed.free_port()  # one rendezvous port per start
        return [plan_pod(self.machine, self.isolation, self.sim_bin, self.runner, w, i, p, attempt)
                for i, p in enumerate(placements)]

    def _requeue_start(self, w: Workload, launched: list[PodRecord], exc: Exception) -> None:
        """The data directory is full (a pod's log cannot be created): not the workload's
        fault. What was launched is stopped and the workload waits for the next cycle. If even
        that cannot be stored, the stored intent stays, which a restart resolves the same way
        (resume_start)."""
        for pod in launched:
            self.terminate(pod, 0)
        reason = f"waiting: could not start ({storage_error(exc)[1]})"  # type: ignore[index]
        w.control.starting = None
        w.pods = []
        w.phase, w.phase_message = Phase.PENDING, reason
        with contextlib.suppress(sqlite3.Error, OSError):
            self.store.save(w, ("Waiting", reason))

    def _fail_start(self, w: Workload, launched: list[PodRecord], exc: Exception) -> None:
        for pod in launched:
            self.terminate(pod, 0)
        reason = str(exc) if isinstance(exc, InvalidRequest | OSError) else repr(exc)
        with all_or_nothing(w, self.active):
            w.control.starting = None
            w.pods = []
            w.phase, w.phase_message, w.completed = Phase.FAILED, f"could not start: {reason}", time.time()
            self.active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))

    def _confirm(self, w: Workload, message: str, event: tuple[str, str]) -> None:
        """The attempt's pods all run: the workload is Running (one write)."""
        w.control.starting = None
        for pod in w.pods:
            pod.pop("argv", None)
            pod.pop("hostEnv", None)
            pod.pop("cwd", None)
        w.phase = Phase.RUNNING
        w.phase_message = message
        w.started = time.time()
        w.exit_code = None
        w.node = ",".join(sorted({p["node"] for p in w.pods}))
        w.devices = ",".join(str(d) for p in w.pods for d in p["devices"])
        w.gpus_allocated = sum(self.gpus_of(pod) for pod in w.pods)
        try:
            self.store.save(w, event)
        except Exception as exc:
            # The pods run: memory says so (never start them again); the store keeps the
            # intent, which a restart re-attaches to; check() stores this every cycle until
            # the disk takes it.
            if storage_error(exc) is None:
                raise
            w.control.unsaved = list(event)

    def resume_start(self, w: Workload) -> None:
        """A start the server was killed in (its intent is stored): re-attach if every pod of
        the attempt runs, else kill what runs of it and queue the workload again."""
        attempt = w.control.starting
        found = self.runner.find_started(f"{w.id}/{attempt}/")
        pods = [p for p in w.pods if p.get("phase") == PodPhase.STARTING]
        if pods and all(str(p["index"]) in found for p in pods):
            for p in pods:
                pid, ticks = found[str(p["index"])]
                self.runner.adopt(pid, ticks)
                p.update({"pid": pid, "startTicks": ticks, "phase": PodPhase.RUNNING})
            self._confirm(w, w.phase_message or "started", (
                "Reattached", f"server restarted during the start; re-attached to all "
                f"{len(pods)} pod(s) of attempt {attempt}"))
            return
        for pid, _ in found.values():
            self.runner.terminate(pid, 0)
            self.runner.kill_now(pid)
        w.control.starting = None
        w.pods = []
        w.phase = Phase.PENDING
        w.phase_message = "queued again: the server stopped while starting it"
        self.store.save(w, ("Requeued", f"the server stopped during start attempt {attempt}; "
                            f"{len(found)} of {len(pods)} pod(s) had started and were killed"))

    def gpus_of(self, pod: PodRecord) -> float:
        if pod.get("mig"):
            return float(pod["mig"]["fraction"])  # a MIG partition: its share of the GPU
        if pod["exclusive"]:
            return float(len(pod["devices"]))
        mem = {g.index: g.schedulable for g in self.machine.node.gpus}
        return float(
            sum(b / mem[d] for d, b in zip(pod["devices"], pod["requestBytes"], strict=True))
        )

    def check(self, w: Workload, restarted: bool = False) -> None:
        unsaved, w.control.unsaved = w.control.unsaved, None
        if unsaved:  # a start confirmed while the disk was full: store it now
            try:
                self.store.save(w, (unsaved[0], unsaved[1]))
            except Exception as exc:
                w.control.unsaved = unsaved
                if storage_error(exc) is None:
                    raise
        changed = False
        failed: tuple[int | None, str] | None = None
        for pod in w.pods:  # a Stopping pod (shrunk away) is tessera.local.elastic's
            if pod.get("phase") != PodPhase.RUNNING:
                continue
            ended = self.runner.check(pid_of(pod), pod.get("startTicks", 0), pod["exitFile"])
            if ended is None:
                continue
            changed = True
            pod["exitCode"] = ended.code
            pod["holds"] = False
            if ended.code == 0:
                pod["phase"] = PodPhase.COMPLETED
            else:
                pod["phase"] = PodPhase.FAILED
                reason = ended.reason
                if ended.code is None and restarted:
                    reason = "the process was gone when the server restarted and left no exit code"
                if failed is None:
                    failed = (ended.code, f"pod {pod['index']}: {reason}")
        if not changed and not (w.pods and all(p.get("phase") == PodPhase.COMPLETED for p in w.pods)):
            return  # (all completed, unchanged: the last ended while another was shrunk away)
        now = time.time()
        if failed is not None:
            for pod in w.pods:
                if pod.get("phase") in LIVE:
                    self.terminate(pod, self.grace)
                    pod["phase"] = PodPhase.FAILED
                    pod["holds"] = False
            w.phase, w.exit_code, w.completed = Phase.FAILED, failed[0], now
            w.phase_message = failed[1]
            w.gpus_allocated = 0.0
            self.active.pop(w.id, None)
            self.store.save(w, ("Failed", w.phase_message))
            self.wake.set()
        elif all(p.get("phase") == PodPhase.COMPLETED for p in w.pods):
            w.phase, w.exit_code, w.completed = Phase.COMPLETED, 0, now
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
        with all_or_nothing(w, self.active):  # stored before any pod is signalled
            w.spec["_after_stop"] = target
            if target == "Deleted":
                w.phase = Phase.DELETING
            else:
                w.phase = Phase.STOPPING
            w.phase_message = reason
            self.store.save(w, (kind, reason))
        for pod in w.pods:
            if pod.get("phase") == PodPhase.RUNNING:
                self.terminate(pod, self.grace)
        self.finish_stop(w)
        self.wake.set()

    def finish_stop(self, w: Workload) -> None:
        for pod in w.pods:
            if pod.get("phase") not in LIVE:
                continue
            ended = self.runner.check(pid_of(pod), pod.get("startTicks", 0), pod["exitFile"])
            if ended is not None or not self.runner.group_alive(pid_of(pod)):
                pod["phase"] = PodPhase.STOPPED
                pod["holds"] = False
                pod["exitCode"] = None if ended is None else ended.code
        if any(p.get("phase") in LIVE for p in w.pods):
            return
        target = w.spec.get("_after_stop", "Stopped")
        if target == "Deleted":
            self.store.delete_workload(w.id)  # first: on a full disk it stays Deleting, retried
            self.active.pop(w.id, None)
            self.wake.set()
            return
        with all_or_nothing(w, self.active):
            w.spec.pop("_after_stop", None)
            w.gpus_allocated = 0.0
            w.node = ""
            w.devices = ""
            if target == "Pending":
                w.phase = Phase.PENDING
                w.control.pending_since = time.time()  # the wait is timed from here (metrics)
                w.pods = []
                self.store.save(w, ("Requeued", f"requeued after: {w.phase_message}"))
            elif target == "Failed":
                w.phase = Phase.FAILED
                w.completed = time.time()
                self.active.pop(w.id, None)
                self.store.save(w, ("Failed", w.phase_message))
            else:
                w.phase = Phase.STOPPED
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
        if w.phase != Phase.RUNNING:
            raise Conflict(f"workload {w.name} is {w.phase}; exec needs it Running")
        match = [p for p in w.pods if p["index"] == pod]
        if not match:
            raise NotFound(f"workload {w.name} has no pod {pod}")
        pod_env = match[0].get("env", {})
        if pod_env.get("TESSERA_CONTAINER"):
            rt_name, _, cname = pod_env["TESSERA_CONTAINER"].partition(":")
            container = w.control.container
            command = [container["path"] if container else rt_name, "exec", "-i", cname, *command]
        done = run_capped(command, {**os.environ, **pod_env}, w.spec.get("workingDir") or None,
                          timeout)
        out = {"exitCode": done.code, "stdout": done.stdout.decode(errors="replace"),
               "stderr": done.stderr.decode(errors="replace")}
        if done.truncated:
            out["truncated"] = True
        return out
