"""Accounting and limits for every hooked allocation path, and what the program is told."""

from __future__ import annotations

from tessera.isolation import read_region
from tests.isolation.conftest import CTX, CTX_V100, H100_BYTES, V100X4, GiB, clean_env

MiB = 2**20


def limited(native, limit="8Gi", **extra):
    return clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": limit, **extra})


def test_limit_reached_exactly_and_exceeded_by_one_byte(native, probe):
    p = probe(limited(native)).start()  # the primary context is charged CTX
    a = p.alloc(8 * GiB - CTX)
    assert p.info() == (0, 8 * GiB)
    assert p("alloc 1")["rc"] == 2
    assert p(f"free {a}")["rc"] == 0
    assert p.info() == (8 * GiB - CTX, 8 * GiB)
    p.alloc(3 * GiB)
    p.alloc(5 * GiB - CTX)
    assert p("alloc 1")["rc"] == 2


def test_refusals_are_quiet_by_default_and_logged_on_request(native, probe):
    quiet = probe(limited(native)).start()
    assert quiet(f"alloc {9 * GiB}")["rc"] == 2
    assert quiet.stderr() == ""
    loud = probe(limited(native, TESSERA_ISOLATION_LOG="debug")).start()
    assert loud(f"alloc {9 * GiB}")["rc"] == 2
    assert "refused: the workload's limit is 8589934592 bytes" in loud.stderr()


def test_memory_queries_report_the_limit_and_are_null_safe(native, probe):
    p = probe(limited(native)).start()
    p.alloc(3 * GiB)
    assert p.info() == (5 * GiB - CTX, 8 * GiB)
    assert p("total 0")["total"] == 8 * GiB
    # NULL arguments: the driver's answer comes back, nothing is written, nothing crashes
    for which in ("nullfree", "nulltotal", "nullboth"):
        assert p(f"info {which}")["rc"] == 1
    assert p("total 0 null")["rc"] == 1
    assert p(f"alloc_nullptr {GiB}")["rc"] == 1  # refused by the driver: nothing stays charged
    assert p.info() == (5 * GiB - CTX, 8 * GiB)


def test_free_never_exceeds_the_physically_free_memory(native, probe):
    # another tenant holds all but 2 GiB of the device
    p = probe(limited(native, FAKE_GPU_USED_0=str(H100_BYTES - 2 * GiB))).start()
    assert p.info() == (2 * GiB - CTX, 8 * GiB)  # its own context holds CTX of those 2 GiB


def test_limit_above_the_device_reports_the_device(native, probe):
    p = probe(limited(native, limit="200Gi")).start()
    assert p.info() == (H100_BYTES - CTX, H100_BYTES)
    assert p("total 0")["total"] == H100_BYTES


def test_usage_above_the_limit_clamps_free_to_zero(native, probe, tmp_path):
    region = str(tmp_path / "region")
    # the workload's first process registers 8 GiB and uses 6 GiB and a context; a later process
    # with a smaller limit of its own (4 GiB) sees more used than its limit: free is 0, never wrapped
    big = probe(limited(native, TESSERA_GPU_SHARED_REGION=region)).start()
    small = probe(limited(native, limit="4Gi", TESSERA_GPU_SHARED_REGION=region)).start()
    big.alloc(6 * GiB)
    assert small.info() == (0, 4 * GiB)
    assert small("alloc 1")["rc"] == 2


def test_the_first_processs_limit_holds_for_the_workload(native, probe, tmp_path):
    """#28 class 5: per device (by UUID) the region keeps the first writer's limit and every
    process enforces the smaller of its own and the region's: a later process of the workload
    with a bigger limit of its own (a rewritten variable) does not raise it."""
    region = str(tmp_path / "region")
    small = probe(limited(native, limit="4Gi", TESSERA_GPU_SHARED_REGION=region)).start()
    assert small.info()[1] == 4 * GiB
    big = probe(limited(native, TESSERA_GPU_SHARED_REGION=region)).start()
    assert big.info()[1] == 4 * GiB
    assert big(f"alloc {6 * GiB}")["rc"] == 2


