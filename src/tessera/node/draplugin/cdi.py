"""What a prepared claim gives its containers: one CDI spec per claim, and the claim's isolation
files on the host (the same config and region the annotation path's per-container files are).

    CDI_DIR/gpu.tessera.io-UID.json               kind gpu.tessera.io/claim, one device per GPU
    CLAIMS_DIR/UID/conf/gpu-isolation.conf        0644, mounted read-only at /etc/tessera
    CLAIMS_DIR/UID/region/gpu-usage.region        0660 in the pods' group, mounted at /run/tessera

The spec's claim-wide edits (applied once whichever of its devices a container gets) carry
what concerns the claim as a whole: ``NVIDIA_VISIBLE_DEVICES`` with every GPU of the claim in
the order of its results, the isolation library (mounted read-only, ``LD_PRELOAD`` and
``/etc/ld.so.preload``), the config (``TESSERA_GPU_CONFIG``), the region and the node's loans
ledger. Each device's own edits carry its limit (``TESSERA_GPU_MEMORY_LIMIT_I``, I its visible
index), the library's fallback when the config cannot be read. The limit is the memory the
claim consumed on that GPU (its request and its limit: a claim is guaranteed what it consumed).

One claim's files serve every pod that shares the claim (one region: what they allocate
together is held to what the claim consumed). The region's group is the one the pods the claim
is reserved for state (:func:`tessera.core.podgroups.share_group`); when they state none or
disagree, the region is root's alone, as in the annotation path. The loans line's priority is
their priority class's when they agree on one, else the default class's (``train``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tessera import wire
from tessera.core.errors import InvalidRequest
from tessera.core.podgroups import share_group
from tessera.core.units import parse_memory
from tessera.core.workloads import PRIORITY_CLASSES
from tessera.isolation.config import (
    CONFIG_ENV,
    CONFIG_NAME,
    DEFAULT_WAIT_MS,
    LIMIT_ENV,
    REGION_NAME,
    DeviceShare,
    LoansConfig,
    render_config,
)
from tessera.isolation.library import LIBRARY_NAME
from tessera.node.containers import REGION_DIR_MODE, REGION_FILE_MODE
from tessera.node.install import PRELOAD_NAME
from tessera.node.resourceslice import parse_mig_device

DRIVER = "gpu.tessera.io"
CDI_KIND = "gpu.tessera.io/claim"
CDI_VERSION = "0.6.0"
CONTAINER_CONFIG_DIR = "/etc/tessera"
CONTAINER_REGION_DIR = "/run/tessera"
CONTAINER_LOANS_DIR = "/run/tessera-loans"
PRELOAD_PATH = "/etc/ld.so.preload"


class MigClaims(Protocol):
    """The node's MIG partitions as claims use them (:class:`tessera.node.kube_mig.KubeMig`)."""

    def prepare_claim(self, claim_uid: str, gpu: str, profile: str, start: int) -> Any:
        """The partition (``.uuid``: ``MIG-…``); raises naming the step on failure."""

    def release_claim(self, claim_uid: str) -> int: ...


@dataclass(frozen=True)
class PluginConfig:
    """What the plugin needs of the node; tessera-node builds one per call from its state."""

    node: str
    uuids: Mapping[int, str]
    """GPU index -> UUID on this node (NVML)."""
    cdi_dir: Path
    library_dir: Path
    """Host directory of the isolation library (tessera-node installs it)."""
    library_mount: str = "/usr/local/tessera"
    library_name: str = LIBRARY_NAME
    """The file tessera-node installs there (a symlink to the current build, tessera.node.install)."""
    claims_dir: Path | None = None
    """Where the claims' config and region are written (this process's view); None: the spec
    carries the limits in the environment only (no config file, no region, no loans)."""
    claims_host_dir: Path | None = None
    """``claims_dir`` as the host names it (the CDI mounts); default ``claims_dir``."""
    loans_host_dir: Path | None = None
    """The node's loans ledger directory on the host; None: loans are not accounted."""
    headroom: Mapping[str, int] = field(default_factory=dict)
    """GPU UUID -> bytes kept back on it (the library charges that per CUDA context)."""
    not_ready: str = ""
    """Why this node cannot enforce a share now (empty: it can); prepare refuses meanwhile."""
    mig: MigClaims | None = None
    """This node's MIG partitions (None: no GPU here is in MIG mode, or MIG is unavailable)."""
    memory: Mapping[str, int] = field(default_factory=dict)
    """GPU UUID -> its memory (NVML): the limit of a whole GPU allocated without consumable
    capacity (an API server without DRAConsumableCapacity gives it to one claim alone)."""


