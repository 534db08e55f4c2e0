/*
 * Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync): what is charged is what
 * each pool holds on its device, not what the program currently uses. A free gives memory back
 * to the pool, which keeps it reserved (up to its release threshold, until a synchronisation or
 * cuMemPoolTrimTo); so the charge of a pool follows CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
 *
 *  - before an allocation that the pool's spare reserve cannot serve, its size is charged to the
 *    pool's device (refused over the limit); after it, the charge is settled to the reserve the
 *    driver reports (more: charged or the allocation is undone and refused; less: given back);
 *  - a free, a trim, cuMemGetInfo and any refused allocation settle the pools again, so memory
 *    the pool released is given back when the driver says it is gone, never before;
 *  - the pool's device is the pool's own (pools created through cuMemPoolCreate are remembered;
 *    default and current pools of a device, cuDeviceGetDefaultMemPool / cuDeviceGetMemPool /
 *    cuDeviceSetMemPool, are recognised by asking the driver), never the stream's; a device pool
 *    this library cannot place is refused (fail closed);
 *  - a stream-ordered allocation on a capturing stream would become a graph memory node whose
 *    memory is taken at every launch: refused when limits are active (docs/isolation.md).
 * ts_pools records: key = pool, ordinal (HOST_POOL for host pools), rdev, size = bytes charged
 * for the pool, aux = bytes of its live allocations.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "state.h"

#define HOST_POOL (-2)
#define REAL(name, type) ((type)ts_real.name)

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*pool_attr_fn)(CUmemoryPool, int, void *);
typedef CUresult (*dev_pool_fn)(CUmemoryPool *, CUdevice);
typedef CUresult (*count_fn)(int *);
typedef CUresult (*capturing_fn)(CUstream, int *);

static int pool_attr(CUmemoryPool pool, int attr, uint64_t *out) {
    if (!ts_real.cuMemPoolGetAttribute) return 0;
    cuuint64_t v = 0;
    if (REAL(cuMemPoolGetAttribute, pool_attr_fn)(pool, attr, &v) != CUDA_SUCCESS) return 0;
    *out = v;
    return 1;
}

void ts_pool_created(CUmemoryPool pool, int ordinal) {
    int rdev = -1;
    if (ordinal >= 0) {
        ts_dev *d = ts_device(ordinal);
        if (d && d->limited) rdev = d->rdev;
    }
    ts_record r = {.key = (uint64_t)(uintptr_t)pool, .size = 0, .rdev = rdev, .ordinal = ordinal,
                   .kind = TS_KIND_OTHER};
    pthread_mutex_lock(&ts_tab_mu);
    if (!ts_table_find(&ts_pools, r.key)) ts_table_put_record(&ts_pools, &r);
    pthread_mutex_unlock(&ts_tab_mu);
}

/* Gives back what the pool is charged beyond what it reserves now. */
static void settle(CUmemoryPool pool) {
    uint64_t reserved;
    if (!pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved)) return;
    uint64_t excess = 0;
    int rdev = -1;
    pthread_mutex_lock(&ts_tab_mu);
    ts_record *r = ts_table_find(&ts_pools, (uint64_t)(uintptr_t)pool);
    if (r && r->rdev >= 0 && r->size > reserved) {
        excess = r->size - reserved;
        r->size = reserved;
        rdev = r->rdev;
    }
    pthread_mutex_unlock(&ts_tab_mu);
    if (excess) ts_region_release(rdev, excess);
}

void ts_pools_settle_all(void) {
    CUmemoryPool pools[64];
    int n = 0;
    pthread_mutex_lock(&ts_tab_mu);
    for (size_t i = 0; i < ts_pools.cap && n < 64; i++) {
        ts_record *r = &ts_pools.slots[i];
        if (r->key != 0 && r->key != UINT64_MAX && r->rdev >= 0 && r->size > 0)
            pools[n++] = (CUmemoryPool)(uintptr_t)r->key;
    }
    pthread_mutex_unlock(&ts_tab_mu);
    for (int i = 0; i < n; i++) settle(pools[i]);
}