def test_untracked_frees_go_to_the_driver_untouched(native, probe):
    p = probe(limited(native)).start()
    other = p(f"unhooked {GiB}")  # memory the library never saw
    assert other["rc"] == 0
    assert p.info() == (8 * GiB - CTX, 8 * GiB)
    assert p(f"free {other['ptr']}")["rc"] == 0
    assert p.info() == (8 * GiB - CTX, 8 * GiB)
    assert p("free 0x1234000")["rc"] == 1  # the driver's own error for a bad pointer
    a = p.alloc(GiB)
    assert p(f"free {a}")["rc"] == 0
    assert p(f"free {a}")["rc"] == 1  # double free: the driver answers
    assert p.info() == (8 * GiB - CTX, 8 * GiB)


def test_pitch_allocations_are_charged_by_the_pitch_the_driver_chose(native, probe):
    p = probe(limited(native, limit="65Mi", TESSERA_GPU_CONTEXT_OVERHEAD="1Mi")).start()
    r = p("pitch 1000 1000 4")
    assert r["rc"] == 0 and r["pitch"] == 1024
    assert p.info()[0] == 64 * MiB - 1024 * 1000
    assert p("pitch 70000 1000 4")["rc"] == 2
    assert p(f"free {r['ptr']}")["rc"] == 0
    assert p.info()[0] == 64 * MiB


def test_managed_memory_is_charged_to_the_current_device(native, probe):
    p = probe(limited(native)).start()
    r = p(f"managed {6 * GiB}")
    assert r["rc"] == 0
    assert p(f"managed {3 * GiB}")["rc"] == 2
    assert p.info()[0] == 2 * GiB - CTX
    assert p(f"free {r['ptr']}")["rc"] == 0
    assert p.info()[0] == 8 * GiB - CTX


def test_stream_ordered_allocation(native, probe):
    p = probe(limited(native)).start()
    s = p("stream")["stream"]
    a = p(f"aalloc {3 * GiB} {s}")
    b = p(f"aalloc_ptsz {3 * GiB} ptds")
    assert a["rc"] == 0 and b["rc"] == 0
    assert p(f"aalloc {3 * GiB} null")["rc"] == 2
    pool = p("pool 0")["pool"]
    c = p(f"palloc {GiB} {pool} {s}")
    assert c["rc"] == 0
    assert p(f"palloc_ptsz {2 * GiB} {pool} ptds")["rc"] == 2
    default_pool = p("defpool 0")["pool"]
    assert p(f"palloc {GiB} {default_pool} {s}")["rc"] == 2  # the context holds CTX
    d = p(f"palloc {GiB - CTX} {default_pool} {s}")
    assert d["rc"] == 0
    host_pool = p("pool host")["pool"]
    host = p(f"palloc {20 * GiB} {host_pool} {s}")  # host memory: not the GPU's
    assert host["rc"] == 0
    assert p.info()[0] == 0
    assert p(f"afree {a['ptr']} {s}")["rc"] == 0
    assert p(f"afree_ptsz {b['ptr']} ptds")["rc"] == 0
    assert p(f"afree {c['ptr']} {s}")["rc"] == 0
    assert p(f"afree {host['ptr']} {s}")["rc"] == 0
    # freed memory stays in the pools (reserved on the device) until a synchronisation
    assert p.info()[0] == 0
    assert p(f"alloc {GiB}")["rc"] == 2
    assert p("sync")["rc"] == 0
    assert p.info()[0] == 7 * GiB
    assert p(f"afree {d['ptr']} {s}")["rc"] == 0
    assert p(f"pooldestroy {pool}")["rc"] == 0