@dataclass(frozen=True)
class ClaimDevice:
    request: str
    name: str
    """The slice's device name, ``gpu-I``."""
    uuid: str
    limit_bytes: int
    share_id: str


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    results = [r for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                           or {}).get("results") or [] if r.get("driver") == DRIVER]
    if not results:
        raise InvalidRequest("status.allocation", f"has no {DRIVER} device: not allocated")
    requests = {str(r.get("request", "")) for r in results}
    if len(requests) > 1:
        # Claim-wide edits would give a container that names one request every GPU.
        raise InvalidRequest("status.allocation.devices.results.request",
                             f"names {len(requests)} {DRIVER} requests ({', '.join(sorted(requests))});"
                             " one request per claim is supported")
    return results


def is_mig_claim(claim: Mapping[str, Any]) -> bool:
    """Whether the claim's allocation names MIG partitions (``gpu-I-mig-…`` devices)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
               or {}).get("results") or []
    return any(r.get("driver") == DRIVER and parse_mig_device(str(r.get("device", "")))
               for r in results)


@dataclass(frozen=True)
class MigDevice:
    request: str
    name: str
    """The slice's device name, ``gpu-I-mig-3g20gb-4``."""
    gpu: str
    """The parent GPU's UUID."""
    index: int
    profile: str
    start: int


def mig_devices(claim: Mapping[str, Any], cfg: PluginConfig) -> list[MigDevice]:
    """The claim's MIG partitions on this node; InvalidRequest naming what is wrong."""
    out = []
    for r in _results(claim):
        name = str(r.get("device", ""))
        parsed = parse_mig_device(name)
        if parsed is None:
            raise InvalidRequest("status.allocation.devices.results.device",
                                 f"names {name!r} beside MIG partitions; a claim holds MIG "
                                 "partitions or GPUs, not both")
        if r.get("pool") != cfg.node:
            raise InvalidRequest("status.allocation.devices.results.pool",
                                 f"is {r.get('pool')!r}, not this node {cfg.node!r}")
        index, profile, start = parsed
        if index not in cfg.uuids:
            raise InvalidRequest("status.allocation.devices.results.device",
                                 f"names {name!r}, on GPU {index}, which NVML on {cfg.node} "
                                 "does not list")
        out.append(MigDevice(str(r.get("request", "")), name, cfg.uuids[index], index, profile,
                             start))
    if len({(d.index, d.start) for d in out}) != len(out):
        raise InvalidRequest("status.allocation.devices.results.device",
                             "names one placement twice in one claim")
    return out


def mig_cdi_spec(uid: str, devices: list[MigDevice], uuids: list[str]) -> dict[str, Any]:
    """A MIG claim's spec: the partitions' ``MIG-…`` UUIDs as ``NVIDIA_VISIBLE_DEVICES`` (the
    NVIDIA container runtime's way; MIG isolates in hardware, so no isolation library)."""
    return {
        "cdiVersion": CDI_VERSION, "kind": CDI_KIND,
        "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]},
        "devices": [{"name": f"{uid}-{d.name}", "containerEdits": {"env": [
            f"TESSERA_MIG_UUID_{i}={u}", f"TESSERA_MIG_PROFILE_{i}={d.profile}"]}}
            for i, (d, u) in enumerate(zip(devices, uuids, strict=True))],
    }