/* The device of a pool the program did not create through the hooks: a default or current pool. */
static int discover(CUmemoryPool pool, int *ordinal) {
    int count = 0;
    if (!ts_real.cuDeviceGetCount || REAL(cuDeviceGetCount, count_fn)(&count) != CUDA_SUCCESS) return 0;
    if (count > TS_MAX_DEVICES) count = TS_MAX_DEVICES;
    for (int d = 0; d < count; d++) {
        CUmemoryPool p = NULL;
        if ((ts_real.cuDeviceGetDefaultMemPool &&
             REAL(cuDeviceGetDefaultMemPool, dev_pool_fn)(&p, d) == CUDA_SUCCESS && p == pool) ||
            (ts_real.cuDeviceGetMemPool && REAL(cuDeviceGetMemPool, dev_pool_fn)(&p, d) == CUDA_SUCCESS && p == pool)) {
            *ordinal = d;
            return 1;
        }
    }
    return 0;
}

static int capturing(CUstream s) {
    if ((uintptr_t)s == 1 || !ts_real.cuStreamIsCapturing) return 0; /* the legacy stream cannot capture */
    int status = 0;
    return REAL(cuStreamIsCapturing, capturing_fn)(s, &status) == CUDA_SUCCESS && status != 0;
}

static CUresult call_alloc(void *real, int with_pool, CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    return with_pool ? ((alloc_pool_fn)real)(dptr, size, pool, s) : ((alloc_async_fn)real)(dptr, size, s);
}

/* The driver's own out-of-memory while loans are reclaimed (loans.c): retried meanwhile. */
static CUresult call_alloc_charged(void *real, int with_pool, CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                   CUstream s, int rdev) {
    CUresult rc = call_alloc(real, with_pool, dptr, size, pool, s);
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && rdev >= 0 && ts_loans_retry_driver(rdev))
        rc = call_alloc(real, with_pool, dptr, size, pool, s);
    return rc;
}

