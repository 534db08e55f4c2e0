/*
 * CUDA driver hooks: charge every device allocation to the workload's shared total before the
 * driver makes it, refuse what would exceed the limit, give it back when freed, and report the
 * limit as the device's memory. Frees of pointers we did not charge go to the driver untouched.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "state.h"

#define REAL(name, type) ((type)ts_real.name)


typedef CUresult (*ctx_get_device_fn)(CUdevice *);
typedef CUresult (*ctx_get_current_fn)(CUcontext *);
typedef CUresult (*ctx_push_fn)(CUcontext);
typedef CUresult (*ctx_pop_fn)(CUcontext *);
typedef CUresult (*stream_get_ctx_fn)(CUstream, CUcontext *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*pool_create_fn)(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult (*pool_destroy_fn)(CUmemoryPool);
typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                  unsigned long long);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*get_info_fn)(size_t *, size_t *);
typedef CUresult (*total_mem_fn)(size_t *, CUdevice);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*dev_fn)(CUdevice);
typedef CUresult (*ctx_create_v2_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_create_v3_fn)(CUcontext *, void *, int, unsigned int, CUdevice);
typedef CUresult (*ctx_create_v4_fn)(CUcontext *, void *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);

static CUresult current_ordinal(int *ord) {
    if (!ts_real.cuCtxGetDevice) return CUDA_ERROR_NOT_INITIALIZED;
    return REAL(cuCtxGetDevice, ctx_get_device_fn)(ord);
}

CUresult ts_current_ordinal(int *ord) { return current_ordinal(ord); }

/* The device a stream's work runs on: the current one for the special streams, else the
 * device of the stream's context. */
int ts_stream_ordinal(CUstream s, int *ord) {
    if ((uintptr_t)s <= 2 || !ts_real.cuStreamGetCtx || !ts_real.cuCtxGetCurrent || !ts_real.cuCtxPushCurrent_v2 ||
        !ts_real.cuCtxPopCurrent_v2)
        return current_ordinal(ord);
    CUcontext sc = NULL, cur = NULL;
    CUresult rc = REAL(cuStreamGetCtx, stream_get_ctx_fn)(s, &sc);
    if (rc != CUDA_SUCCESS) return rc;
    if (REAL(cuCtxGetCurrent, ctx_get_current_fn)(&cur) == CUDA_SUCCESS && cur == sc) return current_ordinal(ord);
    rc = REAL(cuCtxPushCurrent_v2, ctx_push_fn)(sc);
    if (rc != CUDA_SUCCESS) return rc;
    rc = current_ordinal(ord);
    REAL(cuCtxPopCurrent_v2, ctx_pop_fn)(NULL);
    return rc;
}