def claim_devices(claim: Mapping[str, Any], cfg: PluginConfig) -> list[ClaimDevice]:
    """The claim's gpu.tessera.io devices on this node; InvalidRequest naming what is wrong."""
    results = _results(claim)
    out = []
    for r in results:
        if r.get("pool") != cfg.node:
            raise InvalidRequest("status.allocation.devices.results.pool",
                                 f"is {r.get('pool')!r}, not this node {cfg.node!r}")
        name = str(r.get("device", ""))
        index = int(name[4:]) if name.startswith("gpu-") and name[4:].isdigit() else -1
        if index not in cfg.uuids:
            raise InvalidRequest("status.allocation.devices.results.device",
                                 f"names {name!r}, which NVML on {cfg.node} does not list")
        consumed = (r.get("consumedCapacity") or {}).get("memory")
        whole = cfg.memory.get(cfg.uuids[index])
        if consumed is None and (r.get("shareID") or not whole):
            raise InvalidRequest("status.allocation.devices.results.consumedCapacity.memory",
                                 "is missing: no limit to enforce (fails closed)")
        # no consumedCapacity and no shareID: the API server runs without DRAConsumableCapacity
        # and allocated the whole GPU to this claim alone; its limit is the whole memory
        limit = (parse_memory(consumed, "consumedCapacity.memory")  # refuses 0 and below
                 if consumed is not None else int(whole or 0))
        out.append(ClaimDevice(str(r.get("request", "")), name, cfg.uuids[index], limit,
                               str(r.get("shareID") or "")))
    if len({d.uuid for d in out}) != len(out):
        raise InvalidRequest("status.allocation.devices.results.device",
                             "names one GPU twice in one claim")
    return out


def config_text(uid: str, devices: list[ClaimDevice], cfg: PluginConfig,
                priority_class: str = "") -> str:
    """The claim's gpu-isolation.conf, as the container sees its paths."""
    shares = [DeviceShare(index=i, uuid=d.uuid, limit_bytes=d.limit_bytes,
                          request_bytes=d.limit_bytes) for i, d in enumerate(devices)]
    overhead = max((cfg.headroom.get(d.uuid, 0) for d in devices), default=0)
    loans = None
    if cfg.loans_host_dir is not None:
        pc = PRIORITY_CLASSES.get(priority_class) or PRIORITY_CLASSES["train"]  # the default
        loans = LoansConfig(Path(CONTAINER_LOANS_DIR), share=uid, priority=pc.value,
                            wait_ms=DEFAULT_WAIT_MS, headroom_bytes=overhead)
    return render_config(shares, Path(CONTAINER_REGION_DIR) / REGION_NAME, overhead, loans)


def cdi_spec(uid: str, devices: list[ClaimDevice], cfg: PluginConfig) -> dict[str, Any]:
    library = f"{cfg.library_mount.rstrip('/')}/{cfg.library_name}"
    env = {"LD_PRELOAD": library,
           wire.VISIBLE_DEVICES_KEY: ",".join(d.uuid for d in devices)}
    mounts = [{"hostPath": str(cfg.library_dir), "containerPath": cfg.library_mount,
               "options": ["ro", "bind"]},
              {"hostPath": str(cfg.library_dir / PRELOAD_NAME), "containerPath": PRELOAD_PATH,
               "options": ["ro", "bind"]}]
    if cfg.claims_dir is not None:
        base = (cfg.claims_host_dir or cfg.claims_dir) / uid
        env[CONFIG_ENV] = f"{CONTAINER_CONFIG_DIR}/{CONFIG_NAME}"
        mounts += [{"hostPath": str(base / "conf"), "containerPath": CONTAINER_CONFIG_DIR,
                    "options": ["ro", "bind"]},
                   {"hostPath": str(base / "region"), "containerPath": CONTAINER_REGION_DIR,
                    "options": ["rw", "bind"]}]
        if cfg.loans_host_dir is not None:
            mounts.append({"hostPath": str(cfg.loans_host_dir),
                           "containerPath": CONTAINER_LOANS_DIR, "options": ["rw", "bind"]})
    return {
        "cdiVersion": CDI_VERSION, "kind": CDI_KIND,
        "containerEdits": {"env": [f"{k}={v}" for k, v in sorted(env.items())],
                           "mounts": mounts},
        "devices": [{"name": cdi_name(uid, d),
                     "containerEdits": {"env": [f"{LIMIT_ENV}_{i}={d.limit_bytes}"]}}
                    for i, d in enumerate(devices)],
    }