def test_vmm_allocations_are_charged_to_the_device_in_their_properties(native, probe):
    p = probe(clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi"})).start(0)
    h1 = p(f"create {GiB} 1")  # current context is device 0; the memory lives on device 1
    assert h1["rc"] == 0
    assert p(f"create {GiB + 2 * MiB} 1")["rc"] == 2
    assert p.info() == (2 * GiB - CTX_V100, 2 * GiB)  # device 0 untouched (but its context)
    assert p(f"create {2 * GiB - CTX_V100} 0")["rc"] == 0
    assert p.info() == (0, 2 * GiB)
    assert p(f"create {4 * GiB} host")["rc"] == 0  # host memory is not charged
    assert p(f"create_nullprop {GiB}")["rc"] == 1  # driver's own error, no crash
    assert p(f"create {GiB} 17")["rc"] == 101  # device outside the workload
    assert p(f"releaseh {h1['handle']}")["rc"] == 0
    assert p("releaseh 0x999")["rc"] == 1  # unknown handle: the driver answers
    p2 = p(f"create {2 * GiB} 1")
    assert p2["rc"] == 0
    assert p("ctx 1")["rc"] == 2  # no room left on device 1 for a context


def test_context_overhead_is_charged_per_context(native, probe):
    p = probe(limited(native, TESSERA_GPU_CONTEXT_OVERHEAD="1Gi")).start()
    assert p.info() == (7 * GiB, 8 * GiB)
    assert p("ctx 0")["rc"] == 0  # a second retain of the primary context costs nothing more
    assert p.info()[0] == 7 * GiB
    ctxs = [p(f"ctxcreate 0 {v}") for v in ("v2", "v3", "v4")]
    assert all(c["rc"] == 0 for c in ctxs)
    assert p.info()[0] == 4 * GiB
    assert p(f"alloc {4 * GiB + 1}")["rc"] == 2
    for c in ctxs:
        assert p(f"ctxdestroy {c['ctx']}")["rc"] == 0
    assert p("ctx 0")["rc"] == 0
    assert p.info()[0] == 7 * GiB
    for _ in range(3):
        assert p("release 0")["rc"] == 0
    # the primary context is gone: its overhead is released
    again = p("ctxcreate 0 v2")
    assert again["rc"] == 0
    assert p.info()[0] == 7 * GiB


def test_context_larger_than_the_limit_is_refused(native, probe):
    p = probe(limited(native, limit="1Gi", TESSERA_GPU_CONTEXT_OVERHEAD="2Gi"))
    assert p("init")["rc"] == 0
    assert p("ctx 0")["rc"] == 2


def test_primary_context_reset_releases_its_allocations(native, probe):
    p = probe(limited(native)).start()
    p.alloc(6 * GiB)
    assert p("reset 0")["rc"] == 0
    assert p("ctx 0")["rc"] == 0
    assert p.info() == (8 * GiB - CTX, 8 * GiB)


def test_four_devices_each_get_their_own_limit(native, probe):
    env = clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT": "2Gi",
                                                    "TESSERA_GPU_MEMORY_LIMIT_3": "1Gi"})
    p = probe(env)
    assert p("init")["rc"] == 0
    for dev in range(4):
        assert p(f"ctx {dev}")["rc"] == 0
        expected = GiB if dev == 3 else 2 * GiB
        assert p.info() == (expected - CTX_V100, expected)
        assert p(f"total {dev}")["total"] == expected
        p.alloc(expected - CTX_V100)
        assert p("alloc 1")["rc"] == 2
    assert p("ctx 0")["rc"] == 0
    assert p.info() == (0, 2 * GiB)


def test_per_index_limit_alone_leaves_other_devices_unlimited(native, probe):
    env = clean_env(native, devices=V100X4, extra={"TESSERA_GPU_MEMORY_LIMIT_1": "1Gi"})
    p = probe(env).start(0)
    assert p.info() == (16 * GiB - CTX_V100, 16 * GiB)  # the driver's figures, its context in
    assert p("ctx 1")["rc"] == 0
    assert p.info() == (GiB - CTX_V100, GiB)


