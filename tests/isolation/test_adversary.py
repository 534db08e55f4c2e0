"""Adversarial programs (native/tests/adversary.c), one per way around the limit of issue #12.

Each runs under a 1 GiB limit on each of two fake H100s whose contexts take 300 MiB of device
memory, tries to make the driver hold more, and prints what the fake driver holds for it per
device (the driver's own count, not the library's). Whatever the program does, that must stay
within the limit: the library either charges the memory or refuses the call (fail closed).
Every test here was run against the library before the fix (TESSERA_ISOLATION_TEST_LIBRARY) and
failed there; docs/isolation.md lists what each class does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.isolation.conftest import GiB, clean_env

LIMIT = GiB
TWO_H100 = "NVIDIA H100 80GB HBM3=81559Mi;NVIDIA H100 80GB HBM3=81559Mi"


def attack(native, cls: str, *args: str, extra: dict[str, str] | None = None) -> tuple[dict[str, int], str]:
    env = clean_env(native, devices=TWO_H100, extra={
        "TESSERA_GPU_MEMORY_LIMIT": str(LIMIT), "FAKE_GPU_CONTEXT_BYTES": str(300 * 2**20),
        **(extra or {})})
    result = subprocess.run([str(native.program("adversary")), cls, *args], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (t.split("=") for t in line.split())}, result.stderr


def assert_held(out: dict[str, int]) -> None:
    assert out["held0"] <= LIMIT, f"device 0 holds {out['held0'] / GiB:.2f} GiB over a 1 GiB limit"
    assert out["held1"] <= LIMIT, f"device 1 holds {out['held1'] / GiB:.2f} GiB over a 1 GiB limit"


def test_plain_allocation_stays_within_the_limit(native):
    out, _ = attack(native, "alloc")
    assert_held(out)
    assert out["held0"] > LIMIT // 2  # it did allocate up to about the limit


@pytest.mark.parametrize("cls", ["contexts", "pool-reserve", "set-pool", "default-pool-reserve",
                                 "foreign-pool", "graph-node", "capture", "ctx-limit", "legacy",
                                 "legacy-array"])
def test_what_the_driver_holds_is_charged(native, cls):
    """#12 item 1: context memory, pool reserves, pools the program did not create, graph memory,
    context limits and the unversioned entry points."""
    out, err = attack(native, cls)
    assert_held(out)
    assert out["refused"] >= 1, err
    said = {"graph-node": "cuGraphAddMemAllocNode refused", "capture": "on a capturing stream refused",
            "ctx-limit": "cuCtxSetLimit(2, 1073741824) refused"}
    if cls in said:  # a refusal the program could not explain is said once, at the default level
        assert err.count(said[cls]) == 1, err


def test_deepbind_library_goes_through_the_hooks(native):
    out, err = attack(native, "deepbind", str(native.program("libdeep.so")))
    assert_held(out)
    assert "RTLD_DEEPBIND" in err  # said once, at the default log level


@pytest.mark.parametrize("cls", ["dlvsym", "libc-dlsym", "static-runtime"])
def test_other_lookups_go_through_the_hooks(native, cls):
    out, err = attack(native, cls)
    assert_held(out)
    assert out["refused"] >= 1, err


def test_driver_in_another_namespace_is_refused(native):
    out, err = attack(native, "dlmopen")
    assert_held(out)
    assert "another link-map namespace" in err


def test_second_copy_of_the_driver_is_refused(native, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(Path(native.fake_dir) / "libcuda.so.1", copy / "libcuda.so.1")
    out, err = attack(native, "driver-copy", str(copy / "libcuda.so.1"))
    assert_held(out)
    assert "not the driver this library is bound to" in err


@pytest.mark.parametrize("internal", ["0", "1"])
def test_newer_abi_from_cuGetProcAddress_is_refused(native, internal):
    out, err = attack(native, "gpa-newer", extra={"FAKE_CUDA_DRIVER_VERSION": "14000",
                                                  "FAKE_CUDA_PROC_INTERNAL": internal})
    assert_held(out)
    assert "cuGetProcAddress(cuMemAlloc, 14000" in err and "refused" in err
