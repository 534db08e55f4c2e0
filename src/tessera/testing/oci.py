"""Run what an OCI image holds without a container runtime: unpack it (umoci) and run its
programs under ``chroot`` in a private mount namespace (``unshare --mount``), as the user the
image or a pod's securityContext names, with a read-only root, ``/proc``, ``/dev`` and a tmpfs
``/tmp``, and host directories bind-mounted where a pod spec mounts its volumes.

What this is: the image's own files (Python, libraries, tessera's venv, its entry points) started
as they would be in a container. What it is not: a container runtime. The process shares the
host's network, PID and IPC namespaces and cgroup, gets no seccomp profile and keeps the
capabilities root has unless it runs as a non-root user; so network policy, resource limits,
capability drops and seccomp are not exercised. Needs root, ``unshare``, ``chroot`` and umoci.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


class ImageError(RuntimeError):
    """An image could not be unpacked or run; the message says which and why."""


@dataclass
class UnpackedImage:
    rootfs: Path
    user: tuple[int, int]
    env: dict[str, str]
    cmd: list[str]
    workdir: str = "/"
    config: dict[str, object] = field(default_factory=dict)

    def command(self, argv: list[str], *, env: dict[str, str] | None = None,
                mounts: dict[str, Path] | None = None, user: tuple[int, int] | None = None,
                read_only_root: bool = True) -> list[str]:
        """argv for ``subprocess``: run ``argv`` inside the image (see module doc).

        ``env`` is added to the image's own environment (a pod's env does the same);
        ``mounts`` maps a path inside the image to a host path, bind-mounted there."""
        root = str(self.rootfs)
        uid, gid = user if user is not None else self.user
        full_env = {**self.env, **(env or {})}
        lines = ["set -e", f"R={shlex.quote(root)}",
                 'mount --bind "$R" "$R"']
        for inside, host in sorted((mounts or {}).items()):
            # Created here, resolved inside the image: /var/run -> /run must not lead to the
            # host's /run. The unpacked root is a throw-away copy, so mount points may be added.
            where = self.resolve(inside)
            if Path(host).is_dir():
                where.mkdir(parents=True, exist_ok=True)
            else:
                where.parent.mkdir(parents=True, exist_ok=True)
                where.touch()
            lines.append(f"mount --bind {shlex.quote(str(host))} {shlex.quote(str(where))}")
        lines += ['mount -t proc proc "$R"/proc', 'mount --rbind /dev "$R"/dev',
                  'mount -t tmpfs -o mode=1777 tmpfs "$R"/tmp']
        if read_only_root:
            lines.append('mount -o remount,bind,ro "$R"')
        env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(full_env.items()))
        lines.append(f'cd "$R"; exec chroot --userspec={uid}:{gid} "$R" /usr/bin/env -i '
                     f'{env_args} sh -c \'cd "$0" && exec "$@"\' {shlex.quote(self.workdir)} "$@"')
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                "\n".join(lines), "sh", *argv]

    def resolve(self, path: str) -> Path:
        """The host path of ``path`` inside the image, following the image's symbolic links
        within the image (an absolute link target is taken from the image's root)."""
        parts = [p for p in path.split("/") if p]
        current = self.rootfs
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                current = current.parent if current != self.rootfs else current
                continue
            candidate = current / part
            if candidate.is_symlink():
                hops += 1
                if hops > 40:
                    raise ImageError(f"{path}: too many symbolic links in the image")
                target = os.readlink(candidate)
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    current = self.rootfs
                continue
            current = candidate
        if not str(current).startswith(str(self.rootfs)):
            raise ImageError(f"{path} leaves the image")
        return current

    def run(self, argv: list[str], *, timeout: float = 60, **kw: object
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv, **kw),  # type: ignore[arg-type]
                              capture_output=True, text=True, timeout=timeout)


def can_run() -> str | None:
    """None if images can be unpacked and run here, else why not."""
    if os.geteuid() != 0:
        return "needs root (chroot, mount namespaces, files owned by the image's users)"
    for tool in ("umoci", "unshare", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install umoci util-linux coreutils)"
    return None


def unpack(archive: Path, dest: Path, tag: str | None = None) -> UnpackedImage:
    """Unpack an OCI archive (``<name>.oci.tar``) into ``dest`` (``dest/rootfs``)."""
    layout = dest / "layout"
    shutil.rmtree(dest, ignore_errors=True)
    layout.mkdir(parents=True)
    with tarfile.open(archive) as t:
        t.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    if tag is None:
        tags = [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                for m in index["manifests"]]
        tag = next((t for t in tags if t), None)
        if tag is None:
            raise ImageError(f"{archive}: no tagged manifest in index.json")
    bundle = dest / "bundle"
    out = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise ImageError(f"umoci unpack {archive}: {out.stderr.strip()}")
    spec = json.loads((bundle / "config.json").read_text())
    process = spec["process"]
    env = dict(e.split("=", 1) for e in process.get("env", []))
    return UnpackedImage(rootfs=bundle / "rootfs",
                         user=(int(process["user"]["uid"]), int(process["user"]["gid"])),
                         env=env, cmd=list(process.get("args", [])),
                         workdir=process.get("cwd", "/"), config=spec)


def layer_members(archive: Path) -> list[tuple[str, int, int, int, bytes]]:
    """(path, mode, uid, size, tar type) of every entry in every layer of the image in
    ``archive`` (type as tarfile's: REGTYPE, DIRTYPE, SYMTYPE, CHRTYPE, ...)."""
    out: list[tuple[str, int, int, int, bytes]] = []
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        blob = index["manifests"][0]["digest"].replace(":", "/")
        manifest = json.load(t.extractfile(f"blobs/{blob}"))  # type: ignore[arg-type]
        for layer in manifest["layers"]:
            f = t.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            assert f is not None
            with tarfile.open(fileobj=f, mode="r|*") as lt:
                out += [(m.name.removeprefix("./"), m.mode, m.uid, m.size, m.type) for m in lt]
    return out
