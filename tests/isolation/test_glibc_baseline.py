"""#28: the library loads in old images (glibc 2.17: CentOS 7, as manylinux2014), whatever glibc
built it. Reads the built library's version needs (readelf -V, the .gnu.version_r section) — the
same check the dynamic loader makes before it loads the library."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

BASELINE = (2, 17)


def version_needs(path: str) -> dict[str, set[str]]:
    """{library: {version, ...}} from readelf's "Version needs section"."""
    out = subprocess.run(["readelf", "-V", "--wide", path], capture_output=True, text=True, check=True).stdout
    needs: dict[str, set[str]] = {}
    section = out.split("Version needs section", 1)
    if len(section) < 2:
        return needs
    current = ""
    for line in section[1].splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            needs.setdefault(current, set())
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current:
            needs[current].add(m.group(1))
    return needs


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils (readelf) is part of ./dev setup")
def test_no_glibc_symbol_newer_than_2_17(native) -> None:  # type: ignore[no-untyped-def]
    library = os.environ.get("TESSERA_ISOLATION_TEST_LIBRARY") or str(native.library)
    needs = version_needs(library)
    glibc = {v for vs in needs.values() for v in vs if v.startswith("GLIBC_")}
    assert glibc, needs  # the parse found the section at all
    too_new = sorted(v for v in glibc
                     if tuple(int(x) for x in v.removeprefix("GLIBC_").split(".")[:2]) > BASELINE)
    assert not too_new, f"{library} needs {too_new}: it would not load on glibc 2.17"
    # Only the C library (libdl/libpthread merged into it since 2.34) and the loader are needed.
    assert {n for n in needs if not n.startswith("ld-linux")} <= {"libc.so.6", "libdl.so.2",
                                                                  "libpthread.so.0"}, needs