/* Charges size bytes on an ordinal. *rdev is the region device charged, -1 if none is needed. */
static CUresult reserve(int mode, int ordinal, uint64_t size, int *rdev, const char *what) {
    *rdev = -1;
    if (mode == TS_MODE_PASSTHROUGH) return CUDA_SUCCESS;
    if (mode == TS_MODE_FAILED) {
        ts_report_refusal(what);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ts_dev *d = ts_device(ordinal);
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    if (!d->limited) return CUDA_SUCCESS;
    if (d->rdev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    int r = ts_region_reserve(d->rdev, size, d->limit);
    if (r == 1) {
        *rdev = d->rdev;
        return CUDA_SUCCESS;
    }
    if (r == 0)
        TS_INFO("%s of %llu bytes on device %d refused: the workload's limit is %llu bytes", what,
                (unsigned long long)size, ordinal, (unsigned long long)d->limit);
    else
        ts_log(TS_LOG_ERROR, "%s on device %d refused: the shared region is unusable", what, ordinal);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* An allocation refused at the limit settles the stream-ordered pools first (memory they have
 * released since is given back) and tries once more. Never called with ts_tab_mu held. */
static CUresult reserve_settling(int mode, int ordinal, uint64_t size, int *rdev, const char *what) {
    CUresult rc = reserve(mode, ordinal, size, rdev, what);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && mode == TS_MODE_LIMITED && __atomic_load_n(&ts_pools.count, __ATOMIC_RELAXED)) {
        ts_pools_settle_all();
        rc = reserve(mode, ordinal, size, rdev, what);
    }
    return rc;
}

CUresult ts_reserve(int mode, int ordinal, uint64_t size, int *rdev, const char *what) {
    return reserve_settling(mode, ordinal, size, rdev, what);
}

static void track(ts_table *t, uint64_t key, uint64_t size, int rdev, int ordinal, int kind) {
    if (rdev < 0) return;
    int rc;
    if (!t) { /* the device-pointer table (ptrs.c) */
        ts_record r = {.key = key, .size = size, .rdev = rdev, .ordinal = ordinal, .kind = kind};
        rc = ts_ptrs_put(&r);
    } else {
        pthread_mutex_lock(&ts_tab_mu);
        rc = ts_table_put(t, key, size, rdev, ordinal, kind);
        pthread_mutex_unlock(&ts_tab_mu);
    }
    if (rc != 0) ts_log(TS_LOG_WARN, "cannot record allocation %#llx; it stays charged", (unsigned long long)key);
}

static int untrack(ts_table *t, uint64_t key, ts_record *out) {
    if (!t) return ts_ptrs_take(key, out);
    pthread_mutex_lock(&ts_tab_mu);
    int found = ts_table_take(t, key, out);
    pthread_mutex_unlock(&ts_tab_mu);
    return found;
}

void ts_track(ts_table *t, uint64_t key, uint64_t size, int rdev, int ordinal, int kind) {
    track(t, key, size, rdev, ordinal, kind);
}

int ts_untrack(ts_table *t, uint64_t key, ts_record *out) { return untrack(t, key, out); }

static void retrack(ts_table *t, const ts_record *r) {
    if (!t) ts_ptrs_put(r); /* the whole record (a pool allocation keeps its pool in aux) */
    else track(t, r->key, r->size, r->rdev, r->ordinal, r->kind);
}

/* ---- synchronous allocations ---- */

CUresult ts_hook_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAlloc_v2);
    alloc_fn real = REAL(cuMemAlloc_v2, alloc_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(dptr, size);
    int ord, rdev;
    CUresult rc = current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    if ((rc = reserve_settling(mode, ord, size, &rdev, "cuMemAlloc")) != CUDA_SUCCESS) return rc;
    rc = real(dptr, size);
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && ts_loans_retry_driver(rdev)) rc = real(dptr, size);
    if (rc != CUDA_SUCCESS || !dptr) {
        if (rdev >= 0) ts_region_release(rdev, size);
        return rc;
    }
    track(TS_PTRS, *dptr, size, rdev, ord, TS_KIND_SYNC);
    return rc;
}

CUresult ts_hook_cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocManaged);
    managed_fn real = REAL(cuMemAllocManaged, managed_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(dptr, size, flags);
    int ord, rdev;
    CUresult rc = current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    if ((rc = reserve_settling(mode, ord, size, &rdev, "cuMemAllocManaged")) != CUDA_SUCCESS) return rc;
    rc = real(dptr, size, flags);
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && ts_loans_retry_driver(rdev)) rc = real(dptr, size, flags);
    if (rc != CUDA_SUCCESS || !dptr) {
        if (rdev >= 0) ts_region_release(rdev, size);
        return rc;
    }
    track(TS_PTRS, *dptr, size, rdev, ord, TS_KIND_SYNC);
    return rc;
}

#define PITCH_GUESS 512ULL

CUresult ts_hook_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                    unsigned int elem) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocPitch_v2);
    pitch_fn real = REAL(cuMemAllocPitch_v2, pitch_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(dptr, pitch, width, height, elem);
    int ord, rdev;
    CUresult rc = current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    /* The pitch is only known afterwards: charge a rounded estimate, then settle the difference. */
    uint64_t row = width > UINT64_MAX - PITCH_GUESS ? UINT64_MAX : (width + PITCH_GUESS - 1) / PITCH_GUESS * PITCH_GUESS;
    uint64_t guess;
    if (__builtin_mul_overflow(row, (uint64_t)height, &guess)) return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = reserve_settling(mode, ord, guess, &rdev, "cuMemAllocPitch")) != CUDA_SUCCESS) return rc;
    rc = real(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS || !dptr || !pitch) {
        if (rdev >= 0) ts_region_release(rdev, guess);
        return rc;
    }
    if (rdev < 0) return rc;
    uint64_t actual;
    if (__builtin_mul_overflow((uint64_t)*pitch, (uint64_t)height, &actual)) actual = UINT64_MAX;
    if (actual > guess) {
        ts_dev *d = ts_device(ord);
        if (ts_region_reserve(rdev, actual - guess, d->limit) != 1) {
            REAL(cuMemFree_v2, free_fn)(*dptr);
            ts_region_release(rdev, guess);
            *dptr = 0;
            TS_INFO("cuMemAllocPitch of %llu bytes refused: over the limit", (unsigned long long)actual);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < guess) {
        ts_region_release(rdev, guess - actual);
    }
    track(TS_PTRS, *dptr, actual, rdev, ord, TS_KIND_SYNC);
    return rc;
}

