/*
 * Other ways the driver holds device memory for a program (issue #12 item 1):
 *  - the pre-CUDA-3.2 unversioned entry points (cuMemAlloc, cuMemFree, cuMemGetInfo, ...), still
 *    exported by drivers, 32-bit sizes and pointers: hooked like the _v2 ones;
 *  - cuCtxSetLimit: the malloc heap and printf FIFO take their size, the stack its size per
 *    thread for every thread the device can hold: charged (the increase over what was charged
 *    before; the defaults are part of the context overhead); raising the device-runtime limits
 *    (sync depth, pending launches), which reserve memory the library cannot size, is refused;
 *  - CUDA graph memory nodes (cuGraphAddMemAllocNode, cuGraphAddNode with a memory-allocation
 *    node): their memory is taken at launch, outside any allocation call: refused;
 *  - cuMemPoolTrimTo: the pool's charge follows what it still reserves (pools.c).
 * Refusals are logged once each at the default log level.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "state.h"

#define REAL(name, type) ((type)ts_real.name)

typedef CUresult (*alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*free_v1_fn)(CUdeviceptr_v1);
typedef CUresult (*pitch_v1_fn)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
typedef CUresult (*trim_fn)(CUmemoryPool, size_t);
typedef CUresult (*set_limit_fn)(int, size_t);
typedef CUresult (*get_limit_fn)(size_t *, int);
typedef CUresult (*attr_fn)(int *, int, CUdevice);
typedef CUresult (*mem_node_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult (*add_node_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *);
typedef CUresult (*add_node_v2_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t, void *);

/* ---- the unversioned (pre-3.2) entry points ---- */

CUresult ts_hook_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAlloc);
    alloc_v1_fn real = REAL(cuMemAlloc, alloc_v1_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(dptr, size);
    int ord, rdev;
    CUresult rc = ts_current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    if ((rc = ts_reserve(mode, ord, size, &rdev, "cuMemAlloc (unversioned)")) != CUDA_SUCCESS) return rc;
    rc = real(dptr, size);
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && ts_loans_retry_driver(rdev)) rc = real(dptr, size);
    if (rc != CUDA_SUCCESS || !dptr) {
        if (rdev >= 0) ts_region_release(rdev, size);
        return rc;
    }
    ts_track(TS_PTRS, (uint64_t)*dptr, size, rdev, ord, TS_KIND_SYNC);
    return rc;
}

CUresult ts_hook_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                                 unsigned int elem) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemAllocPitch);
    pitch_v1_fn real = REAL(cuMemAllocPitch, pitch_v1_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(dptr, pitch, width, height, elem);
    int ord, rdev;
    CUresult rc = ts_current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    /* Charge the widest pitch a driver uses (rows rounded up to 512 bytes), settle afterwards. */
    uint64_t guess = ((uint64_t)width + 511) / 512 * 512 * (uint64_t)height;
    if ((rc = ts_reserve(mode, ord, guess, &rdev, "cuMemAllocPitch (unversioned)")) != CUDA_SUCCESS) return rc;
    rc = real(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS || !dptr || !pitch) {
        if (rdev >= 0) ts_region_release(rdev, guess);
        return rc;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (rdev >= 0 && actual > guess) {
        ts_dev *d = ts_device(ord);
        if (ts_region_reserve(rdev, actual - guess, d->limit) != 1) {
            REAL(cuMemFree, free_v1_fn)(*dptr);
            ts_region_release(rdev, guess);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (rdev >= 0 && actual < guess) {
        ts_region_release(rdev, guess - actual);
    }
    ts_track(TS_PTRS, (uint64_t)*dptr, actual, rdev, ord, TS_KIND_SYNC);
    return rc;
}

CUresult ts_hook_cuMemFree(CUdeviceptr_v1 ptr) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemFree);
    free_v1_fn real = REAL(cuMemFree, free_v1_fn);
    ts_record r;
    if (ts_mode() == TS_MODE_PASSTHROUGH || !ts_untrack(TS_PTRS, (uint64_t)ptr, &r)) return real(ptr);
    CUresult rc = real(ptr);
    if (rc != CUDA_SUCCESS) ts_track(TS_PTRS, r.key, r.size, r.rdev, r.ordinal, r.kind);
    else ts_region_release(r.rdev, r.size);
    return rc;
}

static unsigned int clamp32(size_t v) { return v > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)v; }

