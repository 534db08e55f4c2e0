/*
 * Memory the driver holds outside the allocation calls (issue #28, third pass):
 *
 *  - Modules and libraries. Loading a module (cuModuleLoad, ...Data, ...DataEx, ...FatBinary) or
 *    a library (cuLibraryLoadData, cuLibraryLoadFromFile) allocates its code and __device__
 *    variables on the context's device; with lazy loading that happens later, in the calls that
 *    first need it (cuLibraryGetModule/Kernel/Global/Managed, cuKernelGetFunction,
 *    cuModuleGetFunction, cuModuleGetGlobal). The driver does not say how much, so each of these
 *    calls is measured: the drop in the device's free memory across the call (cuMemGetInfo),
 *    less what this process charged meanwhile (its other threads' allocations and frees), is
 *    charged to the module or library until it is unloaded. Measured calls are serialised with
 *    context creations (ts_measure_mu). A load that does not fit the limit is unloaded again and
 *    refused (CUDA_ERROR_OUT_OF_MEMORY); so is a lazy load that does not fit, with the module or
 *    library it loaded into (its memory cannot be given back otherwise; a kernel's library found
 *    with cuKernelGetLibrary; where none can be found the memory is charged over the limit).
 *  - Green contexts (cuGreenCtxCreate, CUDA 12.4): each is charged what a context on its device is
 *    charged (measured or configured overhead), until cuGreenCtxDestroy.
 *  - Managed memory placed on another device: cuMemPrefetchAsync[_v2][_ptsz] to, or
 *    cuMemAdvise[_v2](SET_PREFERRED_LOCATION) of, a limited device other than the one the
 *    allocation is charged to is refused (CUDA_ERROR_NOT_SUPPORTED): its pages would move there
 *    uncharged. The host, the allocation's own device and unlimited devices are allowed; batch
 *    prefetches are refused while limits are active.
 *  - Graphics and external-memory interop (cuGraphics*Register*, mapping, cuImportExternalMemory,
 *    EGL streams): the memory is allocated by another driver API (GL, Vulkan, EGL, VDPAU) the
 *    library does not interpose, so it cannot be charged: refused while limits are active.
 * Every refusal is logged once with its reason.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "state.h"

#define REAL(name, type) ((type)ts_real.name)

typedef CUresult (*meminfo_fn)(size_t *, size_t *);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*unload_fn)(void *);

static ts_table g_loaded; /* module or library handle -> what its loads were charged (under ts_tab_mu) */

typedef struct {
    int on, rdev;
    uint64_t limit, mine0;
    size_t free0;
} load_probe;

