"""Installing the isolation library on the host: versioned, atomic, idempotent, and safe against
kill -9 at the worst moment (a real process killed while its copy is half done)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tessera.isolation.build import NativeBuild
from tessera.node.install import install_library

MOUNT = "/usr/local/tessera"


def _install_in_process(source: Path, directory: Path, fault: bool) -> subprocess.Popen[str]:
    code = ("import sys; from pathlib import Path; from tessera.node.install import install_library;"
            " install_library(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])")
    env = dict(os.environ)
    env.pop("TESSERA_NODE_FAULT", None)
    if fault:
        env["TESSERA_NODE_FAULT"] = "stall-install"
    return subprocess.Popen([sys.executable, "-c", code, str(source), str(directory), MOUNT],
                            env=env, stdout=subprocess.PIPE, text=True)


def _killed_mid_install(source: Path, directory: Path) -> None:
    p = _install_in_process(source, directory, fault=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert "fault stall-install" in line, line
    p.kill()
    p.wait()


def test_install_is_versioned_and_idempotent(native: NativeBuild, tmp_path: Path) -> None:
    d = tmp_path / "isolation"
    first = install_library(native.library, d, MOUNT)
    assert first.changed
    link = d / "libtessera-cuda.so"
    assert os.readlink(link) == f"versions/{first.digest}/libtessera-cuda.so"
    assert link.read_bytes() == native.library.read_bytes()
    assert (d / "ld.so.preload").read_text() == f"{MOUNT}/libtessera-cuda.so\n"
    before = {p: p.stat().st_mtime_ns for p in d.rglob("*")}
    again = install_library(native.library, d, MOUNT)
    assert not again.changed and again.digest == first.digest
    assert {p: p.stat().st_mtime_ns for p in d.rglob("*")} == before, "nothing rewritten"


def test_kill_9_mid_first_install_then_restart_finishes_it(native: NativeBuild,
                                                           tmp_path: Path) -> None:
    d = tmp_path / "isolation"
    _killed_mid_install(native.library, d)
    leftovers = list(d.rglob(".tmp-*"))
    assert leftovers, "the kill came while the copy was in its temporary file"
    assert not (d / "libtessera-cuda.so").exists(), "no half library under the real name"
    done = install_library(native.library, d, MOUNT)
    assert not list(d.rglob(".tmp-*"))
    assert (d / "libtessera-cuda.so").read_bytes() == native.library.read_bytes()
    assert done.changed


def test_kill_9_mid_upgrade_keeps_the_old_library_whole(native: NativeBuild,
                                                        tmp_path: Path) -> None:
    d = tmp_path / "isolation"
    old = tmp_path / "old.so"
    old.write_bytes(native.library.read_bytes() + b"\0old build")
    v1 = install_library(old, d, MOUNT)
    _killed_mid_install(native.library, d)
    # Containers starting now still get the old build, whole.
    assert (d / "libtessera-cuda.so").read_bytes() == old.read_bytes()
    assert os.readlink(d / "libtessera-cuda.so").startswith(f"versions/{v1.digest}/")
    v2 = install_library(native.library, d, MOUNT)
    assert v2.digest != v1.digest
    assert (d / "libtessera-cuda.so").read_bytes() == native.library.read_bytes()
    assert (d / "versions" / v1.digest / "libtessera-cuda.so").is_file(), \
        "the old version stays for containers that mapped it"
    assert not list(d.rglob(".tmp-*"))


def test_a_corrupt_version_is_rewritten(native: NativeBuild, tmp_path: Path) -> None:
    d = tmp_path / "isolation"
    v = install_library(native.library, d, MOUNT)
    v.version_path.write_bytes(b"truncated")
    time.sleep(0.01)
    again = install_library(native.library, d, MOUNT)
    assert again.changed
    assert (d / "libtessera-cuda.so").read_bytes() == native.library.read_bytes()