/* The same answer as the _v2 hook, in 32 bits (as the driver clamps them). */
CUresult ts_hook_cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemGetInfo);
    if (!ts_real.cuMemGetInfo_v2) return REAL(cuMemGetInfo, CUresult(*)(unsigned int *, unsigned int *))(free_bytes,
                                                                                                     total_bytes);
    size_t f = 0, t = 0;
    CUresult rc = ts_hook_cuMemGetInfo_v2(free_bytes ? &f : NULL, total_bytes ? &t : NULL);
    if (rc != CUDA_SUCCESS) return rc;
    if (free_bytes) *free_bytes = clamp32(f);
    if (total_bytes) *total_bytes = clamp32(t);
    return rc;
}

CUresult ts_hook_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuDeviceTotalMem);
    if (!ts_real.cuDeviceTotalMem_v2) return REAL(cuDeviceTotalMem, CUresult(*)(unsigned int *, CUdevice))(bytes, dev);
    size_t t = 0;
    CUresult rc = ts_hook_cuDeviceTotalMem_v2(bytes ? &t : NULL, dev);
    if (rc == CUDA_SUCCESS && bytes) *bytes = clamp32(t);
    return rc;
}

/* Same signature and meaning as _v2: charged like it. */
CUresult ts_hook_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxCreate);
    if (!ts_real.cuCtxCreate_v2) {
        if (ts_mode() == TS_MODE_PASSTHROUGH) return REAL(cuCtxCreate, CUresult(*)(CUcontext *, unsigned, CUdevice))(
            pctx, flags, dev);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return ts_hook_cuCtxCreate_v2(pctx, flags, dev);
}

CUresult ts_hook_cuCtxDestroy(CUcontext ctx) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxDestroy);
    if (!ts_real.cuCtxDestroy_v2) return REAL(cuCtxDestroy, CUresult(*)(CUcontext))(ctx);
    return ts_hook_cuCtxDestroy_v2(ctx);
}

/* ---- pools ---- */

CUresult ts_hook_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolTrimTo);
    CUresult rc = REAL(cuMemPoolTrimTo, trim_fn)(pool, keep);
    if (rc == CUDA_SUCCESS && ts_mode() == TS_MODE_LIMITED) ts_pools_settle_all();
    return rc;
}

/* ---- graph memory nodes ---- */

#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10

static CUresult refuse_graph_memory(const char *what) {
    ts_log_once("graph-mem", "%s refused: CUDA graph memory nodes take device memory at launch, where the "
                "limit cannot be enforced (allocate before capture, or use cuMemAlloc inside the graph's kernels' "
                "buffers)", what);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult ts_hook_cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                                        CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    BIND_OR_FAIL();
    NEED_REAL(cuGraphAddMemAllocNode);
    if (ts_mode() != TS_MODE_PASSTHROUGH) return refuse_graph_memory("cuGraphAddMemAllocNode");
    return REAL(cuGraphAddMemAllocNode, mem_node_fn)(node, graph, deps, n, params);
}

CUresult ts_hook_cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n, void *params) {
    BIND_OR_FAIL();
    NEED_REAL(cuGraphAddNode);
    if (params && *(const int *)params == CU_GRAPH_NODE_TYPE_MEM_ALLOC && ts_mode() != TS_MODE_PASSTHROUGH)
        return refuse_graph_memory("cuGraphAddNode (memory allocation node)");
    return REAL(cuGraphAddNode, add_node_fn)(node, graph, deps, n, params);
}

CUresult ts_hook_cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edges,
                                   size_t n, void *params) {
    BIND_OR_FAIL();
    NEED_REAL(cuGraphAddNode_v2);
    if (params && *(const int *)params == CU_GRAPH_NODE_TYPE_MEM_ALLOC && ts_mode() != TS_MODE_PASSTHROUGH)
        return refuse_graph_memory("cuGraphAddNode (memory allocation node)");
    return REAL(cuGraphAddNode_v2, add_node_v2_fn)(node, graph, deps, edges, n, params);
}

/* ---- context limits ---- */

/* What each context's limits are charged (issue #28 class 3: every context has its own heap,
 * FIFO and stack reserve, so a second context's cuCtxSetLimit takes memory again). Keyed by the
 * context's address with the limit in its low bits (contexts are at least 8-byte aligned); under
 * ts_tab_mu. */
static ts_table g_ctx_limits;

static uint64_t ctx_limit_key(CUcontext c, int limit) { return (uint64_t)(uintptr_t)c | (uint64_t)limit; }

