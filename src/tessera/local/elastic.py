"""Elastic trainings in embedded mode: a running workload of ``--min-workers MIN`` to
``--workers MAX`` pods grows by single pods into idle GPUs and is shrunk by single pods, the
rest running on (docs/scheduling.md#elastic-and-semi-preemptible-workloads).

Its pods are TorchElastic agents (``torchrun`` with the ``PET_*`` settings of
``tessera.local.distributed.elastic_env``), so the launcher re-forms the group when one comes or
goes; tessera starts and stops the pods. The translation and the plan's two resizing steps:

* **Translation**: a running workload as the cycle sees it. An elastic one that may resize has
  ``MAX`` pods, its running ones first (pod 0, the rendezvous host and the gang's anchor, then
  by start, newest last, so the core's shrink, which gives back the highest indexes and never
  an anchor, takes the newest and never pod 0) and its free slots after them (growth), gang
  minimum ``MIN``. :attr:`slots` maps the
  core's pod indexes back to pod numbers for the plan of this cycle. While a pod of it starts
  or stops, after a pod ended, or when it is not elastic, it is a gang of the pods that run.
* **Grow** (a binding of a running workload): each new pod is planned and launched exactly as a
  first start's pods (``tessera.local.pod_plan``: its share, the isolation library's limit),
  its intent stored first; event ``Grown``.
* **Shrink** (an eviction with ``pods``): those pods become ``Stopping`` (stored, event
  ``Shrunk`` with the core's reason, as on Kubernetes) and are sent SIGTERM, SIGKILL after the
  grace period; :meth:`tick` drops each once its process group is gone, and the GPUs it held
  then stop counting (accounting follows ``gpus_allocated``). A workload waiting for the room it
  frees (``after_evictions``) waits until then (:meth:`holds`).

A server restarted in between finds the stored intent or mark: a pod whose start was stored is
re-attached if its process runs, else dropped; a Stopping pod is signalled again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from tessera.api.backend import WorkloadSubmission
from tessera.api.storage import storage_error
from tessera.core.cycle import Binding, Eviction, Waiting
from tessera.core.cycle import Workload as CoreWorkload
from tessera.core.errors import InvalidRequest
from tessera.local import faultpoints
from tessera.local.pod_plan import START_KEY, launch, plan_pod
from tessera.local.pods import PodProcesses
from tessera.local.records import Phase, PodPhase, PodRecord, pid_of
from tessera.local.scheduling import core_workload, pod_placement
from tessera.local.store import Workload, all_or_nothing

FIXED_SIZE = ("jax", "mpi", "tensorflow", "xgboost")
"""``tessera training FRAMEWORK submit`` variants whose processes share one fixed count
(``JAX_NUM_PROCESSES``, MPI's hostfile, ...): they cannot resize while running."""
RETRY_AFTER = 30.0
"""Seconds a workload whose further pod could not start waits before it is grown again
(``TESSERA_GROW_RETRY_SECONDS`` sets another, e.g. for tests)."""


def retry_after(env: dict[str, str] | None = None) -> float:
    """The grow retry delay: ``TESSERA_GROW_RETRY_SECONDS`` (a number of seconds, at least 0)
    or :data:`RETRY_AFTER`."""
    raw = (os.environ if env is None else env).get("TESSERA_GROW_RETRY_SECONDS", "")
    if not raw:
        return RETRY_AFTER
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ValueError(f"TESSERA_GROW_RETRY_SECONDS: must be a number of seconds, at least 0, "
                         f"not {raw!r}")
    return value


def check_submission(s: WorkloadSubmission) -> None:
    """Refuse elasticity on a training whose launcher cannot re-form its group."""
    framework = s.env.get("TESSERA_FRAMEWORK", "")
    if s.min_workers is not None and s.min_workers < s.workers and framework in FIXED_SIZE:
        raise InvalidRequest(
            "spec.minWorkers", f"elastic (below workers, {s.workers}) needs a launcher that "
            f"re-forms its group as pods come and go (torchrun: a pytorch or plain training); a "
            f"{framework} training's processes share one fixed count", s.min_workers)


def _order(pod: PodRecord) -> tuple[bool, int, int]:
    """Pod 0 (the rendezvous host) first, then by start (the process's start time in clock
    ticks since boot): the newest is the last."""
    return pod["index"] != 0, int(pod.get("startTicks") or 0), pod["index"]


class ElasticPods:
    """The resizing of running elastic workloads (the backend holds its lock around each call)."""

    def __init__(self, processes: PodProcesses) -> None:
        self.processes = processes
        self.slots: dict[str, tuple[int, ...]] = {}
        """Workload id -> pod number of each of the core's pod indexes, this cycle."""
        self._signalled: set[int] = set()
        """Process groups of shrunk pods sent SIGTERM by this server."""
        self._retry: dict[str, float] = {}
        """Workload id -> when growing it may be tried again after a failed start."""
        self.retry_after = retry_after()
        self._waits: dict[str, str] = {}
        """Workload id -> why its further pods wait, from the last cycle (``1 elastic pod(s)
        wait: ...``)."""

    # -- translation -----------------------------------------------------------------------------

    def running(self, w: Workload, here: dict[int, str], now: float) -> CoreWorkload | None:
        """``w`` (holding GPUs) as the cycle sees it; None when no pod of it holds GPUs here."""
        pods = sorted((p for p in w.pods if p.get("holds", True) and all(
            here.get(d) == u for d, u in zip(p["devices"], p["uuids"], strict=True))), key=_order)
        if not pods:
            return None
        free: list[int] | None = None
        if self._resizable(w):
            used = {p["index"] for p in w.pods}
            grows = (all(p.get("phase") == PodPhase.RUNNING for p in w.pods) and 0 in used
                     and self._retry.get(w.id, 0.0) <= time.monotonic())
            free = [i for i in range(w.workers) if i not in used] if grows else []
        self.slots[w.id] = (*(p["index"] for p in pods), *(free or ()))
        core = core_workload(w, [pod_placement(p) for p in pods], now,
                             free=None if free is None else len(free))
        # Pod 0, the rendezvous host, is the gang's anchor (tessera.core.cycle.anchors): never
        # shrunk, and the workload grows only while it runs (as on Kubernetes).
        return dataclasses.replace(core, anchors=(0,)) if free is not None and pods[0]["index"] == 0 else core

    @staticmethod
    def _resizable(w: Workload) -> bool:
        return (w.phase == Phase.RUNNING and w.min_workers < w.workers
                and not w.control.mig_profile and not w.control.mig_device
                and not any(p.get("phase") in (PodPhase.STOPPING, PodPhase.STARTING)
                            for p in w.pods))

    def holds(self, wid: str) -> bool:
        """Whether a workload evicted (or shrunk) for another still holds what it gives back."""
        v = self.processes.active.get(wid)
        if v is None or v.phase == Phase.PENDING:
            return False
        if v.phase == Phase.RUNNING:  # only shrunk, not evicted: until its pods are gone
            return any(p.get("phase") == PodPhase.STOPPING for p in v.pods)
        return True

    def waited(self, waiting: Iterable[Waiting]) -> None:
        """The cycle's reasons for the unplaced pods of running workloads (a pending one's go to
        its phase message): kept until the next cycle for :meth:`document`."""
        self._waits = {x.workload_id: x.reason for x in waiting
                       if (w := self.processes.active.get(x.workload_id)) is not None
                       and w.phase == Phase.RUNNING}

    def document(self, w: Workload, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` (the API's document of ``w``) with ``elasticWaiting``: why a running elastic
        workload below its maximum does not grow (null when it is not waiting)."""
        if "pods" in doc and w.min_workers < w.workers:  # not in the listing's brief form
            doc["elasticWaiting"] = self._paused(w) if w.phase == Phase.RUNNING else None
        return doc

    def _paused(self, w: Workload) -> str | None:
        """The last cycle's reason, else why the cycle was not offered its free slots."""
        phases = [p.get("phase") for p in w.pods]
        if phases.count(PodPhase.RUNNING) >= w.workers or w.id in self._waits:
            return self._waits.get(w.id)
        if {PodPhase.STARTING, PodPhase.STOPPING} & set(phases):
            return "not resized while pod(s) start or stop"
        if set(phases) - {PodPhase.RUNNING}:
            return "not grown: pod(s) of it have ended"
        left = self._retry.get(w.id, 0.0) - time.monotonic()
        if left > 0:
            return f"a grow failed to start (event GrowFailed): tried again in {left:.0f} s"
        return None

    # -- the plan --------------------------------------------------------------------------------

    def shrink(self, w: Workload, ev: Eviction) -> None:
        """Stop the pods ``ev`` takes back; the rest of ``w`` runs on."""
        slots = self.slots.get(w.id, ())
        taken = {slots[i] for i in ev.pods if i < len(slots)} - {0}
        pods = [p for p in w.pods if p["index"] in taken and p.get("phase") == PodPhase.RUNNING]
        if not pods:
            return
        with all_or_nothing(w, self.processes.active):
            for p in pods:
                p["phase"] = PodPhase.STOPPING
            self.processes.store.save(w, ("Shrunk", ev.reason))
        for p in pods:
            self._stop(p)

    def _stop(self, pod: PodRecord) -> None:
        self._signalled.add(pid_of(pod))
        self.processes.terminate(pod, self.processes.grace)

    def grow(self, w: Workload, b: Binding) -> None:
        """Start the further pods the plan binds for running ``w`` (each on its GPU share). A
        binding that needs evictions first is left: the next cycle places it on the room."""
        slots = self.slots.get(w.id, ())
        used = {p["index"] for p in w.pods}
        todo = [(slots[pb.pod], pb.placement) for pb in sorted(b.pods, key=lambda pb: pb.pod)
                if pb.pod < len(slots) and slots[pb.pod] not in used]
        if b.after_evictions or not todo or not self._resizable(w):
            return
        procs, attempt = self.processes, uuid.uuid4().hex[:12]
        try:
            planned = [plan_pod(procs.machine, procs.isolation, procs.sim_bin, procs.runner, w,
                                slot, p, attempt) for slot, p in todo]
        except Exception as exc:  # a bad stored spec: growth stops, the pods that run go on
            self._retry[w.id] = time.monotonic() + self.retry_after
            procs.store.add_event(w.id, "GrowFailed", f"could not start a further pod: {exc}")
            return
        with all_or_nothing(w, procs.active):
            w.pods = [*w.pods, *planned]  # the intent first, as a first start's
            procs.store.save(w)
        faultpoints.hit("grow-intent")
        launched: list[PodRecord] = []
        try:
            for pod in planned:
                launch(procs.runner, w, pod)
                launched.append(pod)
        except Exception as exc:
            for pod in launched:
                procs.terminate(pod, 0)
            self._retry[w.id] = time.monotonic() + self.retry_after
            w.pods = [p for p in w.pods if all(p is not q for q in planned)]
            self._save(w, ("GrowFailed", f"could not start pod(s) {', '.join(str(s) for s, _ in todo)}: "
                                         f"{exc}; tried again in {self.retry_after:g} s"))
            return
        faultpoints.hit("grow-launched")
        running = sum(1 for p in w.pods if p.get("phase") == PodPhase.RUNNING)
        self._save(w, ("Grown", f"grown by {len(planned)} elastic pod(s) (to {running} of "
                                f"{w.workers}, minimum {w.min_workers}): {b.message}; pod(s) "
                                + ", ".join(f"{p['index']} pid {p['pid']}" for p in planned)))

    def _save(self, w: Workload, event: tuple[str, str] | None = None) -> None:
        """Its GPUs, devices and node from the pods that hold GPUs now (accounting follows
        ``gpus_allocated``), stored. Its processes run whatever the disk says: a store that
        cannot take it now takes it with the next change (a restart re-attaches either way)."""
        holding = [p for p in w.pods if p.get("holds")]
        w.gpus_allocated = sum(self.processes.gpus_of(p) for p in holding)
        w.node = ",".join(sorted({p["node"] for p in holding}))
        w.devices = ",".join(str(d) for p in sorted(holding, key=lambda p: p["index"])
                             for d in p["devices"])
        try:
            self.processes.store.save(w, event)
        except Exception as exc:
            if storage_error(exc) is None:
                raise

    # -- every cycle -----------------------------------------------------------------------------

    def tick(self) -> None:
        """Drop the shrunk pods whose processes are gone; settle a grow a restart cut short."""
        self.slots.clear()
        runner = self.processes.runner
        for w in list(self.processes.active.values()):
            if w.phase != Phase.RUNNING:
                continue
            before, events = list(w.pods), []
            for p in before:
                if p.get("phase") == PodPhase.STARTING:
                    events.append(self._settle_start(w, p))
                elif p.get("phase") == PodPhase.STOPPING:
                    if pid_of(p) not in self._signalled:  # a restarted server signals again
                        self._stop(p)
                    if runner.check(pid_of(p), p.get("startTicks", 0), p["exitFile"]) is not None:
                        w.pods = [q for q in w.pods if q is not p]
                        self._signalled.discard(pid_of(p))
            if w.pods != before or events:
                self._save(w, events[0] if events else None)
                self.processes.wake.set()

    def _settle_start(self, w: Workload, pod: PodRecord) -> tuple[str, str]:
        """A further pod whose start was stored when the server stopped: re-attached if its
        process runs, else dropped (the cycle grows the workload again when there is room)."""
        key = str(pod.get("env", {}).get(START_KEY, ""))
        found = self.processes.runner.find_started(key.rpartition("/")[0] + "/")
        got = found.get(str(pod["index"]))
        for k in ("argv", "hostEnv", "cwd"):
            pod.pop(k, None)  # type: ignore[misc]
        if got is None:
            w.pods = [q for q in w.pods if q is not pod]
            return ("GrowFailed", f"the server stopped while pod {pod['index']} was starting; "
                    "it starts again when there is room")
        with contextlib.suppress(Exception):
            self.processes.runner.adopt(*got)
        pod.update({"pid": got[0], "startTicks": got[1], "phase": PodPhase.RUNNING})
        return ("Reattached", f"server restarted while pod {pod['index']} was starting; "
                f"re-attached to it (pid {got[0]})")
