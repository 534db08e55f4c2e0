"""One picture of the node's GPUs at an instant: NVML's usage, the shares, what the library charged.

Built by :func:`snapshot` from NVML (:class:`tessera.node.nvml.GpuUsage`), the shares the agent
knows (:class:`tessera.node.containers.Share`) and each share's accounting region
(:func:`tessera.isolation.region.read_region`). Metrics, escape detection and the reclaimer all
read this one picture, so they agree with each other.

Process to share: a GPU process's host pid is matched to a share by the pod UID in its cgroup
(``/proc/PID/cgroup``, Kubernetes' ``pod<uid>`` path element); its pid inside the container
(last ``NSpid`` entry of ``/proc/PID/status``) must also hold a slot in that share's region.
Without a pod UID in the cgroup (embedded mode, tests) the pid itself is looked up in the
regions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessera.isolation.region import DeviceUsage, RegionFormatError, read_region
from tessera.node.containers import Share
from tessera.node.nvml import GpuUsage

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class ProcessView:
    pid: int
    """Host pid, as NVML reports it."""
    gpu_uuid: str
    nvml_bytes: int
    sm_util: int | None
    share_key: str | None
    """The share it belongs to, or None."""
    charged_bytes: int = 0
    """What the library charged this process on this GPU (0 without a share)."""
    in_region: bool = False
    """Whether the share's region has an entry for this process on this GPU (the library
    loaded in it and accounts for it)."""


@dataclass(frozen=True)
class ShareDeviceView:
    share: Share
    gpu_uuid: str
    request_bytes: int
    limit_bytes: int
    charged_bytes: int
    nvml_bytes: int
    sm_util: int | None

    @property
    def loaned_bytes(self) -> int:
        return max(0, self.charged_bytes - self.request_bytes)


@dataclass(frozen=True)
class NodeUsage:
    gpus: tuple[GpuUsage, ...]
    models: Mapping[str, str]
    """uuid -> model."""
    shares: tuple[ShareDeviceView, ...]
    processes: tuple[ProcessView, ...]
    errors: tuple[str, ...] = field(default_factory=tuple)

    def requested(self, uuid: str) -> int:
        return sum(s.request_bytes for s in self.shares if s.gpu_uuid == uuid)

    def shared_gpus(self) -> set[str]:
        return {s.gpu_uuid for s in self.shares}


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def pod_uid_of(pid: int, read: Callable[[str], str] = _read_text) -> str | None:
    m = _POD_UID.search(read(f"/proc/{pid}/cgroup"))
    return m.group(1).replace("_", "-") if m else None


def ns_pid_of(pid: int, read: Callable[[str], str] = _read_text) -> int:
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            if parts:
                return int(parts[-1])
    return pid


def snapshot(gpus: Sequence[GpuUsage], models: Mapping[str, str], shares: Sequence[Share],
             region_of: Callable[[Share], Path], *,
             read: Callable[[str], str] = _read_text,
             owner_of: Callable[[int], str | None] | None = None) -> NodeUsage:
    """``owner_of``: the share key of a host pid neither its cgroup nor a region names (embedded
    mode: the pod's session, so a workload's processes are counted without the isolation
    library too)."""
    errors: list[str] = []
    regions: dict[str, dict[str, DeviceUsage]] = {}
    for share in shares:
        try:
            regions[share.key] = read_region(region_of(share))
        except (OSError, RegionFormatError) as exc:
            errors.append(f"{share.namespace}/{share.pod}: region unreadable: {exc}")
            regions[share.key] = {}
    by_uid = {s.uid: s for s in shares if s.uid}
    owners: dict[int, list[str]] = {}
    for share in shares:
        for dev in regions[share.key].values():
            for pid in dev.processes:
                owners.setdefault(pid, []).append(share.key)

    processes: list[ProcessView] = []
    for g in gpus:
        for p in g.processes:
            key: str | None = None
            uid = pod_uid_of(p.pid, read)
            inner = ns_pid_of(p.pid, read)
            if uid is not None:
                owner = by_uid.get(uid)
                key = owner.key if owner is not None else None
            elif owners.get(p.pid):
                key = owners[p.pid][0]
            elif owner_of is not None:
                key = owner_of(p.pid)
            charged, accounted = 0, False
            if key is not None:
                region_dev = regions.get(key, {}).get(g.uuid)
                if region_dev is not None:
                    inner_pid = inner if uid is not None else p.pid
                    charged = region_dev.processes.get(inner_pid, 0)
                    accounted = inner_pid in region_dev.processes
            processes.append(ProcessView(pid=p.pid, gpu_uuid=g.uuid, nvml_bytes=p.used_bytes,
                                         sm_util=p.sm_util, share_key=key, charged_bytes=charged,
                                         in_region=accounted))

    views: list[ShareDeviceView] = []
    for share in shares:
        for d in share.devices:
            got = regions[share.key].get(d.uuid)
            mine = [p for p in processes if p.share_key == share.key and p.gpu_uuid == d.uuid]
            utils = [p.sm_util for p in mine if p.sm_util is not None]
            views.append(ShareDeviceView(
                share=share, gpu_uuid=d.uuid, request_bytes=d.request_bytes,
                limit_bytes=d.limit_bytes, charged_bytes=got.used_bytes if got else 0,
                nvml_bytes=sum(p.nvml_bytes for p in mine),
                sm_util=min(100, sum(utils)) if utils else None))
    return NodeUsage(gpus=tuple(gpus), models=dict(models), shares=tuple(views),
                     processes=tuple(processes), errors=tuple(errors))
