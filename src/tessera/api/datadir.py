"""The data directory is this user's own before anything is written into it.

The server writes the admin's secret (``credentials.json``), the store and ``server.json`` there.
A directory another local user made, or one holding a symlink, would let that user read the
secret (written into their file) or point a write at a file of theirs. So before the first write:
the directory is created 0700 if missing; it must be a real directory (not a symlink) owned by
this user (its group/other write bits are then cleared: it is ours), or a Kubernetes volume as
``fsGroup`` makes it (root's, our group's, writable by no one else); and no entry in it may be a
symlink or belong to a user other than this one or root. Refusals name the path and the rule (docs/robustness.md, "The data directory is checked before a secret is written").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class DataDirUnsafe(Exception):
    """The data directory must not be used; the message names the path and why."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_data_dir(directory: Path) -> None:
    """Create ``directory`` (0700) if missing; raise :class:`DataDirUnsafe` unless it and every
    entry in it are this user's own, with no symlink among them."""
    me = os.geteuid()
    if not os.path.lexists(directory):
        directory.mkdir(parents=True, mode=0o700)
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise DataDirUnsafe(f"data directory {directory} is a symlink (to "
                            f"{os.readlink(directory)}); give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirUnsafe(f"data directory {directory} is not a directory")
    if st.st_uid == me:
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)
    elif not _kubernetes_volume(st):
        raise DataDirUnsafe(
            f"data directory {directory} belongs to {_owner(st.st_uid)}, not to this user "
            f"({_owner(me)}): refusing to write the admin secret where another user can read "
            "it; use a directory of your own (--data-dir) or fix its owner")
    for entry in os.scandir(directory):
        est = entry.stat(follow_symlinks=False)
        path = directory / entry.name
        if stat.S_ISLNK(est.st_mode):
            raise DataDirUnsafe(
                f"{path} in the data directory is a symlink (to {os.readlink(path)}): refusing "
                "to write through it; remove it")
        if est.st_uid not in (me, 0):
            raise DataDirUnsafe(
                f"{path} in the data directory belongs to {_owner(est.st_uid)}, not to this "
                f"user ({_owner(me)}): refusing to use it; remove it")


def _kubernetes_volume(st: os.stat_result) -> bool:
    """A pod's volume as ``fsGroup`` gives it: owned by root (who can read everything anyway),
    its group one of ours, writable by no one else. The server then writes only through its
    group and keeps its files 0600."""
    return (st.st_uid == 0 and (st.st_gid == os.getegid() or st.st_gid in os.getgroups())
            and not st.st_mode & 0o002)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file readable by this user only, never through a symlink."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
