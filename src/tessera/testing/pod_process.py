"""A container's process on a simulated node: what a kubelet and container runtime would start.

kwok runs no containers, so tests that need a pod's process (a CUDA program under the isolation
library, with exactly the files the webhook mounted and tessera-node wrote) start one here: in a
private mount namespace (``unshare --mount``), every hostPath volume the pod's container mounts
is bind-mounted at its ``mountPath``, with the node's host paths translated to where that node's
tessera-node keeps them in the test (each simulated node has its own directory). The library is
preloaded with ``LD_PRELOAD`` (the file the pod mounts over ``/etc/ld.so.preload`` names it),
and the fake driver of that node is on the library path. A mount point that does not exist on
this machine (``/etc/tessera``, ``/run/tessera``, ``/run/tessera-loans``) is made inside the
namespace only, on an overlay of its nearest existing parent: nothing is created on the host
(an empty ``/etc/tessera`` there would change how the isolation library behaves).

The process runs as the container's user and groups, as a runtime starts it: ``runAsUser`` and
``runAsGroup`` (the container's, else the pod's; a user without a group gets group 0), plus the
pod's ``supplementalGroups`` and ``fsGroup`` as supplementary groups (``setpriv``). A pod that
states none of them runs as this (root) user, as before.

This is a test double of the kubelet and runtime only; the pod spec, the files and the library
are the real ones.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_HOST_DIRS = {
    "/var/lib/tessera/containers": "containers",
    "/var/lib/tessera/loans": "loans",
    "/var/lib/tessera/isolation": "isolation",
}
"""The webhook's default hostPaths -> the directory under the simulated node's root."""


def mounts_of(pod: Any, container: str, node_root: Path) -> list[tuple[Path, str, bool]]:
    """(source on this machine, mountPath, read-only) for each hostPath directory the container
    mounts; files (the preload file) are left to :func:`start`."""
    spec = pod.spec
    volumes = {v.name: v for v in spec.volumes or [] if v.hostPath is not None}
    c = next(c for c in spec.containers if c.name == container)
    out = []
    for m in c.volumeMounts or []:
        v = volumes.get(m.name)
        if v is None or v.hostPath.type == "File":
            continue
        out.append((translate(v.hostPath.path, node_root), m.mountPath, bool(m.readOnly)))
    return out


def identity_of(pod: Any, container: str) -> tuple[int | None, int | None, list[int]]:
    """(uid, gid, supplementary groups) the runtime gives the container's processes; None: not
    stated (the process keeps this one's)."""
    spec = pod.spec
    psc = spec.securityContext
    c = next(c for c in [*(spec.containers or []), *(spec.initContainers or [])] if c.name == container)
    csc = c.securityContext
    uid = csc.runAsUser if csc and csc.runAsUser is not None else (
        psc.runAsUser if psc and psc.runAsUser is not None else None)
    gid = csc.runAsGroup if csc and csc.runAsGroup is not None else (
        psc.runAsGroup if psc and psc.runAsGroup is not None else None)
    if uid is not None and gid is None:
        gid = 0
    groups = list(psc.supplementalGroups or []) if psc else []
    if psc and psc.fsGroup is not None:
        groups.append(psc.fsGroup)
    return uid, gid, groups


def translate(host_path: str, node_root: Path) -> Path:
    for prefix, sub in DEFAULT_HOST_DIRS.items():
        if host_path == prefix or host_path.startswith(prefix + "/"):
            return node_root / sub / host_path[len(prefix):].lstrip("/")
    raise ValueError(f"hostPath {host_path} is not one tessera's webhook writes")


def start(pod: Any, container: str, node_root: Path, argv: Sequence[str],
          env: Mapping[str, str], library: Path) -> subprocess.Popen[str]:
    """Starts ``argv`` as the container's process; stdin/stdout are pipes (text)."""
    scratch = Path(tempfile.mkdtemp(prefix="tessera-pod-mounts-"))
    script = ["set -e"]
    overlaid: set[Path] = set()
    for source, target, read_only in mounts_of(pod, container, node_root):
        parent = Path(target)
        while not parent.exists():
            parent = parent.parent
        if parent != Path(target) and parent not in overlaid:
            overlaid.add(parent)
            upper, work = scratch / f"u{len(overlaid)}", scratch / f"w{len(overlaid)}"
            upper.mkdir()
            work.mkdir()
            script.append(f"mount -t overlay overlay -o lowerdir={shlex.quote(str(parent))},"
                          f"upperdir={shlex.quote(str(upper))},workdir={shlex.quote(str(work))} "
                          f"{shlex.quote(str(parent))}")
        script.append(f"mkdir -p {shlex.quote(target)}")
        script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
        if read_only:
            script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    uid, gid, groups = identity_of(pod, container)
    if uid is None and gid is None and not groups:
        script.append('exec "$@"')
    else:
        ids = ([f"--reuid={uid}"] if uid is not None else []) + ([f"--regid={gid}"] if gid is not None else [])
        ids += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
        script.append(f'exec setpriv {" ".join(ids)} -- "$@"')
    full_env = {**env, "LD_PRELOAD": str(library)}
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script),
         "pod-process", *argv],
        env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, bufsize=1)
