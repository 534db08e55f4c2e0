/* Process state shared by the hooks (internal). Lock order: bind mutex, init mutex, ts_tab_mu, region. */
#ifndef TESSERA_STATE_H
#define TESSERA_STATE_H

#include "interpose.h"

typedef struct {
    int ready;
    int limited;
    uint64_t limit;
    int rdev; /* region device index; -1 (limited) refuses everything */
    char uuid[TS_UUID_LEN];
    uint64_t ctx_overhead; /* bytes charged per context on this device (never 0 when limited) */
    int ctx_fixed;         /* ctx_overhead is configured or measured; 0: measure at the next context */
} ts_dev;

/* Context memory measured through NVML at the first context on a device (ctxmeasure.c). */
typedef struct {
    int ok, initialized, have_free;
    nvmlDevice_t dev;
    uint64_t free_before;
    const char *why; /* why nothing can be measured */
} ts_ctx_probe;
/* Taken just before the driver creates the context; NVML stays initialised until _after. */
void ts_ctx_probe_before(const char *uuid, ts_ctx_probe *p);
/* Bytes the new context ctx holds, 0 when it could not be measured; *how says how (or why not);
 * *exact: 0 when the reading is only a lower bound (the drop in free memory). Probe allocations
 * are charged on rdev (when >= 0) against limit while they exist. */
uint64_t ts_ctx_probe_after(ts_ctx_probe *p, int ordinal, CUcontext ctx, int rdev, uint64_t limit, int *exact,
                            const char **how);
/* Serialises the creations that measure (lock order: before the bind mutex and ts_tab_mu). */
extern pthread_mutex_t ts_measure_mu;

extern ts_config ts_cfg;
extern pthread_mutex_t ts_tab_mu;
extern ts_table ts_handles, ts_maps, ts_ctxs, ts_pools, ts_arrays;
extern int ts_primary_refs[TS_MAX_DEVICES];
extern int ts_custom_ctxs[TS_MAX_DEVICES];

#define BIND_OR_FAIL()                                                                                   \
    do {                                                                                                 \
        if (!__atomic_load_n(&ts_bound[TS_LIB_CUDA], __ATOMIC_ACQUIRE) && ts_bind(TS_LIB_CUDA) != 0)     \
            return CUDA_ERROR_NOT_INITIALIZED;                                                           \
    } while (0)
/* A hook is only reachable for an entry point the driver has, but a program linked against a
 * newer driver than the one installed could still call one: answer instead of jumping to NULL. */
#define NEED_REAL(name) \
    do { if (!ts_real.name) return CUDA_ERROR_NOT_FOUND; } while (0)

/* Loads configuration and attaches the region on first use; returns TS_MODE_*. */
int ts_mode(void);
/* The state of a CUDA device ordinal (resolved on first use), or NULL when out of range. */
ts_dev *ts_device(int ordinal);
void ts_report_refusal(const char *what);
void ts_format_uuid(const unsigned char *u, char *out, size_t len);

/* Shared by the hook files (hooks_cuda.c, hooks_extra.c). */
CUresult ts_reserve(int mode, int ordinal, uint64_t size, int *rdev, const char *what);
CUresult ts_current_ordinal(int *ord);
/* TS_PTRS: the sharded device-pointer table (ptrs.c) for ts_track/ts_untrack. */
#define TS_PTRS ((ts_table *)0)
void ts_track(ts_table *t, uint64_t key, uint64_t size, int rdev, int ordinal, int kind);
int ts_untrack(ts_table *t, uint64_t key, ts_record *out);
/* Stream-ordered pools: what each pool holds is charged (pools.c). */
CUresult ts_pool_alloc(void *real, int kind, CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s,
                       const char *what);
CUresult ts_pool_free(void *real, CUdeviceptr ptr, CUstream s);
/* After the driver freed a tracked stream-ordered allocation (by either free API). */
void ts_pool_freed(const ts_record *r);
/* A context went away: what its cuCtxSetLimit reserves were charged is given back (hooks_extra.c). */
void ts_ctx_limits_release(CUcontext c);
/* After fork, in the child: no exports, no IPC memory of its own (hooks_share.c). */
void ts_share_after_fork(void);
void ts_pool_created(CUmemoryPool pool, int ordinal);
/* What this process has charged on a region device (its slot), for measurements (hooks_held.c). */
uint64_t ts_region_mine(int rdev);
/* A copy of a charged pointer's record (ptrs.c); 0 when it is not charged. */
int ts_ptrs_find(uint64_t key, ts_record *out);
void ts_pool_destroyed(CUmemoryPool pool, CUresult rc);
void ts_pools_settle_all(void);
int ts_stream_ordinal(CUstream s, int *ord);

#endif