/* Before a call that may load module memory into the current context. */
static CUresult probe_begin(load_probe *p, const char *what) {
    memset(p, 0, sizeof *p);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return CUDA_SUCCESS;
    if (mode == TS_MODE_FAILED) {
        ts_report_refusal(what);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int ord;
    if (ts_current_ordinal(&ord) != CUDA_SUCCESS) return CUDA_SUCCESS; /* no context: nothing is loaded now */
    ts_dev *d = ts_device(ord);
    if (!d || !d->limited) return CUDA_SUCCESS;
    if (d->rdev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t total;
    pthread_mutex_lock(&ts_measure_mu);
    if (!ts_real.cuMemGetInfo_v2 || REAL(cuMemGetInfo_v2, meminfo_fn)(&p->free0, &total) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&ts_measure_mu);
        ts_log_once("load-measure", "%s refused: the device's free memory cannot be read, so the module memory "
                    "it loads cannot be charged (fail closed)", what);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    p->on = 1;
    p->rdev = d->rdev;
    p->limit = d->limit;
    p->mine0 = ts_region_mine(d->rdev);
    return CUDA_SUCCESS;
}

/* After it: charges what the call loaded to key. undo (may be NULL) unloads key when it does not
 * fit the limit. */
static CUresult probe_end(load_probe *p, CUresult rc, uint64_t key, unload_fn undo, const char *what) {
    if (!p->on) return rc;
    size_t free1 = p->free0, total;
    if (rc == CUDA_SUCCESS && REAL(cuMemGetInfo_v2, meminfo_fn)(&free1, &total) != CUDA_SUCCESS) free1 = 0;
    int64_t mine = (int64_t)(ts_region_mine(p->rdev) - p->mine0);
    int64_t loaded = (int64_t)(p->free0 - free1) - mine;
    if (rc == CUDA_SUCCESS && loaded > 0) {
        if (ts_region_reserve(p->rdev, (uint64_t)loaded, p->limit) == 1) {
            pthread_mutex_lock(&ts_tab_mu);
            ts_record *r = ts_table_find(&g_loaded, key);
            int bad = 0;
            if (r) r->size += (uint64_t)loaded;
            else bad = ts_table_put(&g_loaded, key, (uint64_t)loaded, p->rdev, -1, TS_KIND_OTHER);
            pthread_mutex_unlock(&ts_tab_mu);
            if (bad) ts_log(TS_LOG_WARN, "cannot record module memory of %s; it stays charged", what);
            TS_DEBUG("%s loaded %lld bytes of module memory; charged", what, (long long)loaded);
        } else {
            /* Unloaded again: what the key's earlier loads were charged goes with it. A kernel
             * whose library cannot be found keeps its memory: charged over the limit (so nothing
             * more fits until it is unloaded), never left uncharged. */
            ts_record r;
            if (undo && undo((void *)(uintptr_t)key) == CUDA_SUCCESS) {
                pthread_mutex_lock(&ts_tab_mu);
                int had = ts_table_take(&g_loaded, key, &r);
                pthread_mutex_unlock(&ts_tab_mu);
                if (had) ts_region_release(r.rdev, r.size);
            } else if (ts_region_reserve(p->rdev, (uint64_t)loaded, UINT64_MAX) == 1) {
                pthread_mutex_lock(&ts_tab_mu);
                ts_record *e = ts_table_find(&g_loaded, key);
                if (e) e->size += (uint64_t)loaded;
                else ts_table_put(&g_loaded, key, (uint64_t)loaded, p->rdev, -1, TS_KIND_OTHER);
                pthread_mutex_unlock(&ts_tab_mu);
            }
            TS_INFO("%s refused: the module memory it loaded (%lld bytes) does not fit the workload's limit", what,
                    (long long)loaded);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&ts_measure_mu);
    return rc;
}

/* key_expr is evaluated after the call: the handle it made (a load) or the one it was given. */
#define MEASURED(name, key_expr, undo, call)                         \
    do {                                                             \
        load_probe p_;                                               \
        CUresult rc_ = probe_begin(&p_, #name);                      \
        if (rc_ != CUDA_SUCCESS) return rc_;                         \
        rc_ = (call);                                                \
        uint64_t key_ = rc_ == CUDA_SUCCESS ? (uint64_t)(uintptr_t)(key_expr) : 0; \
        return probe_end(&p_, rc_, key_, undo, #name);               \
    } while (0)

typedef void *handle;
static CUresult unload_module(void *m) { return REAL(cuModuleUnload, unload_fn)(m); }
static CUresult unload_library(void *l) { return REAL(cuLibraryUnload, unload_fn)(l); }
/* A kernel's library (cuKernelGetLibrary, CUDA 12.5), unloaded; CUDA_ERROR_NOT_FOUND without it. */
static CUresult unload_kernel_library(void *k) {
    void *lib = NULL;
    if (!ts_real.cuKernelGetLibrary || REAL(cuKernelGetLibrary, CUresult(*)(void **, void *))(&lib, k) != CUDA_SUCCESS ||
        !lib)
        return CUDA_ERROR_NOT_FOUND;
    ts_record r;
    pthread_mutex_lock(&ts_tab_mu);
    int had = ts_table_take(&g_loaded, (uint64_t)(uintptr_t)lib, &r);
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = unload_library(lib);
    if (had && rc == CUDA_SUCCESS) ts_region_release(r.rdev, r.size);
    return rc;
}

CUresult ts_hook_cuModuleLoad(void **m, const char *path) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleLoad);
    MEASURED(cuModuleLoad, m ? *m : NULL, unload_module,
             REAL(cuModuleLoad, CUresult(*)(void **, const char *))(m, path));
}
CUresult ts_hook_cuModuleLoadData(void **m, const void *image) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleLoadData);
    MEASURED(cuModuleLoadData, m ? *m : NULL, unload_module,
             REAL(cuModuleLoadData, CUresult(*)(void **, const void *))(m, image));
}
CUresult ts_hook_cuModuleLoadDataEx(void **m, const void *image, unsigned n, void *opts, void **vals) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleLoadDataEx);
    MEASURED(cuModuleLoadDataEx, m ? *m : NULL, unload_module,
             REAL(cuModuleLoadDataEx, CUresult(*)(void **, const void *, unsigned, void *, void **))(m, image, n, opts,
                                                                                                   vals));
}
CUresult ts_hook_cuModuleLoadFatBinary(void **m, const void *fatbin) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleLoadFatBinary);
    MEASURED(cuModuleLoadFatBinary, m ? *m : NULL, unload_module,
             REAL(cuModuleLoadFatBinary, CUresult(*)(void **, const void *))(m, fatbin));
}
CUresult ts_hook_cuModuleGetFunction(void **f, void *m, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleGetFunction);
    MEASURED(cuModuleGetFunction, m, unload_module, REAL(cuModuleGetFunction, CUresult(*)(void **, void *, const char *))(f, m, name));
}
CUresult ts_hook_cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, void *m, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleGetGlobal_v2);
    MEASURED(cuModuleGetGlobal_v2, m, unload_module,
             REAL(cuModuleGetGlobal_v2, CUresult(*)(CUdeviceptr *, size_t *, void *, const char *))(dptr, bytes, m, name));
}