CUresult ts_hook_cuMemFree_v2(CUdeviceptr ptr) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemFree_v2);
    free_fn real = REAL(cuMemFree_v2, free_fn);
    ts_record r;
    if (ts_mode() == TS_MODE_PASSTHROUGH || !untrack(TS_PTRS, ptr, &r)) return real(ptr);
    CUresult rc = real(ptr);
    if (rc != CUDA_SUCCESS) retrack(TS_PTRS, &r);
    else if (r.kind == TS_KIND_POOL || r.kind == TS_KIND_ASYNC) ts_pool_freed(&r); /* back to its pool */
    else ts_region_release(r.rdev, r.size);
    return rc;
}

/* ---- stream-ordered allocations ---- */

CUresult ts_hook_cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocAsync);
    return ts_pool_alloc(ts_real.cuMemAllocAsync, 0, dptr, size, NULL, s, "cuMemAllocAsync");
}

CUresult ts_hook_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocAsync_ptsz);
    return ts_pool_alloc(ts_real.cuMemAllocAsync_ptsz, 0, dptr, size, NULL, s, "cuMemAllocAsync");
}

CUresult ts_hook_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocFromPoolAsync);
    return ts_pool_alloc(ts_real.cuMemAllocFromPoolAsync, 1, dptr, size, pool, s, "cuMemAllocFromPoolAsync");
}

CUresult ts_hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocFromPoolAsync_ptsz);
    return ts_pool_alloc(ts_real.cuMemAllocFromPoolAsync_ptsz, 1, dptr, size, pool, s, "cuMemAllocFromPoolAsync");
}

CUresult ts_hook_cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemFreeAsync);
    return ts_pool_free(ts_real.cuMemFreeAsync, ptr, s);
}

CUresult ts_hook_cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemFreeAsync_ptsz);
    return ts_pool_free(ts_real.cuMemFreeAsync_ptsz, ptr, s);
}

#define HOST_POOL (-2)

CUresult ts_hook_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolCreate);
    CUresult rc = REAL(cuMemPoolCreate, pool_create_fn)(pool, props);
    if (rc != CUDA_SUCCESS || !pool || !props || ts_mode() == TS_MODE_PASSTHROUGH) return rc;
    ts_pool_created(*pool, props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : HOST_POOL);
    return rc;
}

CUresult ts_hook_cuMemPoolDestroy(CUmemoryPool pool) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolDestroy);
    CUresult rc = REAL(cuMemPoolDestroy, pool_destroy_fn)(pool);
    if (ts_mode() != TS_MODE_PASSTHROUGH) ts_pool_destroyed(pool, rc);
    return rc;
}

/* ---- virtual memory management ----
 * Physical memory from cuMemCreate lives until the handle and every mapping of it are gone
 * (a common pattern maps, then releases the handle at once). The charge follows the same rule:
 * each handle counts its references (creation, cuMemRetainAllocationHandle) plus its live
 * mappings, and is given back when that count reaches zero. */

typedef CUresult (*mem_map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*mem_unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*mem_retain_fn)(CUmemGenericAllocationHandle *, void *);

