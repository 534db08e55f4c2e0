"""Embedded mode's record types: a workload's phase, a pod's phase, and the pod record the store
keeps for each of a workload's pods (``Workload.pods``, one JSON object each in the store).

The phases are ``StrEnum``s: stored, sent and compared as the words the API documents
(``"Running"``), typed in the code.
"""

from __future__ import annotations

import enum
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