/* kind 0: cuMemAllocAsync[_ptsz] (the device's current pool), 1: cuMemAllocFromPoolAsync[_ptsz]. */
CUresult ts_pool_alloc(void *real, int with_pool, CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s,
                       const char *what) {
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return call_alloc(real, with_pool, dptr, size, pool, s);
    if (mode == TS_MODE_FAILED) {
        ts_report_refusal(what);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (capturing(s)) {
        ts_log_once("capture", "%s on a capturing stream refused: it would become a CUDA graph memory node, "
                    "allocated at every launch outside the limit (use cuMemAlloc before capture)", what);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    int ord = -1;
    CUresult rc;
    if (!with_pool) {
        if ((rc = ts_stream_ordinal(s, &ord)) != CUDA_SUCCESS) return rc;
        if (!ts_real.cuDeviceGetMemPool || REAL(cuDeviceGetMemPool, dev_pool_fn)(&pool, ord) != CUDA_SUCCESS)
            pool = NULL;
    }
    uint64_t key = (uint64_t)(uintptr_t)pool;
    ts_record pr;
    int known = 0;
    if (pool) {
        pthread_mutex_lock(&ts_tab_mu);
        ts_record *r = ts_table_find(&ts_pools, key);
        if (r) {
            pr = *r;
            known = 1;
        }
        pthread_mutex_unlock(&ts_tab_mu);
        if (!known) {
            int d;
            if (!discover(pool, &d)) {
                if (!with_pool) return call_alloc(real, 0, dptr, size, pool, s); /* unreachable in practice */
                ts_log_once("unknown-pool", "%s from memory pool %p refused: it was not created through "
                            "cuMemPoolCreate here and is no device's default or current pool, so its device "
                            "is unknown (fail closed)", what, (void *)pool);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            ts_pool_created(pool, d);
            pthread_mutex_lock(&ts_tab_mu);
            ts_record *r = ts_table_find(&ts_pools, key);
            if (r) pr = *r;
            known = r != NULL;
            pthread_mutex_unlock(&ts_tab_mu);
            if (!known) return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (pr.ordinal == HOST_POOL) return call_alloc(real, with_pool, dptr, size, pool, s);
        ord = pr.ordinal;
        ts_dev *d = ts_device(ord);
        if (d && !d->limited) return call_alloc(real, with_pool, dptr, size, pool, s);
    }
    if (!pool) {
        /* No pool to follow: charge the allocation itself. */
        int rdev;
        if ((rc = ts_reserve(mode, ord, size, &rdev, what)) != CUDA_SUCCESS) return rc;
        rc = call_alloc_charged(real, with_pool, dptr, size, pool, s, rdev);
        if (rc != CUDA_SUCCESS || !dptr) {
            if (rdev >= 0) ts_region_release(rdev, size);
            return rc;
        }
        ts_track(TS_PTRS, *dptr, size, rdev, ord, TS_KIND_ASYNC);
        return rc;
    }
    uint64_t reserved = 0, used = 0, need = size;
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) &&
        pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) && reserved >= used && reserved - used >= size)
        need = 0; /* the spare reserve can serve it; settled below if the driver grows anyway */
    int rdev = -1;
    if (need) {
        if ((rc = ts_reserve(mode, ord, need, &rdev, what)) != CUDA_SUCCESS) return rc;
        pthread_mutex_lock(&ts_tab_mu);
        ts_record *r = ts_table_find(&ts_pools, key);
        if (r) r->size += need;
        pthread_mutex_unlock(&ts_tab_mu);
        if (!r) { /* destroyed meanwhile */
            ts_region_release(rdev, need);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    rc = call_alloc_charged(real, with_pool, dptr, size, pool, s, need ? rdev : -1);
    if (rc != CUDA_SUCCESS || !dptr) {
        settle(pool);
        return rc;
    }
    ts_record a = {.key = *dptr, .size = size, .rdev = pr.rdev, .ordinal = ord, .kind = TS_KIND_POOL, .aux = key};
    uint64_t extra = 0;
    pthread_mutex_lock(&ts_tab_mu);
    ts_ptrs_put(&a);
    ts_record *r = ts_table_find(&ts_pools, key);
    if (r) r->aux += size;
    uint64_t now;
    int have = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now);
    if (r && have && now > r->size) extra = now - r->size;
    pthread_mutex_unlock(&ts_tab_mu);
    if (extra) {
        /* The driver grew the pool by more than was charged (its granularity). Charge what it holds;
         * if that is over the limit, charge it anyway (it is held) and undo the allocation. */
        int rd = -1, over = ts_reserve(mode, ord, extra, &rd, what) != CUDA_SUCCESS;
        if (over && pr.rdev >= 0 && ts_region_reserve(pr.rdev, extra, UINT64_MAX) == 1) rd = pr.rdev;
        pthread_mutex_lock(&ts_tab_mu);
        r = ts_table_find(&ts_pools, key);
        if (r && rd >= 0) r->size += extra;
        pthread_mutex_unlock(&ts_tab_mu);
        if (!r && rd >= 0) ts_region_release(rd, extra);
        if (over) {
            ts_pool_free(ts_real.cuMemFreeAsync, *dptr, s);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        settle(pool);
    }
    return rc;
}

CUresult ts_pool_free(void *real, CUdeviceptr ptr, CUstream s) {
    free_async_fn f = (free_async_fn)real;
    ts_record r;
    if (ts_mode() == TS_MODE_PASSTHROUGH || !ts_untrack(TS_PTRS, ptr, &r)) return f(ptr, s);
    CUresult rc = f(ptr, s);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_lock(&ts_tab_mu);
        ts_ptrs_put(&r);
        pthread_mutex_unlock(&ts_tab_mu);
        return rc;
    }
    ts_pool_freed(&r);
    return rc;
}

/* A stream-ordered allocation the driver freed, by either free (cuMemFreeAsync, or the
 * synchronous cuMemFree, which also gives it back to its pool: issue #28 class 3). */
void ts_pool_freed(const ts_record *rec) {
    ts_record r = *rec;
    if (r.kind != TS_KIND_POOL) {
        ts_region_release(r.rdev, r.size);
        return;
    }
    pthread_mutex_lock(&ts_tab_mu);
    ts_record *p = ts_table_find(&ts_pools, r.aux);
    if (p) p->aux -= r.size < p->aux ? r.size : p->aux;
    pthread_mutex_unlock(&ts_tab_mu);
    if (p) settle((CUmemoryPool)(uintptr_t)r.aux); /* stays charged while the pool keeps it */
    else ts_region_release(r.rdev, r.size);         /* its pool was destroyed: its own charge */
}

void ts_pool_destroyed(CUmemoryPool pool, CUresult rc) {
    if (rc != CUDA_SUCCESS) return;
    ts_record r;
    if (!ts_untrack(&ts_pools, (uint64_t)(uintptr_t)pool, &r)) return;
    /* The reserve goes back to the device; live allocations keep their own charge until freed. */
    if (r.rdev >= 0 && r.size > r.aux) ts_region_release(r.rdev, r.size - r.aux);
}