CUresult ts_hook_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemCreate);
    mem_create_fn real = REAL(cuMemCreate, mem_create_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(handle, size, prop, flags);
    /* The device comes from the properties, never from the calling thread's context. */
    int ord = prop->location.id;
    if (ord < 0 || ord >= TS_MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    int rdev;
    CUresult rc = reserve_settling(mode, ord, size, &rdev, "cuMemCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, size, prop, flags);
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && ts_loans_retry_driver(rdev)) rc = real(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS || !handle) {
        if (rdev >= 0) ts_region_release(rdev, size);
        return rc;
    }
    if (rdev >= 0) {
        ts_record r = {.key = *handle, .size = size, .rdev = rdev, .ordinal = ord, .kind = TS_KIND_OTHER, .refs = 1};
        pthread_mutex_lock(&ts_tab_mu);
        ts_table_put_record(&ts_handles, &r);
        pthread_mutex_unlock(&ts_tab_mu);
    }
    return rc;
}

/* Adds delta to a handle's count (caller holds ts_tab_mu); at zero the record moves to *gone and
 * 2 is returned (the caller gives the charge back) — or 3 for an exported (pinned) allocation,
 * whose charge stays until the process exits (hooks_share.c). */
static int handle_ref(uint64_t handle, int delta, ts_record *gone) {
    ts_record *r = ts_table_find(&ts_handles, handle);
    if (!r) return 0;
    r->refs += delta;
    if (r->refs <= 0) {
        ts_record dropped;
        if (!gone) gone = &dropped;
        ts_table_take(&ts_handles, handle, gone);
        return gone->kind == TS_KIND_PINNED ? 3 : 2;
    }
    return 1;
}

static void handle_unref_undo(const ts_record *gone, int state) {
    /* caller holds ts_tab_mu: put back what handle_ref(-1) changed */
    if (state == 2 || state == 3) {
        ts_record r = *gone;
        r.refs = 1;
        ts_table_put_record(&ts_handles, &r);
    } else if (state == 1) {
        handle_ref(gone->key, +1, NULL);
    }
}

CUresult ts_hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemRelease);
    mem_release_fn real = REAL(cuMemRelease, mem_release_fn);
    if (ts_mode() == TS_MODE_PASSTHROUGH) return real(handle);
    ts_record gone = {.key = handle};
    pthread_mutex_lock(&ts_tab_mu);
    int state = handle_ref(handle, -1, &gone);
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = real(handle);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_lock(&ts_tab_mu);
        handle_unref_undo(&gone, state);
        pthread_mutex_unlock(&ts_tab_mu);
    } else if (state == 2) {
        ts_region_release(gone.rdev, gone.size);
    }
    return rc;
}

CUresult ts_hook_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemRetainAllocationHandle);
    CUresult rc = REAL(cuMemRetainAllocationHandle, mem_retain_fn)(handle, addr);
    if (rc != CUDA_SUCCESS || !handle || ts_mode() == TS_MODE_PASSTHROUGH) return rc;
    pthread_mutex_lock(&ts_tab_mu);
    handle_ref(*handle, +1, NULL);
    pthread_mutex_unlock(&ts_tab_mu);
    return rc;
}

CUresult ts_hook_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemMap);
    CUresult rc = REAL(cuMemMap, mem_map_fn)(ptr, size, offset, handle, flags);
    if (rc != CUDA_SUCCESS || ts_mode() == TS_MODE_PASSTHROUGH) return rc;
    pthread_mutex_lock(&ts_tab_mu);
    if (handle_ref(handle, +1, NULL)) {
        ts_record m = {.key = ptr, .size = size, .rdev = -1, .ordinal = -1, .kind = TS_KIND_OTHER, .aux = handle};
        if (ts_table_put_record(&ts_maps, &m) != 0) handle_ref(handle, -1, NULL);
    }
    pthread_mutex_unlock(&ts_tab_mu);
    return rc;
}

#define UNMAP_BATCH 64