void ts_ctx_limits_release(CUcontext c) {
    uint64_t sums[TS_MAX_DEVICES] = {0};
    pthread_mutex_lock(&ts_tab_mu);
    for (int l = CU_LIMIT_STACK_SIZE; l <= CU_LIMIT_MALLOC_HEAP_SIZE; l++) {
        ts_record r;
        if (ts_table_take(&g_ctx_limits, ctx_limit_key(c, l), &r) && r.rdev >= 0 && r.rdev < TS_MAX_DEVICES)
            sums[r.rdev] += r.size;
    }
    pthread_mutex_unlock(&ts_tab_mu);
    for (int i = 0; i < TS_MAX_DEVICES; i++)
        if (sums[i]) ts_region_release(i, sums[i]);
}

static uint64_t limit_bytes(int limit, size_t value, int ord) {
    if (limit != CU_LIMIT_STACK_SIZE) return value;
    int sms = 0, threads = 0;
    if (!ts_real.cuDeviceGetAttribute ||
        REAL(cuDeviceGetAttribute, attr_fn)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ord) != CUDA_SUCCESS ||
        REAL(cuDeviceGetAttribute, attr_fn)(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, ord) !=
            CUDA_SUCCESS || sms <= 0 || threads <= 0) {
        sms = 256; /* unknown: more than any current GPU */
        threads = 2048;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)value, (uint64_t)sms * (uint64_t)threads, &bytes)) return UINT64_MAX;
    return bytes;
}

CUresult ts_hook_cuCtxSetLimit(int limit, size_t value) {
    BIND_OR_FAIL();
    NEED_REAL(cuCtxSetLimit);
    set_limit_fn real = REAL(cuCtxSetLimit, set_limit_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(limit, value);
    if (limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH || limit == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT) {
        size_t cur = 0;
        if (!ts_real.cuCtxGetLimit || REAL(cuCtxGetLimit, get_limit_fn)(&cur, limit) != CUDA_SUCCESS || value > cur) {
            ts_log_once("ctx-limit-devrt", "cuCtxSetLimit(%d, %zu) refused: raising the device runtime's limits "
                        "reserves device memory the library cannot size", limit, value);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        return real(limit, value);
    }
    if (limit < CU_LIMIT_STACK_SIZE || limit > CU_LIMIT_MALLOC_HEAP_SIZE) return real(limit, value);
    int ord;
    CUresult rc = ts_current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return real(limit, value);
    if (ord < 0 || ord >= TS_MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    uint64_t want = limit_bytes(limit, value, ord);
    CUcontext ctx = NULL;
    if (!ts_real.cuCtxGetCurrent || ((CUresult(*)(CUcontext *))ts_real.cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || !ctx)
        return real(limit, value); /* no context: the driver's error */
    uint64_t key = ctx_limit_key(ctx, limit);
    pthread_mutex_lock(&ts_tab_mu);
    ts_record *prev = ts_table_find(&g_ctx_limits, key);
    uint64_t had = prev ? prev->size : 0;
    pthread_mutex_unlock(&ts_tab_mu);
    int rdev = -1;
    if (want > had) {
        rc = ts_reserve(mode, ord, want - had, &rdev, "cuCtxSetLimit");
        if (rc != CUDA_SUCCESS) {
            ts_log_once("ctx-limit", "cuCtxSetLimit(%d, %zu) refused: it would take %llu bytes of device memory "
                        "over the workload's limit", limit, value, (unsigned long long)(want - had));
            return rc;
        }
    }
    rc = real(limit, value);
    if (rc != CUDA_SUCCESS) {
        if (rdev >= 0) ts_region_release(rdev, want - had);
        return rc;
    }
    ts_dev *d = ts_device(ord);
    uint64_t keep = d && d->limited ? want : 0;
    pthread_mutex_lock(&ts_tab_mu);
    if (keep) ts_table_put(&g_ctx_limits, key, keep, d->rdev, ord, TS_KIND_OTHER);
    else {
        ts_record gone;
        ts_table_take(&g_ctx_limits, key, &gone);
    }
    pthread_mutex_unlock(&ts_tab_mu);
    if (want < had && d && d->rdev >= 0) ts_region_release(d->rdev, had - want);
    return rc;
}

TS_ALIAS(cuMemAlloc)
TS_ALIAS(cuMemAllocPitch)
TS_ALIAS(cuMemFree)
TS_ALIAS(cuMemGetInfo)
TS_ALIAS(cuDeviceTotalMem)
TS_ALIAS(cuCtxCreate)
TS_ALIAS(cuCtxDestroy)
TS_ALIAS(cuMemPoolTrimTo)
TS_ALIAS(cuGraphAddMemAllocNode)
TS_ALIAS(cuGraphAddNode)
TS_ALIAS(cuGraphAddNode_v2)
TS_ALIAS(cuCtxSetLimit)