/* The pre-3.2 ABI (32-bit pointer and size), still exported by drivers. */
CUresult ts_hook_cuModuleGetGlobal(CUdeviceptr_v1 *dptr, unsigned int *bytes, void *m, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleGetGlobal);
    MEASURED(cuModuleGetGlobal, m, unload_module,
             REAL(cuModuleGetGlobal, CUresult(*)(CUdeviceptr_v1 *, unsigned int *, void *, const char *))(dptr, bytes, m,
                                                                                                         name));
}

typedef CUresult (*libload_fn)(void **, const void *, void *, void **, unsigned, void *, void **, unsigned);
CUresult ts_hook_cuLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
                                   unsigned nl) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryLoadData);
    MEASURED(cuLibraryLoadData, lib ? *lib : NULL, unload_library,
             REAL(cuLibraryLoadData, libload_fn)(lib, code, jo, jv, nj, lo, lv, nl));
}
CUresult ts_hook_cuLibraryLoadFromFile(void **lib, const char *path, void *jo, void **jv, unsigned nj, void *lo,
                                       void **lv, unsigned nl) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryLoadFromFile);
    MEASURED(cuLibraryLoadFromFile, lib ? *lib : NULL, unload_library,
             REAL(cuLibraryLoadFromFile, libload_fn)(lib, path, jo, jv, nj, lo, lv, nl));
}
CUresult ts_hook_cuLibraryGetModule(void **m, void *lib) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryGetModule);
    MEASURED(cuLibraryGetModule, lib, unload_library, REAL(cuLibraryGetModule, CUresult(*)(void **, void *))(m, lib));
}
CUresult ts_hook_cuLibraryGetKernel(void **k, void *lib, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryGetKernel);
    MEASURED(cuLibraryGetKernel, lib, unload_library,
             REAL(cuLibraryGetKernel, CUresult(*)(void **, void *, const char *))(k, lib, name));
}
CUresult ts_hook_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, void *lib, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryGetGlobal);
    MEASURED(cuLibraryGetGlobal, lib, unload_library,
             REAL(cuLibraryGetGlobal, CUresult(*)(CUdeviceptr *, size_t *, void *, const char *))(dptr, bytes, lib, name));
}
CUresult ts_hook_cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, void *lib, const char *name) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryGetManaged);
    MEASURED(cuLibraryGetManaged, lib, unload_library,
             REAL(cuLibraryGetManaged, CUresult(*)(CUdeviceptr *, size_t *, void *, const char *))(dptr, bytes, lib, name));
}
/* A kernel's library is not known here: what its loading takes stays charged until exit. */
CUresult ts_hook_cuKernelGetFunction(void **f, void *k) {
    BIND_OR_FAIL();
    NEED_REAL(cuKernelGetFunction);
    MEASURED(cuKernelGetFunction, k, unload_kernel_library, REAL(cuKernelGetFunction, CUresult(*)(void **, void *))(f, k));
}