CUresult ts_hook_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemUnmap);
    mem_unmap_fn real = REAL(cuMemUnmap, mem_unmap_fn);
    if (ts_mode() == TS_MODE_PASSTHROUGH) return real(ptr, size);
    uint64_t end = size > UINT64_MAX - ptr ? UINT64_MAX : ptr + size;
    /* Take the mappings in the range before the driver call (so a concurrent map of the same
     * address cannot be mistaken for one of them); put them back if the driver refuses. */
    ts_record maps[UNMAP_BATCH];
    ts_record gone[UNMAP_BATCH];
    int states[UNMAP_BATCH];
    int n = 0, more = 0;
    pthread_mutex_lock(&ts_tab_mu);
    uint64_t cur = ptr;
    while (n < UNMAP_BATCH && cur < end && ts_table_take(&ts_maps, cur, &maps[n])) {
        cur += maps[n].size ? maps[n].size : 1;
        n++;
    }
    /* Mappings that tile [ptr, end) exactly were all found by address above (O(1) each); only a
     * range the walk did not cover (a gap: not a whole mapping) needs the table scan. */
    while (n < UNMAP_BATCH && cur < end && ts_table_take_range(&ts_maps, ptr, end, &maps[n])) n++;
    if (n == UNMAP_BATCH) more = 1;
    for (int i = 0; i < n; i++) {
        gone[i].key = maps[i].aux;
        states[i] = handle_ref(maps[i].aux, -1, &gone[i]);
    }
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = real(ptr, size);
    pthread_mutex_lock(&ts_tab_mu);
    if (rc != CUDA_SUCCESS) {
        for (int i = n - 1; i >= 0; i--) {
            handle_unref_undo(&gone[i], states[i]);
            ts_table_put_record(&ts_maps, &maps[i]);
        }
        n = 0;
    }
    /* More than a batch of mappings in one unmap: the rest are already unmapped by the driver. */
    while (rc == CUDA_SUCCESS && more) {
        ts_record m, g = {0};
        if (!ts_table_take_range(&ts_maps, ptr, end, &m)) break;
        g.key = m.aux;
        if (handle_ref(m.aux, -1, &g) == 2) {
            pthread_mutex_unlock(&ts_tab_mu);
            ts_region_release(g.rdev, g.size);
            pthread_mutex_lock(&ts_tab_mu);
        }
    }
    pthread_mutex_unlock(&ts_tab_mu);
    for (int i = 0; i < n; i++)
        if (states[i] == 2) ts_region_release(gone[i].rdev, gone[i].size);
    return rc;
}

/* ---- what the program sees ---- */

CUresult ts_hook_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemGetInfo_v2);
    CUresult rc = REAL(cuMemGetInfo_v2, get_info_fn)(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS) return rc;
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return rc;
    uint64_t limit = 0, used = 0;
    int ord = -1;
    ts_dev *d = NULL;
    if (mode == TS_MODE_LIMITED && current_ordinal(&ord) == CUDA_SUCCESS) {
        d = ts_device(ord);
        if (d && !d->limited) return rc;
        if (__atomic_load_n(&ts_pools.count, __ATOMIC_RELAXED)) ts_pools_settle_all();
    }
    if (d) {
        limit = d->limit;
        used = d->rdev >= 0 ? ts_region_used(d->rdev) : UINT64_MAX;
    }
    uint64_t phys_total = limit;
    if (total_bytes) phys_total = *total_bytes;
    else if (ord >= 0 && ts_real.cuDeviceTotalMem_v2) {
        size_t t;
        if (REAL(cuDeviceTotalMem_v2, total_mem_fn)(&t, ord) == CUDA_SUCCESS) phys_total = t;
    }
    uint64_t total = limit < phys_total ? limit : phys_total;
    uint64_t avail = used >= total ? 0 : total - used;
    if (free_bytes && avail < *free_bytes) *free_bytes = avail;
    if (total_bytes) *total_bytes = total;
    return rc;
}

CUresult ts_hook_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDeviceTotalMem_v2);
    CUresult rc = REAL(cuDeviceTotalMem_v2, total_mem_fn)(bytes, dev);
    if (rc != CUDA_SUCCESS || !bytes) return rc;
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return rc;
    if (mode == TS_MODE_FAILED) {
        *bytes = 0;
        return rc;
    }
    ts_dev *d = ts_device(dev);
    if (d && d->limited && d->limit < *bytes) *bytes = d->limit;
    return rc;
}

/* ---- contexts: each one is charged the configured overhead ---- */

/* Every context is charged on a limited device: the configured overhead, else what the library
 * measured at the first context on the device, else the per-model default (state.c); never 0. */
static int overhead_on(int mode) { return mode == TS_MODE_LIMITED; }

static uint64_t overhead_of(int dev) {
    ts_dev *d = ts_device(dev);
    return d ? d->ctx_overhead : 0;
}