def cdi_name(uid: str, device: ClaimDevice) -> str:
    return f"{uid}-{device.name}"


def check_uid(uid: str) -> str:
    if not uid or "/" in uid or uid.startswith(".") or len(uid) > 63 or any(
            not (c.isalnum() or c in "-_.") for c in uid):
        raise InvalidRequest("claim.uid", "must be a UID", uid)
    return uid


def spec_path(cfg: PluginConfig, uid: str) -> Path:
    return cfg.cdi_dir / f"{DRIVER}-{check_uid(uid)}.json"


def pods_priority_class(pods: Iterable[Mapping[str, Any]]) -> str:
    """The priority class the claim's pods agree on (``tessera.io/priority-class``, else their
    ``priorityClassName`` when it is one of tessera's), for the loans line; "" (the default,
    ``train``) when they name none or disagree."""
    found: set[str] = set()
    for pod in pods:
        ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(
            wire.PRIORITY_CLASS)
        spec = (pod.get("spec") or {}).get("priorityClassName")
        found.add(str(ann or (spec if spec in PRIORITY_CLASSES else "")))
    return found.pop() if len(found) == 1 else ""


def pods_group(pods: Iterable[Mapping[str, Any]], claim_name: str) -> int | None:
    """The group every process of the containers that use the claim runs with, when all the
    pods agree on one (None otherwise)."""
    groups: set[int | None] = set()
    for pod in pods:
        spec = pod.get("spec") or {}
        refs = {r.get("name") for r in spec.get("resourceClaims") or []
                if r.get("resourceClaimName") == claim_name
                or r.get("name") in {s.get("name") for s in
                                     (pod.get("status") or {}).get("resourceClaimStatuses") or []
                                     if s.get("resourceClaimName") == claim_name}}
        for c in spec.get("containers") or []:
            used = {x.get("name") for x in (c.get("resources") or {}).get("claims") or []}
            if used & refs:
                groups.add(share_group(spec, str(c.get("name", ""))))
    return groups.pop() if len(groups) == 1 else None


def _write(path: Path, text: str, mode: int) -> None:
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _own(path: Path, gid: int, mode: int) -> None:
    if path.stat().st_gid != gid:
        os.chown(path, -1, gid)
    os.chmod(path, mode)


def write_claim_files(cfg: PluginConfig, uid: str, text: str, gid: int | None) -> None:
    """The claim's config and region (kept when it exists: pods may be using it). Raises
    OSError."""
    assert cfg.claims_dir is not None
    base = cfg.claims_dir / check_uid(uid)
    (base / "conf").mkdir(parents=True, exist_ok=True)
    os.chmod(base / "conf", 0o755)
    _write(base / "conf" / CONFIG_NAME, text, 0o644)
    group = gid if gid is not None else (0 if os.geteuid() == 0 else os.getegid())
    region = base / "region"
    region.mkdir(exist_ok=True)
    _own(region, group, REGION_DIR_MODE)
    if not (region / REGION_NAME).exists():
        os.close(os.open(region / REGION_NAME, os.O_CREAT | os.O_WRONLY, REGION_FILE_MODE))
    _own(region / REGION_NAME, group, REGION_FILE_MODE)


def write_spec(cfg: PluginConfig, uid: str, spec: Mapping[str, Any]) -> Path:
    path = spec_path(cfg, uid)
    cfg.cdi_dir.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(spec, indent=1), 0o644)
    return path


def remove_claim(cfg: PluginConfig, uid: str) -> None:
    """Unprepare: the spec first (no new container gets the claim), then its files."""
    spec_path(cfg, uid).unlink(missing_ok=True)
    if cfg.claims_dir is not None:
        shutil.rmtree(cfg.claims_dir / check_uid(uid), ignore_errors=True)
