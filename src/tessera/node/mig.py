"""MIG partitions on this machine's GPUs, through NVML: what exists, creating one, removing one.

A partition is a GPU instance (a profile at a placement) with one compute instance spanning it;
its MIG device UUID (``MIG-…``) is what a workload is given (``NVIDIA_VISIBLE_DEVICES``).
Partitions are created only on a GPU already in MIG mode and removed only when told (the
scheduler removes an idle one lazily, when it needs the room); MIG mode itself is an operator's
choice that needs a GPU reset, so nothing here changes it.

Every create and destroy is written to a journal on disk before NVML is called and again after,
so a process killed in between is repaired on the next start (:meth:`MigNode.reconcile`): a
create whose GPU instance exists is adopted as an idle partition (never created twice), one whose
GPU instance does not exist is dropped, an interrupted destroy is finished. Partitions NVML lists
that the journal never recorded were made by someone else (an operator): they are reported,
never used or removed. An NVML error on a create undoes what was made (the GPU instance when the
compute instance fails) and comes back as :class:`MigError`, one line naming the call and NVML's
error, for the workload's reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tessera.node.nvml import Nvml

JOURNAL_VERSION = 1
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
"""NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE."""


class MigError(RuntimeError):
    """A partition could not be made or removed; the message is one line for the workload."""


@dataclass(frozen=True)
class MigProfileInfo:
    name: str
    """``3g.20gb``: NVML's profile name without ``MIG ``."""
    profile_id: int
    compute: int
    memory_mib: int
    instances: int
    placements: tuple[tuple[int, int], ...]
    """(start, size) in memory slots, as NVML lists them."""


@dataclass(frozen=True)
class MigPartition:
    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    size: int
    gi: int
    ci: int | None
    """None: a GPU instance without a compute instance (not usable by a workload)."""
    uuid: str | None
    """The MIG device's ``MIG-…`` UUID."""
    managed: bool
    """Created by tessera (in the journal); only these are used and removed."""
    owner: str | None = None
    """The workload holding it (managed partitions)."""
    processes: int = 0

    @property
    def busy(self) -> bool:
        return self.owner is not None or self.processes > 0 or not self.managed


@dataclass(frozen=True)
class MigGpuState:
    uuid: str
    index: int
    model: str
    mig_enabled: bool | None
    """None: the GPU has no MIG (NVML: not supported)."""
    profiles: tuple[MigProfileInfo, ...] = ()
    partitions: tuple[MigPartition, ...] = field(default_factory=tuple)


