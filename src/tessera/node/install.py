"""Installing the isolation library on the host, where the webhook's hostPath mounts find it.

Layout under the library directory (default ``/var/lib/tessera/isolation``, mounted read-only at
``/usr/local/tessera`` in every share container):

    versions/<sha256[:16]>/libtessera-cuda.so   one directory per library build, never rewritten
    libtessera-cuda.so -> versions/<digest>/libtessera-cuda.so    (relative symlink: the current one)
    ld.so.preload                               one line: the library's path inside the container

Every write goes to a temporary name first and is renamed into place (atomic on one file system),
so a container starting at any moment sees either the old library or the new one, whole. Running
containers keep the version they mapped: versions are never deleted while current. Installing
the same build again changes nothing (idempotent). After a kill -9 at any point, the next start
removes temporary files, rewrites a version whose digest does not match, and re-points the link:
it finishes or undoes a half-done install.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.isolation.library import LIBRARY_NAME

PRELOAD_NAME = "ld.so.preload"
VERSIONS = "versions"
TMP_PREFIX = ".tmp-"
FAULT_ENV = "TESSERA_NODE_FAULT"
"""Tests only: ``stall-install`` stops after the library's temporary copy is written, so a test
can kill the agent mid-install."""


class InstallError(RuntimeError):
    """The library could not be installed; the message names the path and the cause."""


@dataclass(frozen=True)
class Installed:
    directory: Path
    digest: str
    version_path: Path
    changed: bool
    """False when the same build was already installed and current."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    if os.environ.get(FAULT_ENV) == "stall-install":
        print(f"tessera-node: fault stall-install at {tmp}", flush=True)
        time.sleep(3600)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _symlink_atomic(link: Path, target: str) -> None:
    tmp = link.with_name(f"{TMP_PREFIX}{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
    _fsync_dir(link.parent)


def clean_leftovers(directory: Path) -> list[Path]:
    """Removes temporary files a killed install left behind; returns what it removed."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for path in [*directory.glob(f"{TMP_PREFIX}*"), *directory.glob(f"{VERSIONS}/*/{TMP_PREFIX}*")]:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def install_library(source: Path, directory: Path, library_mount: str) -> Installed:
    """Installs ``source`` under ``directory`` (see the module doc); raises InstallError."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        clean_leftovers(directory)
        digest = _digest(source)
        version_dir = directory / VERSIONS / digest
        version = version_dir / LIBRARY_NAME
        changed = False
        if not version.is_file() or _digest(version) != digest:
            version_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(version, source.read_bytes(), 0o755)
            changed = True
        link = directory / LIBRARY_NAME
        target = f"{VERSIONS}/{digest}/{LIBRARY_NAME}"
        if not link.is_symlink() or os.readlink(link) != target:
            _symlink_atomic(link, target)
            changed = True
        preload = directory / PRELOAD_NAME
        line = f"{library_mount.rstrip('/')}/{LIBRARY_NAME}\n".encode()
        if not preload.is_file() or preload.read_bytes() != line:
            _write_atomic(preload, line, 0o644)
            changed = True
    except OSError as exc:
        raise InstallError(f"cannot install {LIBRARY_NAME} into {directory}: {exc}") from exc
    return Installed(directory=directory, digest=digest, version_path=version, changed=changed)