def test_vmm_charge_lives_until_the_handle_and_every_mapping_are_gone(native, probe):
    # the pattern of allocators that map, then release the handle at once (memory stays alive)
    p = probe(limited(native, limit="4Gi")).start()
    h = p(f"create {2 * GiB} 0")["handle"]
    va = p(f"vreserve {4 * GiB}")["ptr"]
    assert p(f"map {va} {GiB} {h}")["rc"] == 0
    assert p(f"map {va + GiB} {GiB} {h}")["rc"] == 0
    assert p(f"releaseh {h}")["rc"] == 0
    assert p.info()[0] == 2 * GiB - CTX  # still mapped: still charged
    assert p(f"create {3 * GiB} 0")["rc"] == 2
    again = p(f"retainh {va}")
    assert again["rc"] == 0 and again["handle"] == h
    assert p(f"unmap {va} {2 * GiB}")["rc"] == 0  # both mappings in one call
    assert p.info()[0] == 2 * GiB - CTX  # the retained reference keeps it
    assert p(f"releaseh {h}")["rc"] == 0
    assert p.info()[0] == 4 * GiB - CTX
    assert p(f"releaseh {h}")["rc"] == 1  # already gone: the driver's answer, no double credit
    assert p.info()[0] == 4 * GiB - CTX


def test_vmm_unmap_of_memory_the_library_never_saw(native, probe):
    p = probe(limited(native, limit="4Gi")).start()
    h = p(f"create {2 * GiB} host")["handle"]  # host memory: not charged, not tracked
    va = p(f"vreserve {2 * GiB}")["ptr"]
    assert p(f"map {va} {2 * GiB} {h}")["rc"] == 0
    assert p(f"unmap {va} {2 * GiB}")["rc"] == 0
    assert p(f"releaseh {h}")["rc"] == 0
    assert p.info()[0] == 4 * GiB - CTX


def test_pre_cuda_11_primary_context_release_and_reset(native, probe, tmp_path):
    region = tmp_path / "region"
    p = probe(limited(native, TESSERA_GPU_CONTEXT_OVERHEAD="1Gi",
                      TESSERA_GPU_SHARED_REGION=str(region))).start()

    def used() -> int:
        return next(iter(read_region(region).values())).used_bytes

    assert used() == GiB
    assert p("release1 0")["rc"] == 0  # the old (CUDA 10) name
    assert used() == 0
    assert p("ctx 0")["rc"] == 0
    p.alloc(2 * GiB)
    assert used() == 3 * GiB
    assert p("reset1 0")["rc"] == 0
    assert used() == 0


def estimated_array_bytes(w, h, d, elem, levels=1):
    """The library's documented estimate: per level, w*h*d*element rounded up to 64 KiB."""
    total = 0
    for level in range(levels):
        size = max(1, w >> level) * max(1, h >> level) * max(1, d >> level) * elem
        total += -(-size // (64 * 1024)) * 64 * 1024
    return total


def test_cuda_arrays_are_charged_an_estimate(native, probe):
    p = probe(limited(native, limit="65Mi", TESSERA_GPU_CONTEXT_OVERHEAD="1Mi")).start()
    a = p("array 4096 4096 0x01 1")  # 16 MiB of uint8
    assert a["rc"] == 0
    assert p.info()[0] == 48 * MiB
    assert p("array3d 1024 1024 64 0x20 1 0")["rc"] == 2  # 256 MiB of float
    sparse = p("array3d 1024 1024 64 0x20 1 0x40")  # sparse: no memory until mapped
    assert sparse["rc"] == 0
    assert p.info()[0] == 48 * MiB
    mip = p("mipmap 1024 1024 0 0x20 4 11")  # 16 MiB at level 0, then a quarter per level
    assert mip["rc"] == 0
    assert p.info()[0] == 48 * MiB - estimated_array_bytes(1024, 1024, 1, 16, 11)
    odd = p("array 1000 1000 0xb0 1")  # a format the library does not know: 16 bytes/element
    assert odd["rc"] == 0
    assert p(f"arraydestroy {odd['handle']}")["rc"] == 0
    assert p(f"mipdestroy {mip['handle']}")["rc"] == 0
    assert p(f"arraydestroy {a['handle']}")["rc"] == 0
    assert p(f"arraydestroy {sparse['handle']}")["rc"] == 0
    assert p.info()[0] == 64 * MiB
    assert p("arraydestroy 0x1234")["rc"] == 400  # the driver's own answer


def test_debug_log_names_the_library_it_found_itself_at(native, probe):
    p = probe(limited(native, TESSERA_ISOLATION_LOG="debug")).start()
    p.alloc(GiB)
    err = p.stderr()
    assert f"loaded from {native.library}" in err
    assert "limit 8589934592 bytes" in err
