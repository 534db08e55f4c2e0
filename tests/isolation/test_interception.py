"""How calls reach the hooks: dlsym, cuGetProcAddress (both versions), direct linking."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.isolation.conftest import CTX, H100_BYTES, GiB, clean_env, run

LIMIT = {"TESSERA_GPU_MEMORY_LIMIT": "8Gi"}


@pytest.mark.parametrize(
    ("mode", "version", "extra"),
    [
        ("dlsym", None, {}),
        ("gpa", 12080, {}),
        ("gpa", 12000, {}),
        ("gpa1", 11040, {}),
        ("linked", None, {}),
        # the driver hands out addresses that differ from its exports: matched by name + version
        ("gpa", 12080, {"FAKE_CUDA_PROC_INTERNAL": "1"}),
    ],
)
def test_limit_enforced_on_every_lookup_path(native, probe, mode, version, extra):
    p = probe(clean_env(native, extra={**LIMIT, **extra}), mode, version)
    assert p("resolved")["missing"] == 0 or mode == "linked"
    p.start()
    assert p.info() == (8 * GiB - CTX, 8 * GiB)  # the context is charged
    a = p.alloc(5 * GiB)
    assert p(f"alloc {4 * GiB}")["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert p(f"aalloc_ptsz {4 * GiB} ptds")["rc"] == 2
    assert p(f"aalloc {4 * GiB} legacy")["rc"] == 2
    assert p(f"free {a}")["rc"] == 0
    p.alloc(8 * GiB - CTX)


def test_without_the_library_the_fake_driver_allows_everything(native, probe):
    p = probe(clean_env(native, preload=False, extra=LIMIT)).start()
    p.alloc(40 * GiB)
    assert p.info()[1] == H100_BYTES


def test_no_limit_configured_is_pure_pass_through(native, probe):
    p = probe(clean_env(native)).start()
    # the driver's own figures: its context holds CTX of the device (the fake's default)
    assert p.info() == (H100_BYTES - CTX, H100_BYTES)
    a = p.alloc(H100_BYTES - CTX)
    assert p("alloc 1")["rc"] == 2  # the (fake) driver's own out-of-memory
    assert p(f"free {a}")["rc"] == 0
    assert p("total 0")["total"] == H100_BYTES
    assert p.stderr() == ""


def test_dlsym_keeps_rtld_next_and_rtld_default_relative_to_the_caller(native):
    plain = run(native, "nextcheck", clean_env(native, preload=False))
    hooked = run(native, "nextcheck", clean_env(native, extra=LIMIT))
    assert plain.stdout.strip() == "next=2 local_default=42"
    assert hooked.stdout.strip() == plain.stdout.strip()


DLADDR = r"""
import ctypes, ctypes.util, sys
class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
cuda = ctypes.CDLL("libcuda.so.1")
for name in sys.argv[1:]:
    addr = ctypes.cast(getattr(cuda, name), ctypes.c_void_p)
    info = Info()
    libc.dladdr(addr, ctypes.byref(info))
    print(name, info.fname.decode().rsplit("/", 1)[-1])
"""


def test_only_exact_hooked_names_are_interposed(native):
    names = ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuGetProcAddress_v2",
             "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap",
             "cuDeviceGetCount",
             "cuCtxGetDevice", "cuDevicePrimaryCtxRetain", "cuMemCreate"]
    out = subprocess.run([sys.executable, "-c", DLADDR, *names], env=clean_env(native, extra=LIMIT),
                         capture_output=True, text=True, check=True).stdout
    owner = dict(line.split() for line in out.splitlines())
    hooked = {"cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuGetProcAddress_v2",
              "cuDevicePrimaryCtxRetain", "cuMemCreate", "cuMemMap"}
    for name in names:
        expected = "libtessera-cuda.so" if name in hooked else "libcuda.so.1"
        assert owner[name] == expected, (name, owner[name])


def test_nested_cu_get_proc_address_returns_the_wrapper(native, probe):
    # cuprobe "gpa" fetches cuGetProcAddress through cuGetProcAddress_v2 and resolves everything
    # with the result: a limit that holds proves the nested lookup stayed hooked.
    p = probe(clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "1Gi"}), "gpa", 12080).start()
    assert p(f"alloc {GiB + 1}")["rc"] == 2
    assert p(f"create {2 * GiB} 0")["rc"] == 2


def test_variant_the_driver_does_not_export_is_still_hooked(native, probe):
    # a driver that hands out cuMemAllocAsync_ptsz only through cuGetProcAddress
    env = clean_env(native, extra=LIMIT)
    env["LD_LIBRARY_PATH"] = f"{native.root / 'fake-noptsz'}:{native.fake_dir}"
    p = probe(env, "gpa", 12080).start()
    a = p(f"aalloc_ptsz {5 * GiB} ptds")
    assert a["rc"] == 0
    assert p(f"aalloc_ptsz {4 * GiB} ptds")["rc"] == 2
    assert p.info()[0] == 3 * GiB - CTX
    assert p(f"afree_ptsz {a['ptr']} ptds")["rc"] == 0
    # freed to the device's pool, which keeps it reserved until a synchronisation: still charged
    assert p.info()[0] == 3 * GiB - CTX


@pytest.mark.parametrize("mode", ["dlsym", "gpa"])
def test_driver_loaded_by_path_is_the_one_hooked(native, probe, mode):
    # the program loads one libcuda.so.1 by path (as with the CUDA forward-compat package) while
    # the search path would find another: the library must use the one already loaded
    env = clean_env(native, extra={**LIMIT, "CUPROBE_LIBCUDA": str(native.fake_dir / "libcuda.so.1")})
    env["LD_LIBRARY_PATH"] = str(native.root / "fake-noptsz")
    p = probe(env, mode, 12080).start()
    a = p.alloc(5 * GiB)
    assert p(f"alloc {4 * GiB}")["rc"] == 2
    assert p(f"free {a}")["rc"] == 0
    assert p.stderr() == ""


@pytest.mark.parametrize(("version", "owner"), [(12080, "libtessera-cuda.so"), (14000, "?")])
def test_an_abi_newer_than_the_library_is_never_given_an_older_hook(native, probe, version, owner):
    # this fake driver has a cuMemAlloc_v3 for CUDA "14.0": the _v2 hook must not stand in for it
    env = clean_env(native, extra={**LIMIT, "FAKE_CUDA_DRIVER_VERSION": "14000"})
    p = probe(env, "gpa", version)
    # CUDA 14.0 asks for an ABI the library does not know: refused (no entry point), said out loud
    assert p.raw("owner_alloc") == f"owner={owner}"
    warned = "an ABI this library does not know" in p.stderr()
    assert warned == (version == 14000)  # said out loud, even with logging at its default