def _fault(name: str) -> None:
    """``TESSERA_FAULT_POINT=NAME``: die here by SIGKILL (the crash tests' chosen points, as
    tessera.local.faultpoints does for the server)."""
    if os.environ.get("TESSERA_FAULT_POINT", "") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Journal:
    """The partitions tessera made and the operations under way, in one JSON file replaced
    atomically (write, fsync, rename) at every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partitions: list[dict[str, Any]] = []
        self.intents: list[dict[str, Any]] = []
        if path.exists():
            doc = json.loads(path.read_text())
            if doc.get("version") != JOURNAL_VERSION:
                raise MigError(f"MIG journal {path}: version {doc.get('version')!r}, "
                               f"expected {JOURNAL_VERSION}")
            self.partitions = list(doc.get("partitions", []))
            self.intents = list(doc.get("intents", []))

    def save(self) -> None:
        doc = {"version": JOURNAL_VERSION, "partitions": self.partitions, "intents": self.intents}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".mig-journal.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def find(self, gpu: str, gi: int) -> dict[str, Any] | None:
        return next((p for p in self.partitions if p["gpu"] == gpu and p["gi"] == gi), None)


class MigNode:
    """MIG on this machine: one NVML session and the journal (use from one thread)."""

    def __init__(self, nvml: Nvml, journal_path: Path) -> None:
        self.nvml = nvml
        self.journal = Journal(journal_path)
        inventory = nvml.inventory()
        self._gpus = {g.uuid: g for g in inventory.gpus}

    # -- reading ---------------------------------------------------------------------------------

    def _mode(self, h: Any) -> bool | None:
        nv = self.nvml.lib
        try:
            return bool(nv.nvmlDeviceGetMigMode(h)[0])
        except nv.NVMLError:
            return None  # NOT_SUPPORTED: a GPU without MIG

    def _profiles(self, h: Any) -> list[tuple[MigProfileInfo, int]]:
        """(profile, NVML_GPU_INSTANCE_PROFILE_* index) of a GPU in MIG mode."""
        nv = self.nvml.lib
        out: list[tuple[MigProfileInfo, int]] = []
        for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except nv.NVMLError:
                continue
            count = ctypes.c_uint(0)
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
            arr = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
            out.append((MigProfileInfo(
                name=_text(info.name).removeprefix("MIG "), profile_id=int(info.id),
                compute=int(info.sliceCount), memory_mib=int(info.memorySizeMB),
                instances=int(info.instanceCount),
                placements=tuple((int(arr[i].start), int(arr[i].size)) for i in range(count.value))),
                index))
        return out

    def _gpu_instances(self, h: Any, profiles: list[tuple[MigProfileInfo, int]]) -> list[Any]:
        """(profile, gi id, start, size, handle) of every GPU instance on the GPU."""
        nv = self.nvml.lib
        out = []
        for prof, _ in profiles:
            buf = (nv.c_nvmlGpuInstance_t * max(prof.instances, 1))()
            count = ctypes.c_uint(0)
            nv.nvmlDeviceGetGpuInstances(h, prof.profile_id, buf, ctypes.byref(count))
            for i in range(count.value):
                info = nv.nvmlGpuInstanceGetInfo(buf[i])
                out.append((prof, int(info.id), int(info.placement.start),
                            int(info.placement.size), buf[i]))
        return out

    def _mig_devices(self, h: Any) -> dict[int, tuple[int, str, int]]:
        """GPU instance id -> (compute instance id, MIG UUID, processes) of its MIG device."""
        nv = self.nvml.lib
        out: dict[int, tuple[int, str, int]] = {}
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nv.NVMLError_NotFound:
                continue
            procs = nv.nvmlDeviceGetComputeRunningProcesses(m)
            out.setdefault(int(nv.nvmlDeviceGetGpuInstanceId(m)),
                           (int(nv.nvmlDeviceGetComputeInstanceId(m)), _text(nv.nvmlDeviceGetUUID(m)),
                            len(procs)))
        return out

    def state(self) -> list[MigGpuState]:
        """Every GPU: its MIG mode, its profiles and the partitions on it now."""
        out: list[MigGpuState] = []
        for g in self._gpus.values():
            h = self.nvml.handle(g.index)
            mode = self._mode(h)
            if not mode:
                out.append(MigGpuState(g.uuid, g.index, g.model, mode))
                continue
            profiles = self._profiles(h)
            devices = self._mig_devices(h)
            parts = []
            for prof, gi, start, size, _ in self._gpu_instances(h, profiles):
                ci, uuid, procs = devices.get(gi, (None, None, 0))
                rec = self.journal.find(g.uuid, gi)
                parts.append(MigPartition(
                    gpu_uuid=g.uuid, gpu_index=g.index, profile=prof.name, start=start, size=size,
                    gi=gi, ci=ci, uuid=uuid, managed=rec is not None,
                    owner=rec.get("owner") if rec else None, processes=procs))
            out.append(MigGpuState(g.uuid, g.index, g.model, True,
                                   tuple(p for p, _ in profiles),
                                   tuple(sorted(parts, key=lambda p: p.start))))
        return out

    def gpu_state(self, gpu_uuid: str) -> MigGpuState:
        for s in self.state():
            if s.uuid == gpu_uuid:
                return s
        raise MigError(f"no GPU {gpu_uuid} on this machine")

    # -- changing --------------------------------------------------------------------------------

    def _nvml_error(self, call: str, exc: Exception) -> str:
        return f"{call}: NVML error: {exc}"

    def create(self, gpu_uuid: str, profile: str, start: int, owner: str | None = None) -> MigPartition:
        """A partition of ``profile`` at memory slot ``start`` (GPU instance + a compute instance
        over all of it), recorded for ``owner``; MigError with nothing left behind on failure."""
        nv = self.nvml.lib
        state = self.gpu_state(gpu_uuid)
        where = f"GPU {state.index} ({gpu_uuid})"
        if state.mig_enabled is None:
            raise MigError(f"{where} ({state.model}) has no MIG")
        if not state.mig_enabled:
            raise MigError(f"{where} is not in MIG mode (MIG mode is the operator's choice; "
                           "tessera never switches it)")
        prof = next((p for p in state.profiles if p.name == profile), None)
        if prof is None:
            raise MigError(f"{where} ({state.model}) has no MIG profile {profile} (it has "
                           f"{', '.join(p.name for p in state.profiles)})")
        size = next((sz for s, sz in prof.placements if s == start), None)
        if size is None:
            raise MigError(f"{profile} cannot start at memory slot {start} on {where} (it starts "
                           f"at {', '.join(str(s) for s, _ in prof.placements)})")
        h = self.nvml.handle(state.index)
        intent = {"op": "create", "gpu": gpu_uuid, "profile": profile, "start": start,
                  "owner": owner, "before": sorted(p.gi for p in state.partitions)}
        self.journal.intents.append(intent)
        self.journal.save()
        _fault("mig-create-intent")
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        try:
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, prof.profile_id,
                                                             ctypes.byref(placement))
        except nv.NVMLError as exc:
            self._drop(intent)
            raise MigError(self._nvml_error(
                f"creating {profile} at memory slot {start} on {where}", exc)) from None
        _fault("mig-create-gi")
        try:
            ci_index = next(i for i, s in _CI_SLICES.items() if s == prof.compute)
            ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_index, 0)
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
        except (nv.NVMLError, StopIteration) as exc:
            reason = self._nvml_error(f"creating the compute instance of {profile} on {where}", exc)
            try:
                nv.nvmlGpuInstanceDestroy(gi)  # nothing half-made is left
            except nv.NVMLError as undo:
                # The intent stays: the next reconcile finishes or removes the GPU instance.
                raise MigError(f"{reason}; removing its GPU instance failed too ({undo})") from None
            self._drop(intent)
            raise MigError(reason) from None
        gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
        made = self._find(gpu_uuid, gi_id)
        self.journal.intents.remove(intent)
        self.journal.partitions.append({"gpu": gpu_uuid, "gi": gi_id, "profile": profile,
                                        "start": start, "uuid": made.uuid, "owner": owner})
        self.journal.save()
        return self._find(gpu_uuid, gi_id)

    def _drop(self, intent: dict[str, Any]) -> None:
        if intent in self.journal.intents:
            self.journal.intents.remove(intent)
            self.journal.save()

    def _find(self, gpu_uuid: str, gi: int) -> MigPartition:
        for p in self.gpu_state(gpu_uuid).partitions:
            if p.gi == gi:
                return p
        raise MigError(f"no GPU instance {gi} on {gpu_uuid}")

    def assign(self, gpu_uuid: str, gi: int, owner: str | None) -> None:
        """Records who holds a managed partition (None: idle, kept until its room is needed)."""
        rec = self.journal.find(gpu_uuid, gi)
        if rec is None:
            raise MigError(f"GPU instance {gi} on {gpu_uuid} was not made by tessera")
        if rec.get("owner") != owner:
            rec["owner"] = owner
            self.journal.save()

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        """Removes an idle partition tessera made: never one another made, one held by a
        workload or one with processes (NVML says in use)."""
        nv = self.nvml.lib
        rec = self.journal.find(gpu_uuid, gi)
        if rec is None:
            raise MigError(f"GPU instance {gi} on {gpu_uuid} was not made by tessera; "
                           "it is left alone")
        if rec.get("owner"):
            raise MigError(f"the {rec['profile']} partition on {gpu_uuid} is held by "
                           f"{rec['owner']}")
        intent = {"op": "destroy", "gpu": gpu_uuid, "gi": gi}
        self.journal.intents.append(intent)
        self.journal.save()
        _fault("mig-destroy-intent")
        try:
            self._destroy_instances(gpu_uuid, gi)
        except nv.NVMLError as exc:
            self._drop(intent)
            raise MigError(self._nvml_error(
                f"removing the {rec['profile']} partition on {gpu_uuid}", exc)) from None
        self.journal.intents.remove(intent)
        self.journal.partitions.remove(rec)
        self.journal.save()

    def _destroy_instances(self, gpu_uuid: str, gi: int) -> bool:
        """Destroys the compute instances and the GPU instance; False when it does not exist."""
        nv = self.nvml.lib
        h = self.nvml.handle(self._gpus[gpu_uuid].index)
        try:
            handle = nv.nvmlDeviceGetGpuInstanceById(h, gi)
        except nv.NVMLError_NotFound:
            return False
        for index in _CI_SLICES:
            buf = (nv.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            try:
                nv.nvmlGpuInstanceGetComputeInstances(handle, index, buf, ctypes.byref(count))
            except nv.NVMLError_NotSupported:
                continue
            for i in range(count.value):
                nv.nvmlComputeInstanceDestroy(buf[i])
        nv.nvmlGpuInstanceDestroy(handle)
        return True

    def reconcile(self) -> list[str]:
        """Repairs what a process killed mid-operation left (see the module's docstring);
        returns a line per repair."""
        nv = self.nvml.lib
        done: list[str] = []
        for intent in list(self.journal.intents):
            gpu = intent["gpu"]
            if gpu not in self._gpus:
                done.append(f"dropped a {intent['op']} on {gpu}: no such GPU here now")
            elif intent["op"] == "create":
                done.append(self._finish_create(intent))
            else:
                rec = self.journal.find(gpu, intent["gi"])
                try:
                    existed = self._destroy_instances(gpu, intent["gi"])
                except nv.NVMLError as exc:
                    done.append(f"kept GPU instance {intent['gi']} on {gpu}: removing it failed "
                                f"({exc})")
                else:
                    if rec is not None:
                        self.journal.partitions.remove(rec)
                    done.append(f"finished removing GPU instance {intent['gi']} on {gpu}"
                                if existed else f"GPU instance {intent['gi']} on {gpu} was gone")
            self.journal.intents.remove(intent)
        live = {(s.uuid, p.gi) for s in self.state() for p in s.partitions}
        for rec in list(self.journal.partitions):
            if (rec["gpu"], rec["gi"]) not in live:
                self.journal.partitions.remove(rec)
                done.append(f"forgot the {rec['profile']} partition on {rec['gpu']}: NVML no "
                            "longer lists it")
        self.journal.save()
        return done

    def _finish_create(self, intent: dict[str, Any]) -> str:
        nv = self.nvml.lib
        gpu = intent["gpu"]
        made = [p for p in self.gpu_state(gpu).partitions
                if p.gi not in intent["before"] and p.profile == intent["profile"]
                and p.start == intent["start"] and self.journal.find(gpu, p.gi) is None]
        if not made:
            return (f"dropped the create of {intent['profile']} at slot {intent['start']} on "
                    f"{gpu}: it never happened")
        p = made[0]
        if p.ci is None:
            h = self.nvml.handle(self._gpus[gpu].index)
            gi = nv.nvmlDeviceGetGpuInstanceById(h, p.gi)
            compute = next(x.compute for x in self.gpu_state(gpu).profiles if x.name == p.profile)
            ci_index = next(i for i, s in _CI_SLICES.items() if s == compute)
            try:
                nv.nvmlGpuInstanceCreateComputeInstance(
                    gi, nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_index, 0).id)
            except nv.NVMLError as exc:
                nv.nvmlGpuInstanceDestroy(gi)
                return (f"removed the half-made {p.profile} partition on {gpu}: its compute "
                        f"instance failed ({exc})")
            p = self._find(gpu, p.gi)
        self.journal.partitions.append({"gpu": gpu, "gi": p.gi, "profile": p.profile,
                                        "start": p.start, "uuid": p.uuid, "owner": None})
        return f"adopted the {p.profile} partition {p.uuid} on {gpu} (idle)"


def state_doc(states: list[MigGpuState]) -> list[dict[str, Any]]:
    """The JSON of ``tessera-node mig --json``."""
    return [asdict(s) for s in states]