static CUresult unload(void *real, void *h, ts_table *t) {
    ts_record r;
    pthread_mutex_lock(&ts_tab_mu);
    int found = ts_table_take(t, (uint64_t)(uintptr_t)h, &r);
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = ((unload_fn)real)(h);
    if (!found) return rc;
    if (rc == CUDA_SUCCESS) {
        ts_region_release(r.rdev, r.size);
    } else {
        pthread_mutex_lock(&ts_tab_mu);
        ts_table_put_record(t, &r);
        pthread_mutex_unlock(&ts_tab_mu);
    }
    return rc;
}
CUresult ts_hook_cuModuleUnload(void *m) {
    BIND_OR_FAIL();
    NEED_REAL(cuModuleUnload);
    return unload(ts_real.cuModuleUnload, m, &g_loaded);
}
CUresult ts_hook_cuLibraryUnload(void *lib) {
    BIND_OR_FAIL();
    NEED_REAL(cuLibraryUnload);
    return unload(ts_real.cuLibraryUnload, lib, &g_loaded);
}

/* ---- green contexts: each holds what a context holds, charged like cuCtxCreate's ---- */

static ts_table g_green; /* green context -> its charge (under ts_tab_mu) */

CUresult ts_hook_cuGreenCtxCreate(void **g, void *desc, CUdevice dev, unsigned flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuGreenCtxCreate);
    typedef CUresult (*fn)(void **, void *, CUdevice, unsigned);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return REAL(cuGreenCtxCreate, fn)(g, desc, dev, flags);
    ts_dev *d = ts_device(dev);
    uint64_t size = d && d->limited ? d->ctx_overhead : 0;
    int rdev;
    CUresult rc = ts_reserve(mode, dev, size, &rdev, "cuGreenCtxCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuGreenCtxCreate, fn)(g, desc, dev, flags);
    if (rc != CUDA_SUCCESS || !g) {
        if (rdev >= 0) ts_region_release(rdev, size);
        return rc;
    }
    if (rdev >= 0) {
        pthread_mutex_lock(&ts_tab_mu);
        int bad = ts_table_put(&g_green, (uint64_t)(uintptr_t)*g, size, rdev, dev, TS_KIND_OTHER);
        pthread_mutex_unlock(&ts_tab_mu);
        if (bad) ts_log(TS_LOG_WARN, "cannot record a green context; it stays charged");
    }
    return rc;
}

CUresult ts_hook_cuGreenCtxDestroy(void *g) {
    BIND_OR_FAIL();
    NEED_REAL(cuGreenCtxDestroy);
    return unload(ts_real.cuGreenCtxDestroy, g, &g_green);
}

/* ---- managed memory placed on another device ---- */

/* CUDA_SUCCESS when managed memory at p may be placed on ordinal dst (-1: the host). */
static CUresult placement(CUdeviceptr p, int dst, const char *what) {
    if (ts_mode() == TS_MODE_PASSTHROUGH || dst < 0) return CUDA_SUCCESS;
    ts_dev *d = ts_device(dst);
    if (d && !d->limited) return CUDA_SUCCESS;
    CUdeviceptr base = 0;
    size_t size = 0;
    ts_record r;
    if (ts_real.cuMemGetAddressRange_v2 && REAL(cuMemGetAddressRange_v2, range_fn)(&base, &size, p) == CUDA_SUCCESS &&
        ts_ptrs_find((uint64_t)base, &r) && r.ordinal == dst)
        return CUDA_SUCCESS;
    char key[64];
    snprintf(key, sizeof key, "place:%s", what);
    ts_log_once(key, "%s to device %d refused: managed memory charged to another device would move there uncharged "
                "(fail closed; allocate it on that device instead)", what, dst);
    return CUDA_ERROR_NOT_SUPPORTED;
}
static int loc_ordinal(CUmemLocation loc) { return loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1; }

typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*prefetch2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
#define PREFETCH(name)                                                                         \
    CUresult ts_hook_##name(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {                \
        BIND_OR_FAIL();                                                                        \
        NEED_REAL(name);                                                                       \
        CUresult rc = placement(p, dst, #name);                                                \
        return rc != CUDA_SUCCESS ? rc : REAL(name, prefetch_fn)(p, n, dst, s);                \
    }
#define PREFETCH2(name)                                                                        \
    CUresult ts_hook_##name(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags, CUstream s) { \
        BIND_OR_FAIL();                                                                        \
        NEED_REAL(name);                                                                       \
        CUresult rc = placement(p, loc_ordinal(loc), #name);                                   \
        return rc != CUDA_SUCCESS ? rc : REAL(name, prefetch2_fn)(p, n, loc, flags, s);        \
    }
PREFETCH(cuMemPrefetchAsync)
PREFETCH(cuMemPrefetchAsync_ptsz)
PREFETCH2(cuMemPrefetchAsync_v2)
PREFETCH2(cuMemPrefetchAsync_v2_ptsz)

enum { ADVISE_SET_READ_MOSTLY = 1, ADVISE_SET_PREFERRED_LOCATION = 3 };
static CUresult advice(CUdeviceptr p, int adv, int dst, const char *what) {
    if (adv == ADVISE_SET_PREFERRED_LOCATION) return placement(p, dst, what);
    return CUDA_SUCCESS;
}
CUresult ts_hook_cuMemAdvise(CUdeviceptr p, size_t n, int adv, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAdvise);
    CUresult rc = advice(p, adv, dev, "cuMemAdvise(SET_PREFERRED_LOCATION)");
    return rc != CUDA_SUCCESS ? rc : REAL(cuMemAdvise, CUresult(*)(CUdeviceptr, size_t, int, CUdevice))(p, n, adv, dev);
}
CUresult ts_hook_cuMemAdvise_v2(CUdeviceptr p, size_t n, int adv, CUmemLocation loc) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAdvise_v2);
    CUresult rc = advice(p, adv, loc_ordinal(loc), "cuMemAdvise_v2(SET_PREFERRED_LOCATION)");
    return rc != CUDA_SUCCESS ? rc
                              : REAL(cuMemAdvise_v2, CUresult(*)(CUdeviceptr, size_t, int, CUmemLocation))(p, n, adv, loc);
}

/* ---- refused while limits are active: batch prefetches, graphics and external-memory interop ----
 * Passed through unchanged otherwise (every argument is an integer or a pointer: forwarded as
 * such, registers and stack slots alike). */
typedef CUresult (*any8_fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);
#define REFUSED(name, why)                                                                               \
    CUresult ts_hook_##name(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, uintptr_t f, \
                            uintptr_t g, uintptr_t h) {                                                  \
        BIND_OR_FAIL();                                                                                  \
        NEED_REAL(name);                                                                                 \
        if (ts_mode() != TS_MODE_PASSTHROUGH) {                                                          \
            ts_log_once("refuse:" #name, #name " refused: %s (fail closed)", why);                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                             \
        }                                                                                                \
        return REAL(name, any8_fn)(a, b, c, d, e, f, g, h);                                              \
    }
#define GFX "memory of another graphics API (GL, Vulkan, EGL, VDPAU) is allocated outside CUDA and cannot be charged"
#define BATCH "a batch prefetch can move managed memory to a device it is not charged to"
TS_HELD_REFUSED(REFUSED)

#define ALIAS_ONE(name) TS_ALIAS(name)
TS_HELD_HOOKS(ALIAS_ONE)
