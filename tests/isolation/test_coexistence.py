"""#28 class 6: the library coexists with other interposers and with sanitizer runtimes.

Both failed with main's library (TESSERA_ISOLATION_TEST_LIBRARY): a dlopen interposer preloaded
first recursed without end (the library handed it its own dlopen back for dlsym(RTLD_NEXT,
"dlopen")), and a program built with AddressSanitizer crashed at start (the sanitizer's dlsym
calls during its initialisation reached the library's strcmp/dl_iterate_phdr calls before the
sanitizer's interceptors could forward them, then the same self-lookup recursion)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.isolation.conftest import GiB, clean_env

LIMIT = GiB


def _run(native, program: str, preload: str, extra: dict[str, str] | None = None) -> dict[str, int]:  # type: ignore[no-untyped-def]
    env = clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": str(LIMIT), **(extra or {})})
    env["LD_PRELOAD"] = preload
    result = subprocess.run([str(native.program(program)), "alloc", "-"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    line = result.stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (t.split("=") for t in line.split())}


def _library(native) -> str:  # type: ignore[no-untyped-def]
    return os.environ.get("TESSERA_ISOLATION_TEST_LIBRARY") or str(native.library)


def test_another_dlopen_interposer_preloaded_first(native) -> None:  # type: ignore[no-untyped-def]
    other = native.program("libotherinterp.so")
    out = _run(native, "adversary3", f"{other} {_library(native)}")
    assert 0 < out["held0"] <= LIMIT and out["refused"] >= 1


def _libasan() -> str | None:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if not cc:
        return None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.parametrize("order", ["sanitizer-first", "library-first"])
def test_a_program_built_with_address_sanitizer(native, order: str) -> None:  # type: ignore[no-untyped-def]
    """The sanitizer's runtime first (LD_PRELOAD="libasan.so libtessera-cuda.so", what ASan asks
    for), or the library first with ASan's link-order check off: both run, capped."""
    asan = _libasan()
    assert asan, "the native build needs gcc with libasan (fuzz_config is built with it too)"
    if order == "sanitizer-first":
        out = _run(native, "adversary3_asan", f"{asan} {_library(native)}")
    else:
        out = _run(native, "adversary3_asan", _library(native),
                   {"ASAN_OPTIONS": "verify_asan_link_order=0"})
    assert 0 < out["held0"] <= LIMIT and out["refused"] >= 1