/*
 * The first context a process creates on a device whose context memory is not configured is
 * measured (ctxmeasure.c): ts_measure_mu is held from before the driver call until the charge
 * is settled, so every other context on the device is charged the measured amount.
 */
typedef struct {
    int active;
    ts_ctx_probe probe;
} measuring;

static void measure_begin(int mode, int dev, measuring *m) {
    m->active = 0;
    if (mode != TS_MODE_LIMITED) return;
    ts_dev *d = ts_device(dev);
    if (!d || !d->limited || d->rdev < 0 || __atomic_load_n(&d->ctx_fixed, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&ts_measure_mu);
    if (__atomic_load_n(&d->ctx_fixed, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&ts_measure_mu);
        return;
    }
    m->active = 1;
    ts_ctx_probe_before(d->uuid, &m->probe);
}

/*
 * Ends a measuring creation. created: the driver made a new context, charged *charged bytes on
 * rdev. Its measured size becomes the device's charge per context and this context's charge is
 * settled to it (*charged updated). Returns 0 if the settled charge no longer fits the limit: the
 * charge has then been given back entirely and the caller undoes the context.
 */
static int measure_end(measuring *m, int dev, CUcontext ctx, int created, int rdev, uint64_t *charged) {
    if (!m->active) return 1;
    m->active = 0;
    int fits = 1, exact = 0;
    const char *how;
    ts_dev *d = ts_device(dev);
    uint64_t bytes = ts_ctx_probe_after(&m->probe, dev, created ? ctx : NULL, rdev, d ? d->limit : 0, &exact, &how);
    if (bytes && !exact && d && bytes < d->ctx_overhead) {
        TS_INFO("device %d: context memory read as %llu bytes from %s; the default %llu bytes is charged", dev,
                (unsigned long long)bytes, how, (unsigned long long)d->ctx_overhead);
        bytes = 0; /* a lower bound below the default: the default stands */
    }
    if (created && d) {
        if (bytes) {
            TS_INFO("device %d: a CUDA context holds %llu bytes (measured from %s); each context is charged that",
                    dev, (unsigned long long)bytes, how);
        } else {
            bytes = d->ctx_overhead;
            TS_INFO("device %d: context memory not measured (%s); each context is charged the default %llu bytes",
                    dev, how, (unsigned long long)bytes);
        }
        if (rdev >= 0 && bytes > *charged) {
            if (ts_region_reserve(rdev, bytes - *charged, d->limit) == 1) {
                *charged = bytes;
            } else {
                ts_region_release(rdev, *charged);
                *charged = 0;
                fits = 0;
                TS_INFO("context creation on device %d refused: its %llu bytes exceed the workload's limit of %llu bytes",
                        dev, (unsigned long long)bytes, (unsigned long long)d->limit);
            }
        } else if (rdev >= 0 && bytes < *charged) {
            ts_region_release(rdev, *charged - bytes);
            *charged = bytes;
        }
        d->ctx_overhead = bytes;
        __atomic_store_n(&d->ctx_fixed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ts_measure_mu);
    return fits;
}

CUresult ts_hook_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDevicePrimaryCtxRetain);
    retain_fn real = REAL(cuDevicePrimaryCtxRetain, retain_fn);
    int mode = ts_mode();
    if (!overhead_on(mode) || dev < 0 || dev >= TS_MAX_DEVICES) return real(pctx, dev);
    measuring m;
    measure_begin(mode, dev, &m);
    uint64_t overhead = overhead_of(dev);
    pthread_mutex_lock(&ts_tab_mu);
    int rdev = -1, creating = ts_primary_refs[dev] == 0;
    CUresult rc = CUDA_SUCCESS;
    if (creating) rc = reserve(mode, dev, overhead, &rdev, "primary context");
    if (rc == CUDA_SUCCESS) {
        rc = real(pctx, dev);
        if (rc == CUDA_SUCCESS) {
            ts_primary_refs[dev]++;
            if (!measure_end(&m, dev, pctx ? *pctx : NULL, creating, rdev, &overhead)) {
                dev_fn release = ts_real.cuDevicePrimaryCtxRelease_v2 ? REAL(cuDevicePrimaryCtxRelease_v2, dev_fn)
                                                                      : REAL(cuDevicePrimaryCtxRelease, dev_fn);
                if (release) release(dev);
                ts_primary_refs[dev]--;
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
        } else if (rdev >= 0) {
            ts_region_release(rdev, overhead);
        }
    }
    pthread_mutex_unlock(&ts_tab_mu);
    measure_end(&m, dev, NULL, 0, -1, &overhead);
    return rc;
}

static void release_overhead(ts_dev *d) {
    if (d && d->rdev >= 0) ts_region_release(d->rdev, d->ctx_overhead);
}

static CUresult primary_release(dev_fn real, CUdevice dev) {
    if (!overhead_on(ts_mode()) || dev < 0 || dev >= TS_MAX_DEVICES) return real(dev);
    ts_dev *d = ts_device(dev);
    pthread_mutex_lock(&ts_tab_mu);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && ts_primary_refs[dev] > 0 && --ts_primary_refs[dev] == 0) release_overhead(d);
    pthread_mutex_unlock(&ts_tab_mu);
    return rc;
}

