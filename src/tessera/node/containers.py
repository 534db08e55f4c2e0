"""Per-container isolation files on the host: what the webhook mounts into each share container.

Layout (``/work/notes/node-config-format.md`` and docs/node-agent.md), ``KEY`` being the pod's
``tessera.io/gpu-config-key`` (drawn by the webhook, so a re-created pod of the same name never
mounts a stale file):

    ROOT/KEY/pod.json                                 who it is (for the agent: metrics, Events)
    ROOT/KEY/conf/CONTAINER/gpu-isolation.conf        0644, mounted read-only at /etc/tessera
    ROOT/KEY/region/                                  2770 root:GROUP, mounted at /run/tessera
    ROOT/KEY/region/gpu-usage.region                  0660 root:GROUP (the pod's shared
                                                      accounting region)

GROUP is the group every process of the pod's share container runs with
(:func:`tessera.core.podgroups.share_group`; the webhook adds one to a pod that states none): the
pod's processes share the region whatever UIDs they run as, and no other user can open it.

The webhook mounts the two directories as hostPath ``type: Directory``: the kubelet does not
start the container until they exist, so a container is never started uncapped. Files are
written through :func:`tessera.isolation.config.render_config` (the format the library parses)
and renamed into place; the directory ``conf/CONTAINER`` appears only once its file is complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tessera.core.workloads import PRIORITY_CLASSES
from tessera.isolation.config import (
    CONFIG_NAME,
    DEFAULT_WAIT_MS,
    REGION_NAME,
    DeviceShare,
    LoansConfig,
    render_config,
)

CONTAINER_REGION_DIR = "/run/tessera"
CONTAINER_LOANS_DIR = "/run/tessera-loans"
"""Where a share container sees the node's loans ledger directory (the webhook mounts it)."""
CONTAINER_CONFIG_DIR = "/etc/tessera"
POD_FILE = "pod.json"
_KEY = re.compile(r"^[0-9a-f]{16}$")
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ShareFilesError(RuntimeError):
    """The files of a share could not be written; the message names the path or the field."""


@dataclass(frozen=True)
class ShareDevice:
    uuid: str
    request_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class Share:
    """One pod (or embedded workload pod) holding shares of GPUs on this node."""

    key: str
    namespace: str
    pod: str
    uid: str
    containers: tuple[str, ...]
    devices: tuple[ShareDevice, ...]
    workload: str = ""
    project: str = ""
    priority_class: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    group: int | None = None
    """The group every process of the share container has (owner group of the region); None:
    the pod states none (the region is then root's alone, or the writer's group with
    ``host_paths``)."""


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ShareFilesError(f"tessera.io/gpu-config-key: must be 16 lowercase hex digits, got {key!r}")
    return key


def share_dir(root: Path, key: str) -> Path:
    return root / check_key(key)


def config_dir(root: Path, key: str, container: str) -> Path:
    if not _CONTAINER.match(container):
        raise ShareFilesError(f"container name {container!r} is not a DNS label")
    return share_dir(root, key) / "conf" / container


CLAIM_KEY_PREFIX = "claim-"
"""Shares of DRA claims (tessera.node.sync.claim_shares) are keyed ``claim-<claim uid>``; their
files are the claim's, under ``<root>/claims/<uid>`` (tessera.node.draplugin.cdi)."""


def region_path(root: Path, key: str) -> Path:
    if key.startswith(CLAIM_KEY_PREFIX):
        return root / "claims" / key[len(CLAIM_KEY_PREFIX):] / "region" / REGION_NAME
    return share_dir(root, key) / "region" / REGION_NAME


def loans_for(share: Share, directory: Path, headroom_bytes: int) -> LoansConfig:
    """The share's place in the node-wide loans ledger: every share joins it (its request is
    guaranteed to it; memory above a request is lent only from what nobody is guaranteed), with
    the priority of its class (the lowest loses its loan first)."""
    pc = PRIORITY_CLASSES.get(share.priority_class) or PRIORITY_CLASSES["train"]  # the default
    return LoansConfig(directory, share=share.key, priority=pc.value,
                       wait_ms=DEFAULT_WAIT_MS, headroom_bytes=headroom_bytes)


def render(share: Share, context_overhead_bytes: int = 0, region: Path | None = None,
           loans_dir: Path | None = None) -> str:
    """The config file's text; ``region`` is the region's path as the container's processes see
    it (default: the mount point, ``/run/tessera/gpu-usage.region``), ``loans_dir`` the loans
    ledger directory as they see it (None: no loans accounting)."""
    devices = [DeviceShare(index=i, uuid=d.uuid, limit_bytes=d.limit_bytes,
                           request_bytes=d.request_bytes) for i, d in enumerate(share.devices)]
    loans = loans_for(share, loans_dir, context_overhead_bytes) if loans_dir else None
    return render_config(devices, region or Path(CONTAINER_REGION_DIR) / REGION_NAME,
                         context_overhead_bytes, loans)


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


