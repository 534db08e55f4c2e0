"""The local control plane: the API backend of embedded mode and the loop that joins the store,
the pods' processes and the scheduling cycle.

Each cycle (every ``interval`` seconds, or at once when something is submitted or changed) it
learns which pods ended, turns the store's workloads into the core's ``Snapshot``
(``tessera.local.scheduling``), runs the core's cycle and applies its ``Plan``: start pods, stop
evicted ones (``tessera.local.pods``), record why the rest wait. Every change is written to the
store before the API answers, so the loop can be killed at any moment. Validation is
``tessera.api.validation``; the API's documents are built by ``tessera.local.documents``.
About 440 lines because it is the whole ``Backend`` surface (each method a few lines) plus the
loop; nothing here is a second concern.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from tessera.api.auth import TokenAuth
from tessera.api.backend import (
    Conflict,
    NotFound,
    ProjectFields,
    Upstream,
    WorkloadQuery,
    WorkloadSubmission,
)
from tessera.api.token_store import TokenStore
from tessera.api.usage import merge
from tessera.api.validation import check_limit, check_mig_limit, check_project, check_submission
from tessera.core.cycle import Plan, Waiting
from tessera.core.cycle import Workload as CoreWorkload
from tessera.core.errors import InvalidRequest
from tessera.core.mig import MigGpu
from tessera.core.request_text import request_text
from tessera.core.requests import (
    check_against_cluster,
    gpu_request_from_dict,
    gpu_request_to_dict,
)
from tessera.core.state import Placement
from tessera.isolation.config import REGION_NAME
from tessera.local import compute_view, containers, isolation_hook
from tessera.local.containers import Runtime
from tessera.local.documents import iso, node_doc, pod_doc, project_doc, workload_doc
from tessera.local.elastic import ElasticPods
from tessera.local.gpus import Machine
from tessera.local.mig import LocalMig, RoomNow, room_now
from tessera.local.pods import PodProcesses
from tessera.local.records import HOLDING_PHASES, ContainerRef, Control, Phase, pid_of
from tessera.local.runner import Runner
from tessera.local.scheduling import LocalCycle, core_workload, refused
from tessera.local.spelling_env import with_runai_limit
from tessera.local.store import Project, Store, Workload, all_or_nothing
from tessera.local.usage import LocalUsage
from tessera.local.workload_types import WorkloadTypes
from tessera.node.containers import Share, ShareDevice
from tessera.node.mig import MigError
from tessera.node.reclaim import Reclaim, ReclaimerThread, prepare_directory


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
        mig_serves_shares: bool = False,
        scheduler: LocalCycle | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.runtime = runtime
        """podman or docker, for images with no command (tessera.local.containers)."""
        self.runtime_note = runtime_note
        self.machine = machine
        self.scheduler = scheduler or LocalCycle(policy, data_dir / "tessera.db")
        self.grace = grace
        self.interval = interval
        self.store = Store(data_dir / "tessera.db")
        self.auth_store: TokenStore = TokenStore(data_dir / "tessera.db")
        self.runner = Runner(data_dir)
        self.isolation = isolation_hook.load(
            data_dir, {g.uuid: g.headroom for g in machine.node.gpus})
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reclaimer: ReclaimerThread | None = None
        """Takes GPU memory on loan back when an owner needs its request (dynamic fractions)."""
        self._active: dict[str, Workload] = {}
        self._awaiting: dict[str, tuple[str, ...]] = {}
        """Pending workloads held back until the workloads evicted for them have stopped."""
        self.processes = PodProcesses(machine, self.runner, self.isolation, self.store, grace,
                                      data_dir / "sim-bin", self._active, self._wake)
        """Starting, watching and stopping the workloads' processes."""
        self.cycles = 0
        self.usage = LocalUsage(machine.node.name, machine.simulated, self._usage_shares,
                                self._region_of)
        """GPU memory used, loans and utilisation, read by the node agent's code here."""
        self.mig = LocalMig(machine, data_dir / "mig-journal.json", mig_serves_shares)
        """Partitions of the GPUs in MIG mode, for workloads that ask for a profile."""
        self.types = WorkloadTypes(data_dir, self.submit, self.delete_workload, lambda wid: (
            self._active.get(wid) or self.store.workload(wid)), self.wake, ElasticPods(self.processes))

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.machine.simulated:
            self.processes.write_sim_bin()
        with self._lock:
            for line in self.mig.start():
                print(f"tessera: MIG: {line}", file=sys.stderr, flush=True)
            self.processes.recover()
        self._thread = threading.Thread(target=self._loop, name="tessera-control", daemon=True)
        self._thread.start()
        self.usage.start()
        if isinstance(self.isolation, isolation_hook.Library):
            self._reclaimer = ReclaimerThread(prepare_directory(self.isolation.loans_dir),
                                              self._on_reclaim).start()

    def stop(self) -> None:
        self.usage.stop()
        if self._reclaimer is not None:
            self._reclaimer.stop()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.types.stop()
        with self._lock:
            self.mig.stop()
        self.store.close()
        self.auth_store.close()

    def _on_reclaim(self, r: Reclaim) -> None:
        """A borrowing process was killed for an owner: say so on both workloads."""
        with self._lock:
            victim = self._workload_of_share(r.victim_share)
            owner = self._workload_of_share(r.owner_share)
            msg = r.message(owner=owner.name if owner else None,
                            victim=victim.name if victim else None)
            if victim is not None:
                self.store.add_event(victim.id, "GPUMemoryLoanReclaimed", msg)
            if owner is not None:
                self.store.add_event(owner.id, "GPUMemoryLoanReturned", msg)

    def _workload_of_share(self, key: str) -> Workload | None:
        """A share's key is ``WORKLOAD_ID-POD_INDEX`` (tessera.local.pods)."""
        return self._active.get(key.rpartition("-")[0])

    def stop_all_workloads(self) -> int:
        """Stop every running pod (``tessera down --stop-workloads``); they become Stopped."""
        with self._lock:
            count = 0
            for w in list(self._active.values()):
                if w.phase in (Phase.RUNNING, Phase.PENDING):
                    self.processes.begin_stop(w, "Stopped", "stopped by tessera down")
                    count += 1
        deadline = time.monotonic() + self.grace + 2
        while time.monotonic() < deadline:
            self.cycle()
            with self._lock:
                if not any(w.phase in (Phase.STOPPING, Phase.DELETING) for w in self._active.values()):
                    break
            time.sleep(0.05)
        return count

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        last, since = "", 0.0
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.cycle()
            except Exception as exc:
                # The same failure every cycle (a full disk) is said once, then every 30 s:
                # twenty lines a second would fill what little space is left.
                if repr(exc) != last or time.monotonic() - since > 30:
                    print(f"tessera: control cycle failed: {exc!r}", file=sys.stderr, flush=True)
                    traceback.print_exc(limit=4)
                    last, since = repr(exc), time.monotonic()
            else:
                if last:
                    print("tessera: control cycle works again", file=sys.stderr, flush=True)
                last = ""

    # -- the cycle -------------------------------------------------------------------------------

    def cycle(self) -> Plan:
        with self._lock:
            self.cycles += 1
            self.runner.reap_kills()
            self.types.tick()
            for w in list(self._active.values()):
                if w.phase == Phase.RUNNING:
                    self.processes.check(w)
                elif w.phase in (Phase.STOPPING, Phase.DELETING):
                    self.processes.finish_stop(w)
            now = time.time()
            layout = self._mig_layout()
            self.mig.serving.begin({w.id for w in self._active.values()
                                    if w.phase == Phase.PENDING})
            workloads = self._workloads(now, layout)
            pending = [w for w in workloads if not w.placements]
            plan = refused((), "")
            if pending or any(None in w.placements for w in workloads):  # or one may grow
                try:
                    plan = self.scheduler.run((self.machine.node,), self.store.projects(),
                                              workloads, now, {self.machine.node.name: tuple(
                                                  layout[0])} if layout[0] else None)
                except InvalidRequest as exc:
                    plan = refused(pending, f"the scheduling cycle refused this machine's state: {exc}")
            else:  # no cycle: usage history still sees what stopped, and when
                self.scheduler.observe((self.machine.node,), workloads, now)
            # Shares left waiting for room may be served by a MIG partition from the next cycle
            # on (the operator's choice; tessera.local.mig_serving, docs/mig.md).
            for x in plan.waiting:
                if self._servable(x.workload_id):
                    self.mig.serving.waited(x.workload_id, x.kind)
            self._apply(plan, {w.id for w in pending})
            return plan

    def _servable(self, wid: str) -> bool:
        w = self._active.get(wid)
        return (w is not None and w.phase == Phase.PENDING and not w.control.mig_profile
                and not w.control.starting and w.workers == 1
                and not w.control.container
                and self.mig.serving_fraction(gpu_request_from_dict(w.request)) is not None)

    def _mig_layout(self) -> tuple[list[MigGpu], str]:
        """Partitions of MIG workloads that no longer run become idle (kept for reuse); then the
        MIG GPUs as the cycle sees them, with what is on them in words (tessera.local.mig)."""
        if not self.machine.mig:
            return [], ""
        self.mig.release({w.id for w in self._active.values()
                          if (w.control.mig_profile or w.control.mig_device) and (
            w.phase in (Phase.RUNNING, Phase.STOPPING, Phase.DELETING) or w.control.starting)})
        return self.mig.for_cycle()

    def _workloads(self, now: float, layout: tuple[list[MigGpu], str] = ([], "")) -> list[CoreWorkload]:
        """The active workloads as the cycle sees them: pending ones (except those waiting for
        their victims to stop) and those holding GPUs of this machine. A pending MIG workload
        may go only where its profile has room now (``layout``: the MIG GPUs and their words)."""
        out: list[CoreWorkload] = []
        here = {g.index: g.uuid for g in self.machine.node.gpus}
        rooms: dict[str, RoomNow] = {}
        for wid, victims in list(self._awaiting.items()):
            if not any(self.types.elastic.holds(v) for v in victims):
                del self._awaiting[wid]
        for w in self._active.values():
            profile = w.control.mig_profile
            if profile and w.phase == Phase.PENDING and w.control.starting:
                continue
            if w.phase == Phase.PENDING:
                if not profile:
                    w.control.mig_device = None  # a share served by MIG before: placed anew
                if w.id not in self._awaiting:
                    room, served = None, None
                    if profile:
                        room = rooms.get(profile) or rooms.setdefault(
                            profile, room_now(layout[0], layout[1], profile))
                    elif self.mig.serves_shares:  # asked as its profile (mig_serving)
                        served = self.mig.serving.ask(w.id, gpu_request_from_dict(w.request),
                                                      layout[0], layout[1])
                        room = RoomNow(served[0], True, "") if served else None
                    out.append(core_workload(w, None, now, room, served))
            # Holding GPUs (a MIG one counts as its fraction; evicting it frees its partition,
            # Snapshot.mig); an elastic one may grow or shrink (local/elastic.py).
            elif w.phase in HOLDING_PHASES and (run := self.types.elastic.running(w, here, now)):
                out.append(run)
        return out

    def _apply(self, plan: Plan, pending: set[str]) -> None:
        for ev in plan.evictions:
            w = self._active.get(ev.workload_id)
            if w is not None and w.phase == Phase.RUNNING:
                if ev.pods:  # shrunk: only those pods stop, the rest run on
                    self.types.elastic.shrink(w, ev)
                elif w.spec.get("onEviction") == "fail":
                    self.processes.begin_stop(
                        w, "Failed", f"evicted (onEviction: fail): {ev.reason}", kind="Preempted"
                    )
                else:
                    self.processes.begin_stop(w, "Pending", ev.reason, kind="Preempted")
        waiting = {x.workload_id: self._reason(x) for x in plan.waiting if x.workload_id in pending}
        self.types.elastic.waited(plan.waiting)  # a running elastic one's unplaced pods
        for b in plan.bindings:
            w = self._active.get(b.workload_id)
            if b.workload_id not in pending and w is not None and w.phase == Phase.RUNNING:
                self.types.elastic.grow(w, b)  # further pods of a running elastic workload
            if b.workload_id not in pending or w is None or w.phase != Phase.PENDING:
                continue
            if b.after_evictions:
                victims = ", ".join(self._active[v].name if v in self._active else v
                                    for v in b.after_evictions)
                waiting[b.workload_id] = f"waiting for {victims} to stop: {b.message}"
                self._awaiting[b.workload_id] = tuple(b.after_evictions)
                continue
            placements = [pb.placement for pb in sorted(b.pods, key=lambda pb: pb.pod)]
            if b.workload_id in self.mig.serving.asked:
                try:  # a share served by a partition: the one choose_serving picks
                    device, message = self.mig.place(w.id, gpu_request_from_dict(w.request))
                except MigError as exc:
                    waiting[b.workload_id] = f"waiting: {exc}"
                    continue
                w.control.mig_device = device
                self.processes.start(w, [Placement(node=self.machine.node.name, exclusive=True,
                                                   gpus=float(device["fraction"]))], message)
                continue
            if w.control.mig_profile:
                # The partition: reused or made through NVML (choose over the same partitions
                # the cycle saw); an NVML error is the reason to wait, nothing half-made.
                try:
                    device, message = self.mig.place(w.id, w.control.mig_profile)
                except MigError as exc:
                    waiting[b.workload_id] = f"waiting: {exc}"
                    continue
                w.control.mig_device = device
                self.processes.start(w, [Placement(node=self.machine.node.name, exclusive=True)],
                                     message)
                continue
            self.processes.start(w, placements, b.message)
        for wid, reason in waiting.items():
            w = self._active.get(wid)
            if w is not None and w.phase == Phase.PENDING and w.phase_message != reason:
                with all_or_nothing(w, self._active):
                    w.phase_message = reason
                    self.store.save(w, ("Waiting", reason))

    def _reason(self, waiting: Waiting) -> str:
        """A MIG workload's reason without the cluster's ``0/1 nodes are available: `` (one
        machine here)."""
        w, reason = self._active.get(waiting.workload_id), waiting.reason
        if w is not None and (w.control.mig_profile or w.id in self.mig.serving.asked):
            reason = reason.replace("0/1 nodes are available: ", "")
        return self.mig.serving.reason(waiting.workload_id, waiting.kind, reason)

    # -- cluster ---------------------------------------------------------------------------------

    def simulated(self) -> bool:
        return self.machine.simulated

    def upstream(self, exc: Exception) -> Upstream | None:
        return None  # embedded mode relies on nothing a client could be told to fix

    def cluster(self) -> dict[str, Any]:
        with self._lock:
            held = [(w.name, w.project_name, pod) for w in self._active.values()
                    for pod in w.pods if pod.get("holds")]
            mig = self.mig.describe({w.id: w.name for w in self._active.values()}) \
                if self.machine.mig else []
            names = {w.id: (w.project_name, w.name) for w in self._active.values()}
        node = node_doc(self.machine.node, held)
        compute_view.annotate_gpus(node["gpus"], self.data_dir / "compute", names)
        return merge({
            "backend": "embedded",
            "simulated": self.machine.simulated,
            "driver": self.machine.driver,
            "scheduler": self.scheduler.name,
            "isolation": self.isolation.describe(),
            "containerRuntime": self.runtime.name if self.runtime else None,
            "containerRuntimeNote": self.runtime_note if self.runtime is None else "",
            "nodes": [{**node, "migGpus": mig}],
        }, self.usage.reports())

    def _usage_shares(self) -> tuple[list[Share], dict[int, str]]:
        """The running pods' GPU shares as the usage reader joins them (tessera.local.usage):
        key ``WORKLOAD_ID-INDEX`` (its isolation directory), pod ``NAME-INDEX`` in namespace
        PROJECT; and each pod's session (its first process's pid) -> key."""
        shares: list[Share] = []
        sessions: dict[int, str] = {}
        with self._lock:
            for w in self._active.values():
                for pod in w.pods:
                    if not pod.get("holds") or pod.get("exclusive") or not pod.get("pid"):
                        continue
                    key = f"{w.id}-{pod['index']}"
                    sessions[pid_of(pod)] = key
                    shares.append(Share(
                        key=key, namespace=w.project_name, pod=f"{w.name}-{pod['index']}",
                        uid="", containers=(), workload=w.name, project=w.project_name,
                        devices=tuple(ShareDevice(u, r, lim) for u, r, lim in zip(
                            pod["uuids"], pod["requestBytes"], pod["limitBytes"], strict=True))))
        return shares, sessions

    def _region_of(self, share: Share) -> Path:
        base = self.isolation.dir if isinstance(self.isolation, isolation_hook.Library) \
            else self.data_dir / "isolation"
        return base / share.key / REGION_NAME

    # -- projects --------------------------------------------------------------------------------

    def _project_dict(self, p: Project) -> dict[str, Any]:
        with self._lock:
            allocated = sum(w.gpus_allocated for w in self._active.values() if w.project_id == p.id)
        return project_doc(p, allocated, self.scheduler.statuses.get(p.name))

    def create_project(self, fields: ProjectFields) -> dict[str, Any]:
        check_project(fields)
        with self._lock:
            if self.store.project_named(fields.name) is not None:
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
        with self._lock:  # a sweep or a scaling inference (tessera.local.workload_types)
            if (routed := self.types.route(s)) is not None:
                return routed
        s = dataclasses.replace(s, gpu=with_runai_limit(s.gpu, s.env))  # as the webhook reads it
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
        if s.command and s.working_dir is not None and not (
                Path(s.working_dir).is_absolute() and Path(s.working_dir).is_dir()):
            raise InvalidRequest("spec.workingDir", "must be an existing directory on this "
                                 "machine, as an absolute path (the command runs in it)",
                                 s.working_dir)
        fraction = self._check_mig(s) if s.mig_profile is not None else None
        try:
            check_against_cluster(s.gpu, [self.machine.node], (admitted.min_workers, s.workers))
        except InvalidRequest:
            # No shared GPU here could ever hold it; a MIG partition may (docs/mig.md).
            with self._lock:
                fraction = (self.mig.serving_fraction(s.gpu)
                            if s.workers == 1 and s.command else None)
            if fraction is None:
                raise
        with self._lock:
            project = self.store.project(s.project)
            if project is None:
                raise InvalidRequest("projectId", "no project with this id or name", s.project)
            if fraction is not None:
                estimate = check_mig_limit(
                    fraction, s.workers, project.name, project.limit,
                    "spec.compute.gpuMigProfile" if s.mig_profile else "spec.compute",
                    s.mig_profile or s.gpu.describe())
            else:
                estimate = check_limit(s.gpu, [self.machine.node], s.workers, project.name,
                                       project.limit, admitted.compute)
            if self.store.workload_by_name(project.id, s.name) is not None:
                raise Conflict(f"a workload named {s.name} already exists in project {project.name}")
            spec = dict(s.spec)
            ports = [(int(p["container"]), int(p.get("external") or p["container"]))
                     for p in s.spec.get("ports") or []]
            control = Control(
                argv=list(s.command), env=dict(s.env), ports=ports,
                service_urls=[f"http://127.0.0.1:{e}" for _, e in ports] + spec.pop("externalUrls", []),
                container=ContainerRef(runtime=self.runtime.name, path=self.runtime.path,
                                       cdi=self.runtime.cdi, image=s.image)
                if not s.command and self.runtime is not None else None,
                compute=admitted.compute.to_dict() if admitted.compute is not None else None,
                submitted_by=s.submitted_by, mig_profile=s.mig_profile)
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
                phase=Phase.PENDING,
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
                request_text=request_text(s.gpu, s.workers, s.mig_profile),
                control=control,
            )
            self.store.insert_workload(w, f"submitted to project {project.name}: {w.request_text}")
            self._active[w.id] = w
        self._wake.set()
        return self.workload_dict(w)

    def _check_mig(self, s: WorkloadSubmission) -> float:
        """A MIG request this machine can serve: its GPU fraction; else a refusal naming the
        field and what exists."""
        assert s.mig_profile is not None
        with self._lock:
            return self.mig.check(s.mig_profile, s.workers)

    def _get(self, workload_id: str, kind: str | None) -> Workload:
        with self._lock:
            w = self._active.get(workload_id) or self.store.workload(workload_id)
        if w is None or (kind is not None and w.type != kind):
            raise NotFound(f"workload {workload_id} not found")
        return w

    def workloads_json(self, query: WorkloadQuery) -> tuple[str, int]:
        return self.store.list_json(query, self.machine.simulated)

    def metrics_collectors(self) -> list[Any]:
        """Collectors /metrics adds for this backend: the GPU time the compute arbiters charged
        each workload (tessera.local.compute_metrics)."""
        from tessera.local.compute_metrics import ComputeCollector

        return [ComputeCollector(self.data_dir / "compute")]

    def workload(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        w = self._get(workload_id, kind)
        out = {**self.workload_dict(w), **self.types.describe(w.id)}  # + a replica's service
        if w.control.compute:
            from tessera.local.compute_view import compute_view

            out["computeShare"] = compute_view(self.data_dir / "compute", w.id, w.control.compute)
        out["events"] = [
            {"time": iso(e.time), "kind": e.kind, "message": e.message}
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
            if active.phase == Phase.PENDING:
                self.store.delete_workload(w.id)  # first: a full disk changes nothing
                self._active.pop(w.id, None)
                self._wake.set()
                return
            self.processes.begin_stop(active, "Deleted", "deleted by user")

    def suspend(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        with self._lock:
            w = self._get(workload_id, kind)
            active = self._active.get(w.id)
            if active is None or active.phase in (Phase.STOPPING, Phase.DELETING):
                raise Conflict(f"workload {w.name} is {w.phase}; only Pending or Running suspend")
            if active.phase == Phase.PENDING:
                with all_or_nothing(active, self._active):
                    active.phase, active.phase_message = Phase.STOPPED, "suspended by user"
                    self._active.pop(w.id, None)
                    self.store.save(active, ("Stopped", "suspended by user"))
            else:
                self.processes.begin_stop(active, "Stopped", "suspended by user")
            return self.workload_dict(active)

    def resume(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        with self._lock:
            w = self._get(workload_id, kind)
            if w.phase != Phase.STOPPED:
                raise Conflict(f"workload {w.name} is {w.phase}; only Stopped workloads resume")
            with all_or_nothing(w, self._active):
                w.phase, w.phase_message, w.pods = Phase.PENDING, "resumed by user", []
                w.control.pending_since = time.time()  # the wait is timed from here (metrics)
                w.completed = None
                w.exit_code = None
                self._active[w.id] = w
                self.store.save(w, ("Resumed", "resumed by user"))
        self._wake.set()
        return self.workload_dict(w)

    def logs(self, workload_id: str, pod: int, offset: int) -> tuple[bytes, int]:
        return self.processes.log(self._get(workload_id, None), pod, offset)

    def pods(self, workload_id: str) -> list[dict[str, Any]]:
        w = self._get(workload_id, None)
        return [pod_doc(p) for p in w.pods]

    def exec_command(self, workload_id: str, pod: int, command: list[str],
                     timeout: float) -> dict[str, Any]:
        """COMMAND with the pod's environment, on this machine (the API's exec; the CLI on the
        server's machine runs it itself, attached to the terminal)."""
        return self.processes.exec(self._get(workload_id, None), pod, command, timeout)

    def workload_dict(self, w: Workload, brief: bool = False) -> dict[str, Any]:
        return self.types.elastic.document(w, workload_doc(
            w, self.machine.simulated, self.isolation.describe(), self.scheduler.name, brief))