CUresult ts_hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDevicePrimaryCtxRelease_v2);
    return primary_release(REAL(cuDevicePrimaryCtxRelease_v2, dev_fn), dev);
}

/* The pre-CUDA-11 name, same signature (older runtimes still call it). */
CUresult ts_hook_cuDevicePrimaryCtxRelease(CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDevicePrimaryCtxRelease);
    return primary_release(REAL(cuDevicePrimaryCtxRelease, dev_fn), dev);
}

/* A reset destroys the primary context and the allocations made in it. */
static CUresult primary_reset(dev_fn real, CUdevice dev) {
    int mode = ts_mode();
    if (mode != TS_MODE_LIMITED || dev < 0 || dev >= TS_MAX_DEVICES) return real(dev);
    ts_dev *d = ts_device(dev);
    uint64_t sums[TS_MAX_DEVICES] = {0};
    pthread_mutex_lock(&ts_tab_mu);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS) {
        if (ts_primary_refs[dev] > 0) release_overhead(d);
        ts_primary_refs[dev] = 0;
        /* With other contexts on the device we cannot tell whose allocations died: keep them
         * charged (over-counting never lets a workload past its limit). */
        if (ts_custom_ctxs[dev] == 0) ts_ptrs_drop_ordinal(dev, TS_KIND_SYNC, sums);
    }
    pthread_mutex_unlock(&ts_tab_mu);
    for (int i = 0; i < TS_MAX_DEVICES; i++)
        if (sums[i]) ts_region_release(i, sums[i]);
    return rc;
}

CUresult ts_hook_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDevicePrimaryCtxReset_v2);
    return primary_reset(REAL(cuDevicePrimaryCtxReset_v2, dev_fn), dev);
}

CUresult ts_hook_cuDevicePrimaryCtxReset(CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDevicePrimaryCtxReset);
    return primary_reset(REAL(cuDevicePrimaryCtxReset, dev_fn), dev);
}

/* Before the driver creates a context: charges the overhead (and starts measuring it when it
 * is not known yet). *charged: the bytes charged on *rdev. */
static CUresult ctx_reserve(int dev, int *rdev, uint64_t *charged, measuring *m) {
    *rdev = -1;
    *charged = 0;
    m->active = 0;
    int mode = ts_mode();
    if (mode != TS_MODE_LIMITED || dev < 0 || dev >= TS_MAX_DEVICES) return CUDA_SUCCESS;
    if (!overhead_on(mode)) return CUDA_SUCCESS;
    measure_begin(mode, dev, m);
    *charged = overhead_of(dev);
    CUresult rc = reserve_settling(mode, dev, *charged, rdev, "context creation");
    if (rc != CUDA_SUCCESS) measure_end(m, dev, NULL, 0, -1, charged);
    return rc;
}

static CUresult ctx_created(CUresult rc, CUcontext *pctx, int dev, int rdev, uint64_t charged, measuring *m) {
    if (rc != CUDA_SUCCESS || !pctx) {
        measure_end(m, dev, NULL, 0, -1, &charged);
        if (rdev >= 0) ts_region_release(rdev, charged);
        return rc;
    }
    if (ts_mode() != TS_MODE_LIMITED || dev < 0 || dev >= TS_MAX_DEVICES) return rc;
    if (!measure_end(m, dev, *pctx, 1, rdev, &charged)) {
        if (ts_real.cuCtxDestroy_v2) REAL(cuCtxDestroy_v2, ctx_destroy_fn)(*pctx);
        *pctx = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&ts_tab_mu);
    ts_table_put(&ts_ctxs, (uint64_t)(uintptr_t)*pctx, rdev >= 0 ? charged : 0, rdev, dev, TS_KIND_OTHER);
    ts_custom_ctxs[dev]++;
    pthread_mutex_unlock(&ts_tab_mu);
    return rc;
}