REGION_DIR_MODE = 0o2770
REGION_FILE_MODE = 0o660


def _own(path: Path, gid: int, mode: int) -> None:
    """``path`` in group ``gid`` with ``mode`` (chown first: it clears the set-group-ID bit)."""
    if path.stat().st_gid != gid:
        os.chown(path, -1, gid)
    os.chmod(path, mode)


def _region(root: Path, share: Share, host_paths: bool) -> None:
    """The pod's region directory and empty region file, in the share's group: 2770 and 0660,
    owned by this agent (root on a node). A new directory is built aside and renamed into place,
    so the kubelet's ``type: Directory`` check never sees it unfinished; an existing one (a pod
    already running, an older agent's 0777) is brought to the same owner and modes."""
    gid = share.group
    if gid is None:
        gid = os.getegid() if host_paths else 0
    region = region_path(root, share.key)
    directory = region.parent
    if not directory.is_dir():
        staging = directory.with_name(f".tmp-region.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _own(staging, gid, REGION_DIR_MODE)
        os.close(os.open(staging / REGION_NAME, os.O_CREAT | os.O_WRONLY, REGION_FILE_MODE))
        _own(staging / REGION_NAME, gid, REGION_FILE_MODE)
        os.replace(staging, directory)
        return
    _own(directory, gid, REGION_DIR_MODE)
    if not region.exists():
        os.close(os.open(region, os.O_CREAT | os.O_WRONLY, REGION_FILE_MODE))
    _own(region, gid, REGION_FILE_MODE)


def write_share(root: Path, share: Share, context_overhead_bytes: int = 0, *,
                host_paths: bool = False, loans_dir: Path | None = None,
                extra: Mapping[str, str] | None = None) -> list[Path]:
    """Writes (or rewrites, unchanged content is left alone) the files of one share; returns the
    config files. ``host_paths``: the processes run on this host, not in a container (embedded
    mode, tests), so the config names the region by its host path. ``extra``: more files of each
    container's config directory (name -> text: the compute share's ``gpu-compute.conf``), in
    it from the moment it appears. Raises ShareFilesError; InvalidRequest (from render_config)
    for bad values."""
    text = render(share, context_overhead_bytes,
                  region_path(root, share.key).resolve() if host_paths else None,
                  (loans_dir if host_paths else Path(CONTAINER_LOANS_DIR)) if loans_dir else None)
    base = share_dir(root, share.key)
    written: list[Path] = []
    try:
        _region(root, share, host_paths)
        _write(base / POD_FILE, json.dumps(asdict(share), sort_keys=True), 0o644)
        for container in share.containers:
            final = config_dir(root, share.key, container)
            conf = final / CONFIG_NAME
            files = {**(extra or {}), CONFIG_NAME: text}
            if all((final / n).is_file() and (final / n).read_text() == t for n, t in files.items()):
                written.append(conf)
                continue
            if final.is_dir():
                for name, body in files.items():  # the isolation config last
                    _write(final / name, body, 0o644)
            else:
                # Build the directory aside and rename it into place: the kubelet's
                # "type: Directory" check never sees it without its file.
                staging = final.with_name(f".tmp-{container}.{os.getpid()}")
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
                for name, body in files.items():
                    _write(staging / name, body, 0o644)
                os.chmod(staging, 0o755)
                os.replace(staging, final)
            written.append(conf)
    except OSError as exc:
        raise ShareFilesError(f"cannot write the isolation files of {share.namespace}/{share.pod} "
                              f"under {base}: {exc}") from exc
    return written


def read_share(root: Path, key: str) -> Share | None:
    try:
        d = json.loads((share_dir(root, key) / POD_FILE).read_text())
        d["containers"] = tuple(d["containers"])
        d["devices"] = tuple(ShareDevice(**x) for x in d["devices"])
        return Share(**d)
    except (OSError, ValueError, TypeError, KeyError, ShareFilesError):
        return None


def existing_keys(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _KEY.match(p.name))


def remove_share(root: Path, key: str) -> None:
    shutil.rmtree(share_dir(root, key), ignore_errors=True)


def remove_stale(root: Path, keep: Iterable[str]) -> list[str]:
    """Removes the directories of shares not in ``keep``; returns their keys."""
    keep_set = set(keep)
    gone = [k for k in existing_keys(root) if k not in keep_set]
    for k in gone:
        remove_share(root, k)
    for leftover in root.glob(".tmp-*") if root.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)
    return gone
