"""Adversarial programs of issue #28 (native/tests/adversary3.c), one per way around the limit.

Each runs real processes on the fake driver and prints what the driver holds for them (its own
count, not the library's). Every test here was run against the library before its fix
(``TESSERA_ISOLATION_TEST_LIBRARY=<old build>``) and failed there; docs/isolation.md lists each.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.isolation.conftest import CTX, GiB, clean_env

H100 = "NVIDIA H100 80GB HBM3=81559Mi"


def run(native, cls: str, arg: str, extra: dict[str, str], *, library_path: bool = True) -> tuple[dict[str, int], str]:  # type: ignore[no-untyped-def]
    env = clean_env(native, devices=H100, extra=extra)
    if "TESSERA_GPU_CONTEXT_OVERHEAD" in extra and "FAKE_GPU_CONTEXT_BYTES" not in extra:
        # the overhead as the agent configures it: what a context really holds on the device
        env["FAKE_GPU_CONTEXT_BYTES"] = extra["TESSERA_GPU_CONTEXT_OVERHEAD"]
    if not library_path:
        env.pop("LD_LIBRARY_PATH")
    result = subprocess.run([str(native.program("adversary3")), cls, arg], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (t.split("=") for t in line.split())}, result.stderr


def test_a_reused_descriptor_number_erases_nobody(native, tmp_path: Path) -> None:
    """Class 4: the program closes the library's region descriptor and opens another file at
    that number; its refusals sweep the region for dead processes. The sibling's usage must
    survive (before: every slot read as dead, 3 GiB held under a 2 GiB limit)."""
    region = tmp_path / "w.region"
    out, err = run(native, "fd-reuse", str(region), {
        "TESSERA_GPU_MEMORY_LIMIT": str(2 * GiB), "TESSERA_GPU_CONTEXT_OVERHEAD": str(64 * 2**20),
        "TESSERA_GPU_SHARED_REGION": str(region)})
    assert out["held0"] <= 2 * GiB, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["held0"] >= GiB  # the child's GiB is held
    assert "was closed or replaced by the program" in err


@pytest.mark.parametrize("how", ["dlsym-newer"])
def test_an_exported_newer_abi_is_refused_by_name(native, how: str) -> None:
    """Class 1: dlsym of a hooked call's newer ABI by its own name (cuMemAlloc_v3 is exported by
    the fake driver) gets the policy of cuGetProcAddress: refused, said once. (dlvsym goes
    through the same check; glibc's dlvsym cannot find the fake's unversioned symbols at all.)"""
    out, err = run(native, how, "cuMemAlloc_v3", {"TESSERA_GPU_MEMORY_LIMIT": str(GiB)})
    assert out["held0"] <= GiB, err
    assert out["refused"] >= 1
    assert err.count("(cuMemAlloc_v3) refused") == 1, err


def test_a_renamed_driver_without_soname_is_refused(native) -> None:
    """Class 1: a copy of the driver with another name and no DT_SONAME, loaded by its full path
    while nothing named libcuda.so.1 can be loaded: the library cannot bind to it, so its hooked
    names are refused instead of handed out unhooked."""
    copy = Path(native.root) / "fake-nosoname" / "libgpu-renamed.so"
    out, err = run(native, "driver-path", str(copy), {"TESSERA_GPU_MEMORY_LIMIT": str(GiB)},
                   library_path=False)
    assert out["held0"] <= GiB, err
    assert "no libcuda.so.1 can be loaded by its soname" in err


def test_a_namespace_that_loads_the_driver_later_is_refused(native) -> None:
    """Class 1: dlmopen of a plugin that holds no driver at load time but dlopens libcuda later,
    inside its namespace, where no hook exists: every other namespace is refused up front."""
    plugin = native.program("liblateplugin.so")
    out, err = run(native, "dlmopen-late", str(plugin), {"TESSERA_GPU_MEMORY_LIMIT": str(GiB)})
    assert out["held0"] <= GiB, err
    assert "another link-map namespace refused" in err


def test_without_limits_nothing_is_refused(native) -> None:
    """Pass-through: the same lookups work when no limit is set."""
    out, err = run(native, "dlsym-newer", "cuMemAlloc_v3", {})
    assert out["refused"] == 0 and out["held0"] == 4 * GiB + CTX, err  # the driver's context too


@pytest.mark.parametrize("cls", ["env-clear", "env-rewrite", "preinit"])
def test_the_environment_is_read_once_at_load(native, cls: str) -> None:
    """Class 2: clearing the environment, rewriting the limit (setenv and in place) before the
    first CUDA call, or reaching the driver from .preinit_array while `environ` is NULL, leaves
    the limit the process was started with (before: 4 GiB under a 2 GiB limit)."""
    out, err = run(native, cls, "-", {"TESSERA_GPU_MEMORY_LIMIT": str(2 * GiB)})
    assert out["held0"] <= 2 * GiB, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["refused"] >= 1


def test_a_repointed_config_variable_changes_nothing(native, tmp_path: Path) -> None:
    """Class 2: TESSERA_GPU_CONFIG pointed at the program's own file (1000G) after load."""
    from tessera.isolation import DeviceShare
    from tessera.isolation.config import write_workload_files
    from tests.isolation.conftest import fake_uuids

    uuid = fake_uuids(native, H100)[0]
    mine = write_workload_files(tmp_path / "mine", [DeviceShare(0, uuid, 2 * GiB, 2 * GiB)])
    own = write_workload_files(tmp_path / "own", [DeviceShare(0, uuid, 1000 * GiB, 1000 * GiB)])
    out, err = run(native, "config-repoint", str(own.config_path),
                   {"TESSERA_GPU_CONFIG": str(mine.config_path)})
    assert out["held0"] <= 2 * GiB, err


def test_pool_memory_freed_by_the_synchronous_free_stays_charged(native) -> None:
    """Class 3: stream-ordered allocations freed through cuMemFree go back to their pool, which
    keeps them reserved: the charge follows the pool, as for cuMemFreeAsync (before: the charge
    was returned, 3 GiB held under a 2 GiB limit)."""
    out, err = run(native, "pool-sync-free", "-", {"TESSERA_GPU_MEMORY_LIMIT": str(2 * GiB)})
    assert out["held0"] <= 2 * GiB, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["refused"] >= 1


def test_each_contexts_heap_is_charged(native) -> None:
    """Class 3: cuCtxSetLimit reserves exist per context (the fake driver, like the real one,
    gives each context its own heap): a 512 MiB heap in four contexts takes 2 GiB, and each is
    charged (before: once per device, 3.4 GiB held under a 2 GiB limit)."""
    out, err = run(native, "ctx-heaps", "-", {"TESSERA_GPU_MEMORY_LIMIT": str(2 * GiB),
                                             "TESSERA_GPU_CONTEXT_OVERHEAD": str(16 * 2**20)})
    assert out["held0"] <= 2 * GiB, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["refused"] >= 1
