"""Embedded mode's record types: a workload's phase, a pod's phase, the pod record the store
keeps for each of a workload's pods (``Workload.pods``, one JSON object each in the store), and
the control record: the loop's own state of a workload, kept beside the user's spec, never in it
(``Workload.control``, the ``control`` column).

The phases are ``StrEnum``s: stored, sent and compared as the words the API documents
(``"Running"``), typed in the code.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, TypedDict


class Phase(enum.StrEnum):
    """A workload's phase (docs/api.md)."""

    PENDING = "Pending"
    RUNNING = "Running"
    STOPPING = "Stopping"
    DELETING = "Deleting"
    STOPPED = "Stopped"
    COMPLETED = "Completed"
    FAILED = "Failed"


ACTIVE_PHASES = (Phase.PENDING, Phase.RUNNING, Phase.STOPPING, Phase.DELETING)
"""Phases in which a workload is still the control loop's (not finished)."""
HOLDING_PHASES = (Phase.RUNNING, Phase.STOPPING, Phase.DELETING)
"""Phases in which a workload's pods may hold GPUs."""


class PodPhase(enum.StrEnum):
    """One pod's phase."""

    STARTING = "Starting"
    """Its start is stored as intent; the process may not run yet (tessera.local.pods)."""
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"
    STOPPING = "Stopping"
    """Being stopped while its workload runs on: an elastic workload shrunk
    (tessera.local.elastic); it holds its GPUs until its process group is gone."""


LIVE = (PodPhase.RUNNING, PodPhase.STOPPING)
"""Pod phases in which its process may run."""


class PodRecord(TypedDict, total=False):
    """One pod of a workload, as ``tessera.local.pods`` starts it and the store keeps it."""

    index: int
    phase: PodPhase
    node: str
    devices: list[int]
    uuids: list[str]
    requestBytes: list[int]
    limitBytes: list[int]
    exclusive: bool
    compute: int
    """Its compute request on each of its GPUs (tessera.core.compute), when it has one."""
    holds: bool
    """Whether it holds its GPUs (False once it stopped)."""
    pid: int | None
    startTicks: int
    log: str
    exitFile: str
    exitCode: int | None
    env: dict[str, str]
    mig: dict[str, Any]
    """The MIG partition it runs on (tessera.local.mig), if any."""
    argv: list[str]
    hostEnv: dict[str, str]
    cwd: str | None
    """argv, hostEnv, cwd: only between the stored intent and the launch."""


def pid_of(pod: PodRecord) -> int:
    """A launched pod's process group leader (a pod whose start is only stored has none)."""
    pid = pod.get("pid")
    if pid is None:
        raise ValueError(f"pod {pod.get('index')} has no process yet")
    return pid


class ContainerRef(TypedDict):
    """The runtime that runs an image's pods (tessera.local.containers), chosen at submit."""

    runtime: str
    path: str
    cdi: bool
    image: str


@dataclass
class Control:
    """What the control loop keeps of a workload besides the user's spec: the command and
    environment it resolved at submit, its start in progress, its MIG partition. Stored as one
    JSON object in the ``control`` column; before schema 2 these were ``_``-keys of the spec
    (``LEGACY_KEYS``; tessera.local.store_schema moves them out)."""

    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    container: ContainerRef | None = None
    """Set for an image run through podman or docker (no command)."""
    ports: list[tuple[int, int]] = field(default_factory=list)
    """(container port, port on this machine) for each of ``spec.ports``."""
    service_urls: list[str] = field(default_factory=list)
    compute: dict[str, object] | None = None
    """Its compute share (``tessera.core.compute.ComputeShare.to_dict``), when it has one."""
    submitted_by: str = ""
    """Who submitted it (``user:alice``): GPU accounting (tessera.local.accounting)."""
    mig_profile: str | None = None
    """The MIG profile it asked for (``spec.compute.gpuMigProfile``)."""
    mig_device: dict[str, Any] | None = None
    """The MIG partition it runs on (tessera.local.mig), also for a share MIG serves."""
    starting: str | None = None
    """The start attempt whose intent is stored (tessera.local.pods), until it is confirmed."""
    unsaved: list[str] | None = None
    """A confirmed start's event the store could not take yet (a full disk)."""
    master_port: int = 0
    """torchrun's rendezvous port, one per start."""
    pending_since: float | None = None
    """When its current wait began (requeued after an eviction), else its creation."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Control:
        c = cls(**{k: v for k, v in doc.items() if v is not None})  # null: the default
        c.ports = [(int(a), int(b)) for a, b in c.ports]
        return c


LEGACY_KEYS: dict[str, str] = {
    "_argv": "argv", "_env": "env", "_container": "container", "_ports": "ports",
    "_serviceUrls": "service_urls", "_compute": "compute", "_submittedBy": "submitted_by",
    "_mig": "mig_profile", "_migDevice": "mig_device", "_starting": "starting",
    "_unsaved": "unsaved", "_masterPort": "master_port", "_pendingSince": "pending_since",
}
"""The spec keys that held ``Control``'s fields before schema 2 -> the field."""
