"""Issue #28, third pass: memory the driver holds outside the allocation calls
(native/tests/adversary5.c on the fake driver, which models each path as the real driver does:
native/fakedriver/fake_extra.c). Each program prints what the fake driver holds for the process on
devices 0 and 1 (its own count, not the library's); the limit is 2 GiB per device. Against main's
library before this change every module/library and prefetch path held 3 GiB under the 2 GiB limit
(5 GiB for module-big) and GL registration and prefetches went through; docs/isolation.md "Every
path" lists them."""

from __future__ import annotations

import subprocess

import pytest

from tests.isolation.conftest import GiB, clean_env

MiB = 2**20
LIMIT = 2 * GiB
TWO = "NVIDIA H100 80GB HBM3=81559Mi;NVIDIA H100 80GB HBM3=81559Mi"
NOT_SUPPORTED = 801


def run(native, *args: str, limited: bool = True) -> tuple[dict[str, int], str]:  # type: ignore[no-untyped-def]
    extra = {"FAKE_GPU_CONTEXT_BYTES": str(64 * MiB)}
    if limited:
        extra |= {"TESSERA_GPU_MEMORY_LIMIT": str(LIMIT), "TESSERA_GPU_CONTEXT_OVERHEAD": str(64 * MiB)}
    env = clean_env(native, devices=TWO, preload=limited, extra=extra)
    result = subprocess.run([str(native.program("adversary5")), *args], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    out: dict[str, int] = {}
    for line in result.stdout.split("\n"):
        out |= {k: int(v) for k, v in (t.split("=") for t in line.split())}
    return out, result.stderr


@pytest.mark.parametrize("cls", ["module-data", "module-ex", "module-fatbin", "module-file", "module-gpa",
                                 "library-data", "library-file", "library-lazy"])
def test_module_globals_are_charged(native, cls: str) -> None:
    """An image with 1 GiB of __device__ variables, loaded by each loader (and lazily, by
    cuLibraryGetModule for a library loaded before any context): the load is measured and
    charged, so filling the device stops at the limit (before: 3 GiB held under 2 GiB)."""
    out, err = run(native, cls)
    assert out["rc"] == 0, err
    assert out["held0"] <= LIMIT, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["held0"] >= LIMIT - 64 * MiB  # the module's GiB is really held, and the fill went on to the limit


def test_a_module_over_the_limit_is_unloaded_and_refused(native) -> None:
    out, err = run(native, "module-big")
    assert out["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert out["held0"] <= LIMIT, err


def test_an_unloaded_modules_charge_comes_back(native) -> None:
    out, err = run(native, "module-unload")
    assert out["rc"] == 0
    assert out["held0"] >= LIMIT - 64 * MiB, err  # the fill got the module's GiB back


@pytest.mark.parametrize("cls", ["prefetch", "prefetch-ptsz", "prefetch-v2", "prefetch-gpa"])
def test_managed_memory_is_not_moved_to_another_limited_device(native, cls: str) -> None:
    """1 GiB of managed memory charged to device 0, prefetched to device 1 (each ABI, and through
    cuGetProcAddress), then device 1 filled: refused, with one line (before: 3 GiB on device 1)."""
    out, err = run(native, cls)
    assert out["rc"] == NOT_SUPPORTED
    assert out["held1"] <= LIMIT, f"{out['held1'] / GiB:.2f} GiB held on device 1\n{err}"
    assert "managed memory charged to another device" in err


def test_managed_memory_may_go_home_or_to_the_host(native) -> None:
    out, err = run(native, "prefetch-home")
    assert out["rc"] == 0, err


def test_preferred_location_on_another_device_is_refused(native) -> None:
    out, _ = run(native, "advise")
    assert out["rc"] == NOT_SUPPORTED
    passthrough, _ = run(native, "advise", limited=False)
    assert passthrough["rc"] == 0  # the fake accepts it: the refusal is the library's


def test_graphics_interop_is_refused(native) -> None:
    """A GL buffer's memory is allocated by the GL driver, outside CUDA: registering it with CUDA
    is refused while limits are active (one line); without limits the fake maps it."""
    out, err = run(native, "gl")
    assert out["rc"] == NOT_SUPPORTED
    assert "cuGraphicsGLRegisterBuffer refused" in err
    passthrough, _ = run(native, "gl", limited=False)
    assert passthrough["rc"] == 0


def test_pool_sharing_is_refused(native) -> None:
    """Stream-ordered pools shared between processes, on a fake that implements them as the real
    driver does (passthrough: export, import, pointer export/import all succeed): export, import
    of another process's descriptor and pointer import are each refused while limits are active."""
    passthrough, err = run(native, "pool-export", limited=False)
    assert passthrough["rc"] == 0 and passthrough["import_pointer"] == 0, err
    out, err = run(native, "pool-export")
    assert out["rc"] == NOT_SUPPORTED and out["import_pointer"] == NOT_SUPPORTED, err
    assert "cuMemPoolExportToShareableHandle refused" in err
    holder = subprocess.Popen([str(native.program("adversary5")), "pool-hold"],
                              env=clean_env(native, devices=TWO, preload=False), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        fields = dict(t.split("=") for t in holder.stdout.readline().split())
        path = f"/proc/{fields['pid']}/fd/{fields['fd']}"
        free, _ = run(native, "pool-import", path, limited=False)
        assert free["rc"] == 0 and free["import_pointer"] == 0
        out, err = run(native, "pool-import", path)
        assert out["rc"] == NOT_SUPPORTED and out["import_pointer"] == NOT_SUPPORTED, err
        assert "cuMemPoolImportFromShareableHandle refused" in err
    finally:
        holder.communicate("", timeout=10)


def test_green_contexts_are_charged_like_contexts(native) -> None:
    """16 green contexts (CUDA 12.4, cuGreenCtxCreate), each holding what a context holds (64 MiB
    on the fake here), then a fill: each is charged the per-context overhead, so the fill stops at
    the limit (before: uncharged, 3 GiB held under 2 GiB)."""
    out, err = run(native, "green")
    assert out["held0"] <= LIMIT, f"{out['held0'] / GiB:.2f} GiB held over a 2 GiB limit\n{err}"
    assert out["held0"] >= LIMIT - 64 * MiB