CUresult ts_hook_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxCreate_v2);
    int rdev;
    uint64_t charged;
    measuring m;
    CUresult rc = ctx_reserve(dev, &rdev, &charged, &m);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuCtxCreate_v2, ctx_create_v2_fn)(pctx, flags, dev);
    return ctx_created(rc, pctx, dev, rdev, charged, &m);
}

CUresult ts_hook_cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxCreate_v3);
    int rdev;
    uint64_t charged;
    measuring m;
    CUresult rc = ctx_reserve(dev, &rdev, &charged, &m);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuCtxCreate_v3, ctx_create_v3_fn)(pctx, params, n, flags, dev);
    return ctx_created(rc, pctx, dev, rdev, charged, &m);
}

CUresult ts_hook_cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxCreate_v4);
    int rdev;
    uint64_t charged;
    measuring m;
    CUresult rc = ctx_reserve(dev, &rdev, &charged, &m);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuCtxCreate_v4, ctx_create_v4_fn)(pctx, params, flags, dev);
    return ctx_created(rc, pctx, dev, rdev, charged, &m);
}

CUresult ts_hook_cuCtxDestroy_v2(CUcontext ctx) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxDestroy_v2);
    ctx_destroy_fn real = REAL(cuCtxDestroy_v2, ctx_destroy_fn);
    ts_record r;
    if (!untrack(&ts_ctxs, (uint64_t)(uintptr_t)ctx, &r)) return real(ctx);
    CUresult rc = real(ctx);
    pthread_mutex_lock(&ts_tab_mu);
    if (rc != CUDA_SUCCESS) ts_table_put(&ts_ctxs, r.key, r.size, r.rdev, r.ordinal, r.kind);
    else if (ts_custom_ctxs[r.ordinal] > 0) ts_custom_ctxs[r.ordinal]--;
    pthread_mutex_unlock(&ts_tab_mu);
    if (rc == CUDA_SUCCESS && r.rdev >= 0 && r.size) ts_region_release(r.rdev, r.size);
    if (rc == CUDA_SUCCESS) ts_ctx_limits_release(ctx);
    return rc;
}

TS_ALIAS(cuMemAlloc_v2)
TS_ALIAS(cuMemAllocPitch_v2)
TS_ALIAS(cuMemAllocManaged)
TS_ALIAS(cuMemFree_v2)
TS_ALIAS(cuMemAllocAsync)
TS_ALIAS(cuMemAllocAsync_ptsz)
TS_ALIAS(cuMemAllocFromPoolAsync)
TS_ALIAS(cuMemAllocFromPoolAsync_ptsz)
TS_ALIAS(cuMemFreeAsync)
TS_ALIAS(cuMemFreeAsync_ptsz)
TS_ALIAS(cuMemPoolCreate)
TS_ALIAS(cuMemPoolDestroy)
TS_ALIAS(cuMemCreate)
TS_ALIAS(cuMemRelease)
TS_ALIAS(cuMemRetainAllocationHandle)
TS_ALIAS(cuMemMap)
TS_ALIAS(cuMemUnmap)
TS_ALIAS(cuMemGetInfo_v2)
TS_ALIAS(cuDeviceTotalMem_v2)
TS_ALIAS(cuDevicePrimaryCtxRetain)
TS_ALIAS(cuDevicePrimaryCtxRelease_v2)
TS_ALIAS(cuDevicePrimaryCtxReset_v2)
TS_ALIAS(cuDevicePrimaryCtxRelease)
TS_ALIAS(cuDevicePrimaryCtxReset)
TS_ALIAS(cuCtxCreate_v2)
TS_ALIAS(cuCtxCreate_v3)
TS_ALIAS(cuCtxCreate_v4)
TS_ALIAS(cuCtxDestroy_v2)
