/*
 * A fake libcuda.so.1 for tests without a GPU. It simulates the devices described by
 * FAKE_GPU_DEVICES (see fake_devices.c) with per-process physical accounting, contexts,
 * streams, memory pools, VMM handles and cuGetProcAddress with versioned entry points.
 *
 * Test knobs (environment):
 *   FAKE_GPU_DEVICES            devices, "NAME=SIZE;NAME=SIZE" (default one H100 80GB)
 *   FAKE_GPU_USED_<i>           bytes of device i used by other processes (lowers free memory)
 *   FAKE_GPU_CONTEXT_BYTES      physical bytes each context takes (default: the model's CUDA 12
 *                               context, 320-512 MiB, counted in NVML's per-process memory)
 *   FAKE_CUDA_HANG_ALLOC_SIZE   cuMemAlloc_v2 of exactly this size prints "fake-cuda: hang" to
 *                               stderr and sleeps forever (to kill a process mid-allocation)
 *   FAKE_CUDA_PROC_INTERNAL=1   cuGetProcAddress returns internal addresses that differ from
 *                               the exported symbols (as a driver may)
 *   FAKE_CUDA_DRIVER_VERSION    version reported and the highest accepted (default 12080)
 *   FAKE_GPU_STATE              file shared by the processes of one simulated machine: each
 *                               publishes its bytes per device there (fake_devices.h), so free
 *                               memory is what the others left and the fake NVML lists processes
 *   FAKE_GPU_SM_UTIL            this process's SM utilisation as the fake NVML reports it (percent)
 *   FAKE_CUDA_CTX_SIGNAL        PATH: a context creation, its memory taken, creates PATH and waits
 *                               for PATH.done (another process acts in the middle of a creation)
 * Built with -DFAKE_HIDE_PTSZ (fake-noptsz/), the _ptsz variants are not exported.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_devices.h"
#include "fake_timing.h"
#include "tessera_cuda_types.h"

#define EXPORT __attribute__((visibility("default")))
/* FAKE_HIDE_PTSZ builds a driver that hands out the per-thread-stream variants through
 * cuGetProcAddress only, without exporting them under their names. */
#ifdef FAKE_HIDE_PTSZ
#define PTSZ_EXPORT static
#else
#define PTSZ_EXPORT EXPORT
#endif
#define CTX_MAGIC 0xC0C0C0C0u
#define STREAM_MAGIC 0x5EEA5EEAu
#define POOL_MAGIC 0x9001F00Du
#define GRANULARITY (2ULL << 20)
#define PITCH_ALIGN 512ULL

struct CUctx_st {
    unsigned magic;
    int dev;
    int primary;
    uint64_t limits[5]; /* cuCtxSetLimit values of this context (0: default): each context has its own */
};
struct CUstream_st {
    unsigned magic;
    CUcontext ctx;
    int capturing;          /* cuStreamBeginCapture: stream-ordered allocations become graph nodes */
    uint64_t capture_bytes; /* bytes of the allocations captured so far */
};
/* Stream-ordered pools keep what is freed to them reserved (still taken from the device) until a
 * synchronisation trims them down to the release threshold, or cuMemPoolTrimTo. */
struct CUmemPoolHandle_st {
    unsigned magic;
    int dev; /* -1: host pool */
    int destroyed;
    uint64_t reserved;  /* bytes the pool holds on the device */
    uint64_t used;      /* bytes of live allocations */
    uint64_t threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
    int htypes;         /* handleTypes at creation: what it may be exported as */
    int imported;       /* cuMemPoolImportFromShareableHandle (fake_extra.c): the exporter's memory */
};
#define MAX_POOLS 256
static CUmemoryPool g_pools[MAX_POOLS];
static int g_npools;

typedef struct alloc_rec {
    uint64_t key;
    uint64_t size;
    int dev; /* -1: not charged to a device */
    int refs;
    CUmemoryPool pool; /* stream-ordered allocation from this pool */
    uint64_t len;      /* a mapping: its length */
    int urefs;         /* VMM handles: the program's references (create/import, retain; release drops one) */
    int htypes;        /* VMM handles: requestedHandleTypes at creation (what it may be exported as) */
    uint64_t target;   /* an imported VMM handle: the handle of the allocation it refers to (0: none) */
    int managed;       /* cuMemAllocManaged: its pages migrate (fake_extra.c) */
    struct alloc_rec *next;
} alloc_rec;

#define NBUCKETS 4096
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER; /* primary contexts */
static alloc_rec *g_ptrs[NBUCKETS];
static alloc_rec *g_handles[NBUCKETS];
static alloc_rec *g_maps[NBUCKETS]; /* mapped address -> handle */
static alloc_rec *g_arrays[NBUCKETS]; /* live array handles */
static alloc_rec *g_ipc[NBUCKETS];    /* IPC allocations opened here (fake_share.c) */
static uint64_t g_used[FAKE_MAX_DEVICES];
static uint64_t g_counter;
static int g_initialized;
static struct CUctx_st g_primary[FAKE_MAX_DEVICES];
static int g_primary_refs[FAKE_MAX_DEVICES];
static struct CUmemPoolHandle_st g_default_pool[FAKE_MAX_DEVICES];
static CUmemoryPool g_current_pool[FAKE_MAX_DEVICES]; /* cuDeviceSetMemPool; NULL: the default */
static uint64_t g_graph_reserved[FAKE_MAX_DEVICES];   /* graph memory of launched executables */
static uint64_t g_graph_idle[FAKE_MAX_DEVICES];       /* of destroyed ones, until cuDeviceGraphMemTrim */
static __thread CUcontext t_stack[16];
static __thread int t_depth;

static int driver_version(void) {
    const char *v = getenv("FAKE_CUDA_DRIVER_VERSION");
    return v ? atoi(v) : 12080;
}

static unsigned bucket(uint64_t key) { return (unsigned)((key * 0x9E3779B97F4A7C15ULL) >> 52) % NBUCKETS; }

static void rec_put(alloc_rec **table, uint64_t key, uint64_t size, int dev) {
    alloc_rec *r = malloc(sizeof *r);
    r->key = key;
    r->size = size;
    r->dev = dev;
    r->refs = 1;
    r->pool = NULL;
    r->len = 0;
    r->urefs = 1;
    r->htypes = 0;
    r->target = 0;
    r->managed = 0;
    unsigned b = bucket(key);
    r->next = table[b];
    table[b] = r;
}

static alloc_rec *rec_take(alloc_rec **table, uint64_t key) {
    unsigned b = bucket(key);
    for (alloc_rec **p = &table[b]; *p; p = &(*p)->next) {
        if ((*p)->key == key) {
            alloc_rec *r = *p;
            *p = r->next;
            return r;
        }
    }
    return NULL;
}

static alloc_rec *find(alloc_rec **table, uint64_t key);
static void handle_unref(uint64_t handle);
#include "fake_share.h"

/* Charges (or frees) bytes on CUDA ordinal dev and publishes them to the cross-process state
 * (FAKE_GPU_STATE, fake_devices.c) so other processes and the fake NVML see them. */
static void used_add(int dev, int64_t delta) {
    g_used[dev] += (uint64_t)delta;
    fake_state_add(fake_cuda_device(dev)->index, delta);
}

static uint64_t device_free(int dev) {
    fake_device *d = fake_cuda_device(dev);
    uint64_t busy = g_used[dev] + d->other_used + fake_state_others_on(d);
    uint64_t free_bytes = busy >= d->total ? 0 : d->total - busy;
    if (d->mig_gi < 0) {  /* NVML's per-cgroup limits (r615+) bind whole GPUs, not MIG devices */
        uint64_t room = fake_memlimit_room(d->index);
        if (room < free_bytes) free_bytes = room;
    }
    return free_bytes;
}

static CUcontext current(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

static int valid_ctx(CUcontext c) { return c != NULL && c->magic == CTX_MAGIC; }
static void ctx_drop_limits(CUcontext c);

/* Charges size bytes to dev (or to nothing when dev < 0) and returns a fresh address. */
static CUresult charge(int dev, uint64_t size, unsigned long long *out, alloc_rec **table) {
    pthread_mutex_lock(&g_mu);
    if (dev >= 0) {
        fake_state_lock();
        if (size > device_free(dev)) {
            fake_state_unlock();
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        used_add(dev, (int64_t)(size));
        fake_state_unlock();
    }
    uint64_t key = ((uint64_t)(dev + 2) << 52) | ((++g_counter) << 12);
    rec_put(table, key, size, dev);
    pthread_mutex_unlock(&g_mu);
    *out = key;
    return CUDA_SUCCESS;
}

static CUresult release(alloc_rec **table, uint64_t key) {
    pthread_mutex_lock(&g_mu);
    alloc_rec *r = rec_take(table, key);
    if (r && r->pool) {
        r->pool->used -= r->size; /* stays reserved in the pool */
        if (r->pool->destroyed) {
            used_add(r->pool->dev, -(int64_t)r->size);
            r->pool->reserved -= r->size;
        }
    } else if (r && r->dev >= 0) used_add(r->dev, -(int64_t)(r->size));
    pthread_mutex_unlock(&g_mu);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    free(r);
    return CUDA_SUCCESS;
}

/* FAKE_CUDA_CTX_SIGNAL=PATH: once a context's memory is taken, create PATH and wait (up to 5 s)
 * for PATH.done, so a test can make another process act while the context is being created. */
static void ctx_signal(void) {
    const char *path = getenv("FAKE_CUDA_CTX_SIGNAL");
    if (!path || !*path) return;
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    char done[4096];
    snprintf(done, sizeof done, "%s.done", path);
    for (int i = 0; i < 1000 && access(done, F_OK) != 0; i++) usleep(5000);
}

static CUresult ctx_charge(int dev, int sign) {
    uint64_t bytes = fake_context_bytes_on(fake_cuda_device(dev));
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    if (sign > 0) {
        if (bytes > device_free(dev)) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else used_add(dev, (int64_t)(bytes));
    } else {
        used_add(dev, -(int64_t)(bytes));
    }
    fake_state_unlock();
    pthread_mutex_unlock(&g_mu);
    if (sign > 0 && rc == CUDA_SUCCESS) ctx_signal();
    return rc;
}

/* A green context (fake_extra.c) holds what a context holds on its device. */
CUresult fake_ctx_charge(int dev, int sign) { return ctx_charge(dev, sign); }

#define NEED_INIT() \
    do { if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX(var)                                        \
    NEED_INIT();                                             \
    CUcontext var = current();                               \
    if (!valid_ctx(var)) return CUDA_ERROR_INVALID_CONTEXT

static int valid_dev(CUdevice dev) { return dev >= 0 && dev < fake_cuda_count(); }

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (fake_cuda_count() == 0) return CUDA_ERROR_NO_DEVICE;
    g_initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = driver_version();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    NEED_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = fake_cuda_count();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    NEED_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", fake_cuda_device(dev)->name);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    NEED_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, fake_cuda_device(dev)->uuid, 16);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NEED_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fake_cuda_device(dev)->total;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

static void push(CUcontext c) {
    if (t_depth < 16) t_stack[t_depth++] = c;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_primary_refs[dev] == 0) {
        CUresult rc = ctx_charge(dev, 1);
        if (rc) {
            pthread_mutex_unlock(&g_ctx_mu);
            return rc;
        }
        g_primary[dev].magic = CTX_MAGIC;
        g_primary[dev].dev = dev;
        g_primary[dev].primary = 1;
    }
    g_primary_refs[dev]++;
    pthread_mutex_unlock(&g_ctx_mu);
    *pctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_ctx_mu);
    int refs = g_primary_refs[dev];
    int gone = refs > 0 && --g_primary_refs[dev] == 0;
    if (gone) ctx_charge(dev, -1);
    pthread_mutex_unlock(&g_ctx_mu);
    if (gone) ctx_drop_limits(&g_primary[dev]);
    return refs == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_primary_refs[dev] > 0) ctx_charge(dev, -1);
    g_primary_refs[dev] = 0;
    pthread_mutex_unlock(&g_ctx_mu);
    ctx_drop_limits(&g_primary[dev]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = ctx_charge(dev, 1);
    if (rc) return rc;
    CUcontext c = calloc(1, sizeof *c);
    c->magic = CTX_MAGIC;
    c->dev = dev;
    push(c);
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev) {
    (void)params; (void)n; (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev) {
    (void)params; (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    NEED_INIT();
    if (!valid_ctx(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == ctx) t_stack[i] = NULL;
    while (t_depth > 0 && t_stack[t_depth - 1] == NULL) t_depth--;
    ctx_charge(ctx->dev, -1);
    ctx_drop_limits(ctx);
    ctx->magic = 0;
    free(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT();
    if (ctx == NULL) {
        if (t_depth > 0) t_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0) push(ctx);
    else t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    NEED_INIT();
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    push(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    NEED_INIT();
    if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev) {
    NEED_CTX(c);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

static void sync_pools(void);

EXPORT CUresult cuCtxSynchronize(void) {
    NEED_CTX(c);
    fake_timing_sync_dev(c->dev);
    sync_pools();
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    NEED_CTX(c);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    fake_exports_poll();
    *free_bytes = device_free(c->dev);
    pthread_mutex_unlock(&g_mu);
    *total_bytes = fake_cuda_device(c->dev)->total;
    return CUDA_SUCCESS;
}

static void maybe_hang(size_t size) {
    const char *h = getenv("FAKE_CUDA_HANG_ALLOC_SIZE");
    if (h && strtoull(h, NULL, 10) == size) {
        fprintf(stderr, "fake-cuda: hang\n");
        fflush(stderr);
        for (;;) pause();
    }
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    NEED_CTX(c);
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    maybe_hang(size);
    return charge(c->dev, size, dptr, g_ptrs);
}

/* A future ABI of cuMemAlloc (CUDA "14.0" in this fake): the library must not take it for _v2. */
EXPORT CUresult cuMemAlloc_v3(CUdeviceptr *dptr, size_t size) { return cuMemAlloc_v2(dptr, size); }

/* Not a driver API: allocates through a path the isolation library does not hook, to stand
 * for memory it never saw (IPC imports, graphics interop, allocations made before preload). */
EXPORT CUresult fakeCudaAllocUnhooked(CUdeviceptr *dptr, size_t size) {
    NEED_CTX(c);
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    return charge(c->dev, size, dptr, g_ptrs);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem) {
    NEED_CTX(c);
    if (!dptr || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (elem != 4 && elem != 8 && elem != 16) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    CUresult rc = charge(c->dev, (uint64_t)p * height, dptr, g_ptrs);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    NEED_CTX(c);
    if (!dptr || size == 0 || (flags != 1 && flags != 2)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = charge(c->dev, size, dptr, g_ptrs);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        find(g_ptrs, *dptr)->managed = 1;
        pthread_mutex_unlock(&g_mu);
    }
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
    NEED_INIT();
    if (ptr == 0) return CUDA_SUCCESS;
    return release(g_ptrs, ptr);
}

static int stream_dev(CUstream s, int *dev) {
    uintptr_t v = (uintptr_t)s;
    if (v <= 2) {
        CUcontext c = current();
        if (!valid_ctx(c)) return 0;
        *dev = c->dev;
        return 1;
    }
    if (s->magic != STREAM_MAGIC) return 0;
    *dev = s->ctx->dev;
    return 1;
}

int fake_cuda_stream_dev(CUstream s, int *dev) { return g_initialized && stream_dev(s, dev); }
int fake_cuda_stream_capturing(CUstream s) { return (uintptr_t)s > 2 && s->magic == STREAM_MAGIC && s->capturing; }

static CUmemoryPool device_pool(int dev) {
    if (g_current_pool[dev]) return g_current_pool[dev];
    g_default_pool[dev].magic = POOL_MAGIC;
    g_default_pool[dev].dev = dev;
    return &g_default_pool[dev];
}

static void pool_register(CUmemoryPool p) {
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i] == p) return;
    if (g_npools < MAX_POOLS) g_pools[g_npools++] = p;
}

/* Serves size bytes from the pool's reserve, growing it from the device when needed. */
static CUresult pool_alloc(CUmemoryPool pool, uint64_t size, CUdeviceptr *out) {
    pthread_mutex_lock(&g_mu);
    pool_register(pool);
    uint64_t spare = pool->reserved - pool->used;
    if (pool->dev >= 0 && spare < size) {
        uint64_t need = size - spare;
        fake_state_lock();
        if (need > device_free(pool->dev)) {
            fake_state_unlock();
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        used_add(pool->dev, (int64_t)need);
        fake_state_unlock();
        pool->reserved += need;
    } else if (pool->dev < 0 && spare < size) {
        pool->reserved += size - spare;
    }
    pool->used += size;
    uint64_t key = ((uint64_t)(pool->dev + 2) << 52) | ((++g_counter) << 12);
    rec_put(g_ptrs, key, size, -1);
    find(g_ptrs, key)->pool = pool;
    pthread_mutex_unlock(&g_mu);
    *out = key;
    return CUDA_SUCCESS;
}

/* Gives reserved memory beyond keep back to the device (caller holds g_mu). */
static void pool_trim_locked(CUmemoryPool p, uint64_t keep) {
    if (p->reserved <= keep) return;
    uint64_t spare = p->reserved - p->used, drop = p->reserved - keep;
    if (drop > spare) drop = spare;
    p->reserved -= drop;
    if (p->dev >= 0) used_add(p->dev, -(int64_t)drop);
}

/* A synchronisation: every pool releases what it holds above its release threshold. */
static void sync_pools(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_npools; i++) pool_trim_locked(g_pools[i], g_pools[i]->threshold);
    pthread_mutex_unlock(&g_mu);
}

static CUresult capture_alloc(CUstream s, CUdeviceptr *dptr, size_t size) {
    pthread_mutex_lock(&g_mu);
    s->capture_bytes += size;
    *dptr = (0x6ULL << 52) | ((++g_counter) << 12); /* allocated when the graph is launched */
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    NEED_INIT();
    int dev;
    if (!stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)s > 2 && s->capturing) return capture_alloc(s, dptr, size);
    return pool_alloc(device_pool(dev), size, dptr);
}

PTSZ_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    return cuMemAllocAsync(dptr, size, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    NEED_INIT();
    int dev;
    if (!stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if (!pool || pool->magic != POOL_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (!dptr || size == 0 || pool->imported) return CUDA_ERROR_INVALID_VALUE; /* imported: the exporter's */
    if ((uintptr_t)s > 2 && s->capturing) return capture_alloc(s, dptr, size);
    return pool_alloc(pool, size, dptr);
}

PTSZ_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                             CUstream s) {
    return cuMemAllocFromPoolAsync(dptr, size, pool, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    NEED_INIT();
    int dev;
    if (!stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if ((uintptr_t)s > 2 && s->capturing && (ptr >> 52) == 0x6) return CUDA_SUCCESS; /* a captured free */
    return release(g_ptrs, ptr);
}

PTSZ_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) { return cuMemFreeAsync(ptr, s); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NEED_INIT();
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_dev(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        dev = props->location.id;
    } else if (props->location.type != CU_MEM_LOCATION_TYPE_HOST) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUmemoryPool p = calloc(1, sizeof *p);
    p->magic = POOL_MAGIC;
    p->dev = dev;
    p->htypes = props->handleTypes;
    pthread_mutex_lock(&g_mu);
    pool_register(p);
    pthread_mutex_unlock(&g_mu);
    *pool = p;
    return CUDA_SUCCESS;
}

/* The pool's reserve goes back to the device; live allocations keep theirs until freed (the
 * struct is never freed, so their records stay valid). */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    NEED_INIT();
    if (!pool || pool->magic != POOL_MAGIC || pool->destroyed) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    pool_trim_locked(pool, 0);
    pool->destroyed = 1;
    pool->magic = 0;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        if (g_current_pool[d] == pool) g_current_pool[d] = NULL;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    NEED_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    g_default_pool[dev].magic = POOL_MAGIC;
    g_default_pool[dev].dev = dev;
    *pool = &g_default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    NEED_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pool = device_pool(dev);
    return CUDA_SUCCESS;
}

/* Like the real driver, the pool must be located on dev. */
EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->magic != POOL_MAGIC || pool->dev != dev) return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[dev] = pool;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    NEED_INIT();
    if (!pool || pool->magic != POOL_MAGIC || !value) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) pool->threshold = *(cuuint64_t *)value;
    else if (attr < 1 || attr > 8) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    NEED_INIT();
    if (!pool || pool->magic != POOL_MAGIC || !value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    cuuint64_t v;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = pool->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = pool->reserved; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = pool->used; break;
    default: pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    NEED_INIT();
    if (!pool || pool->magic != POOL_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    pool_trim_locked(pool, keep);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* Not a driver API: what this process holds on a device, as the driver would count it (for
 * adversarial tests to compare with the limit). */
EXPORT CUresult fakeCudaHeldBytes(CUdevice dev, unsigned long long *bytes) {
    if (!bytes || dev < 0 || dev >= FAKE_MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    fake_exports_poll();
    *bytes = g_used[dev];
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* ---- graphs: memory nodes are allocated from the device's graph pool at launch ---- */

#define GRAPH_MAGIC 0x6A4A9Au
struct CUgraph_st {
    unsigned magic;
    int dev;
    uint64_t bytes;
};
struct CUgraphExec_st {
    unsigned magic;
    int dev;
    uint64_t bytes;
    int launched;
};

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    NEED_INIT();
    (void)flags;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    CUgraph n = calloc(1, sizeof *n);
    n->magic = GRAPH_MAGIC;
    CUcontext c = current();
    n->dev = valid_ctx(c) ? c->dev : 0;
    *g = n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    NEED_INIT();
    (void)deps; (void)n;
    if (!node || !g || g->magic != GRAPH_MAGIC || !params || params->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(params->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g->dev = params->poolProps.location.id;
    g->bytes += params->bytesize;
    params->dptr = (0x6ULL << 52) | ((++g_counter) << 12);
    pthread_mutex_unlock(&g_mu);
    *node = (CUgraphNode)g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    NEED_INIT();
    if (!g || g->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    fake_timing_forget(g);
    g->magic = 0;
    free(g);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
    NEED_INIT();
    (void)flags;
    if (!exec || !g || g->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    CUgraphExec e = calloc(1, sizeof *e);
    e->magic = GRAPH_MAGIC;
    e->dev = g->dev;
    e->bytes = g->bytes;
    fake_timing_instantiate(g, e);
    *exec = e;
    return CUDA_SUCCESS;
}

/* The first launch takes the graph's memory from the device; it stays with the graph pool. */
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    NEED_INIT();
    (void)s;
    if (!e || e->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    fake_timing_graph_launch(e, s);
    if (e->launched || e->bytes == 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    CUresult rc = CUDA_SUCCESS;
    if (e->bytes > device_free(e->dev)) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        used_add(e->dev, (int64_t)e->bytes);
        g_graph_reserved[e->dev] += e->bytes;
        e->launched = 1;
    }
    fake_state_unlock();
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    NEED_INIT();
    if (!e || e->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (e->launched) {
        g_graph_reserved[e->dev] -= e->bytes;
        g_graph_idle[e->dev] += e->bytes;
    }
    pthread_mutex_unlock(&g_mu);
    fake_timing_forget(e);
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    used_add(dev, -(int64_t)g_graph_idle[dev]);
    g_graph_idle[dev] = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    NEED_INIT();
    (void)mode;
    if (!s || (uintptr_t)s <= 2 || s->magic != STREAM_MAGIC || s->capturing) return CUDA_ERROR_INVALID_VALUE;
    s->capturing = 1;
    s->capture_bytes = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    NEED_INIT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    *status = ((uintptr_t)s > 2 && s->magic == STREAM_MAGIC && s->capturing) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                                               : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    NEED_INIT();
    if (!g || !s || (uintptr_t)s <= 2 || s->magic != STREAM_MAGIC || !s->capturing) return CUDA_ERROR_INVALID_VALUE;
    CUgraph n = calloc(1, sizeof *n);
    n->magic = GRAPH_MAGIC;
    n->dev = s->ctx->dev;
    n->bytes = s->capture_bytes;
    s->capturing = 0;
    fake_timing_capture_end(s, n);
    *g = n;
    return CUDA_SUCCESS;
}

/* ---- context limits: the malloc heap, printf FIFO and stack take device memory ---- */

#define FAKE_SMS 132
#define FAKE_THREADS_PER_SM 2048

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice dev) {
    NEED_INIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) *v = FAKE_SMS;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) *v = FAKE_THREADS_PER_SM;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static uint64_t limit_bytes(int limit, uint64_t value) {
    if (limit == CU_LIMIT_STACK_SIZE) return value * FAKE_SMS * FAKE_THREADS_PER_SM;
    if (limit == CU_LIMIT_PRINTF_FIFO_SIZE || limit == CU_LIMIT_MALLOC_HEAP_SIZE) return value;
    return 0;
}

/* A context that goes away gives back what its limits took (g_mu not held). */
static void ctx_drop_limits(CUcontext c) {
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    for (int l = 0; l < 5; l++) {
        used_add(c->dev, -(int64_t)limit_bytes(l, c->limits[l]));
        c->limits[l] = 0;
    }
    fake_state_unlock();
    pthread_mutex_unlock(&g_mu);
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t value) {
    NEED_CTX(c);
    if (limit < 0 || limit > 4) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    uint64_t old = limit_bytes(limit, c->limits[limit]), now = limit_bytes(limit, value);
    CUresult rc = CUDA_SUCCESS;
    if (now > old && now - old > device_free(c->dev)) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        used_add(c->dev, (int64_t)now - (int64_t)old);
        c->limits[limit] = value;
    }
    fake_state_unlock();
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxGetLimit(size_t *value, int limit) {
    NEED_CTX(c);
    if (!value || limit < 0 || limit > 4) return CUDA_ERROR_INVALID_VALUE;
    *value = c->limits[limit];
    return CUDA_SUCCESS;
}

/* ---- the pre-CUDA-3.2 ABI (32-bit sizes and device pointers), still exported by drivers ---- */

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size) {
    NEED_CTX(c);
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    if (size > device_free(c->dev)) {
        fake_state_unlock();
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    used_add(c->dev, (int64_t)size);
    fake_state_unlock();
    uint64_t key = 0x10000000ULL + ((++g_counter & 0xFFFFF) << 12);
    rec_put(g_ptrs, key, size, c->dev);
    pthread_mutex_unlock(&g_mu);
    *dptr = (CUdeviceptr_v1)key;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 ptr) { return cuMemFree_v2((CUdeviceptr)ptr); }

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc != CUDA_SUCCESS) return rc;
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = f > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)f;
    *total_bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    size_t t;
    CUresult rc = cuDeviceTotalMem_v2(&t, dev);
    if (rc == CUDA_SUCCESS && bytes) *bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    return rc;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                                unsigned int elem) {
    NEED_CTX(c);
    if (!dptr || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    (void)elem;
    unsigned int p = (unsigned int)((width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN);
    uint64_t total = (uint64_t)p * height;
    if (total > 0xFFFFFFFFu) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuMemAlloc(dptr, (unsigned int)total);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    NEED_CTX(c);
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    CUstream st = calloc(1, sizeof *st);
    st->magic = STREAM_MAGIC;
    st->ctx = c;
    *s = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    NEED_INIT();
    if (!s || (uintptr_t)s <= 2 || s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)s <= 2) {
        *pctx = current();
        return valid_ctx(*pctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = s->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    NEED_INIT();
    int sdev;
    if (stream_dev(s, &sdev)) fake_timing_sync_dev(sdev);
    sync_pools();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, int option) {
    NEED_INIT();
    (void)option;
    if (!gran || !prop) return CUDA_ERROR_INVALID_VALUE;
    *gran = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    NEED_INIT();
    if (!handle || !prop || flags != 0 || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_dev(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
    } else if (prop->location.type != CU_MEM_LOCATION_TYPE_HOST &&
               prop->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->requestedHandleTypes & ~(FAKE_HANDLE_TYPE_FD | FAKE_HANDLE_TYPE_FABRIC)) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = charge(dev, size, handle, g_handles);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        find(g_handles, *handle)->htypes = prop->requestedHandleTypes;
        pthread_mutex_unlock(&g_mu);
    }
    return rc;
}

/* The program's reference goes; the memory stays while mappings, imported handles or exported
 * shareable handles (fake_share.c) still refer to it. A released handle is invalid. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    fake_exports_poll();
    alloc_rec *r = find(g_handles, handle);
    int known = r != NULL && r->urefs > 0;
    if (known) {
        r->urefs--;
        handle_unref(handle);
    }
    pthread_mutex_unlock(&g_mu);
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- for fake_share.c (caller holds the lock) ---- */
void fake_lock(void) { pthread_mutex_lock(&g_mu); }
void fake_unlock(void) { pthread_mutex_unlock(&g_mu); }
/* A handle the program may use (not released): its allocation's size, device and handle types. */
int fake_vmm_valid(uint64_t h, uint64_t *size, int *dev, int *types) {
    alloc_rec *r = find(g_handles, h);
    if (!r || r->urefs <= 0) return 0;
    alloc_rec *a = r->target ? find(g_handles, r->target) : r;
    if (!a) return 0;
    if (size) *size = a->size;
    if (dev) *dev = a->dev;
    if (types) *types = a->htypes;
    return 1;
}
int fake_vmm_exists(uint64_t h) { return find(g_handles, h) != NULL; }
uint64_t fake_vmm_root(uint64_t h) {
    alloc_rec *r = find(g_handles, h);
    return r && r->target ? r->target : h;
}
void fake_vmm_ref(uint64_t h) {
    alloc_rec *r = find(g_handles, h);
    if (r) r->refs++;
}
void fake_vmm_unref(uint64_t h) { handle_unref(h); }
/* A new program handle referring to root's allocation (an import). */
uint64_t fake_vmm_alias(uint64_t root) {
    uint64_t key = (0x6ULL << 52) | ((++g_counter) << 12);
    rec_put(g_handles, key, 0, -1);
    find(g_handles, key)->target = root;
    fake_vmm_ref(root);
    return key;
}
/* For IPC: the allocation at a device pointer (exact or inside). */
int fake_ptr_range(uint64_t p, uint64_t *base, uint64_t *size, int *dev) {
    alloc_rec *r = find(g_ptrs, p);
    if (!r) r = find(g_ipc, p);
    for (unsigned b = 0; !r && b < NBUCKETS; b++) {
        for (alloc_rec *q = g_ptrs[b]; q && !r; q = q->next)
            if (p >= q->key && p - q->key < q->size) r = q;
        for (alloc_rec *q = g_ipc[b]; q && !r; q = q->next)
            if (p >= q->key && p - q->key < q->size) r = q;
    }
    if (!r) return 0;
    *base = r->key;
    *size = r->size;
    *dev = r->dev >= 0 ? r->dev : (r->pool ? r->pool->dev : -1);
    return 1;
}
/* Managed memory at p migrates to CUDA ordinal dst (fake_extra.c): what the device held moves
 * with it, as the pages do on a real GPU. CUDA_ERROR_INVALID_VALUE: not managed memory. */
CUresult fake_managed_migrate(uint64_t p, int dst) {
    pthread_mutex_lock(&g_mu);
    alloc_rec *r = NULL;
    for (unsigned b = 0; !r && b < NBUCKETS; b++)
        for (alloc_rec *q = g_ptrs[b]; q && !r; q = q->next)
            if (p >= q->key && p - q->key < q->size) r = q;
    CUresult rc = CUDA_SUCCESS;
    if (!r || !r->managed || r->dev < 0) rc = CUDA_ERROR_INVALID_VALUE;
    else if (dst >= 0 && dst != r->dev) {
        fake_state_lock();
        if (r->size > device_free(dst)) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            used_add(r->dev, -(int64_t)r->size);
            used_add(dst, (int64_t)r->size);
            r->dev = dst;
        }
        fake_state_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
/* An imported pool (fake_extra.c): allocations come from the exporter only. */
CUmemoryPool fake_pool_imported(int dev) {
    CUmemoryPool p = calloc(1, sizeof *p);
    p->magic = POOL_MAGIC;
    p->dev = dev;
    p->imported = 1;
    return p;
}
int fake_pool_is_imported(CUmemoryPool p) { return p && p->magic == POOL_MAGIC && p->imported; }
/* A pool's device (-1: host) and the handle types it was created with; 0: not a live pool. */
int fake_pool_info(CUmemoryPool p, int *dev, int *htypes) {
    if (!p || p->magic != POOL_MAGIC || p->destroyed) return 0;
    *dev = p->dev;
    *htypes = p->htypes;
    return 1;
}
/* For IPC: charges an opened allocation to this process (key in the IPC table). */
CUresult fake_ipc_charge(int dev, uint64_t size, uint64_t *key) {
    return charge(dev, size, (unsigned long long *)key, g_ipc);
}
CUresult fake_ipc_release(uint64_t key) { return release(g_ipc, key); }

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    NEED_INIT();
    (void)align; (void)addr; (void)flags;
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    *ptr = (0x7ULL << 52) | ((++g_counter) << 20);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    return (ptr && size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static alloc_rec *find(alloc_rec **table, uint64_t key) {
    alloc_rec *r = table[bucket(key)];
    while (r && r->key != key) r = r->next;
    return r;
}

/* Drops one reference of a VMM allocation (caller holds g_mu); frees it at zero. */
static void handle_unref(uint64_t handle) {
    alloc_rec *r = find(g_handles, handle);
    if (!r || --r->refs > 0) return;
    r = rec_take(g_handles, handle);
    if (r->target) handle_unref(r->target); /* an imported handle: its allocation loses a reference */
    else if (r->dev >= 0) used_add(r->dev, -(int64_t)(r->size));
    free(r);
}

/* A mapping holds a reference: memory stays allocated until its handle is released and every
 * mapping of it is unmapped. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    NEED_INIT();
    (void)offset; (void)flags;
    if (!ptr || !size || !h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    alloc_rec *hr = find(g_handles, h);
    if (hr && hr->urefs <= 0) hr = NULL; /* released: not the program's to map any more */
    if (hr) {
        hr->refs++;
        rec_put(g_maps, ptr, h, -1);
        alloc_rec *m = find(g_maps, ptr);
        if (m) m->len = size;
    }
    pthread_mutex_unlock(&g_mu);
    return hr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Unmaps the mappings that start in [ptr, ptr + size). */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    if (!ptr || !size || size > UINT64_MAX - ptr) return CUDA_ERROR_INVALID_VALUE; /* as the driver: no wrap */
    pthread_mutex_lock(&g_mu);
    /* A mapping exactly at ptr covering the range (the usual unmap): found by its bucket. */
    alloc_rec *exact = find(g_maps, ptr);
    if (exact && exact->len >= size) { /* no other mapping can start inside it */
        rec_take(g_maps, ptr);
        handle_unref(exact->size);
        free(exact);
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    for (unsigned b = 0; b < NBUCKETS; b++) {
        for (alloc_rec **p = &g_maps[b]; *p;) {
            if ((*p)->key >= ptr && (*p)->key < ptr + size) {
                alloc_rec *r = *p;
                *p = r->next;
                handle_unref(r->size);
                free(r);
            } else {
                p = &(*p)->next;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    NEED_INIT();
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    alloc_rec *found = NULL;
    for (alloc_rec *r = g_maps[bucket((uint64_t)(uintptr_t)addr)]; r; r = r->next)
        if (r->key == (uint64_t)(uintptr_t)addr) found = r;
    if (found) {
        *h = found->size;
        alloc_rec *hr = find(g_handles, found->size);
        if (hr) {
            hr->refs++;
            hr->urefs++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- arrays: charged their raw size (the isolation library charges an estimate above it) ---- */

struct CUarray_st {
    unsigned magic;
    int dev;
    uint64_t size;
};
#define ARRAY_MAGIC 0xA11A7u

static uint64_t fake_elem(int format, unsigned ch) {
    uint64_t b = (format == 0x01 || format == 0x08) ? 1 : (format == 0x02 || format == 0x09 || format == 0x10) ? 2 : 4;
    return b * (ch ? ch : 1);
}

static CUresult array_make(struct CUarray_st **out, size_t w, size_t h, size_t d, int format, unsigned ch,
                           unsigned levels, int charged) {
    NEED_CTX(c);
    if (!out || w == 0 || ch == 0 || ch == 3 || ch > 4) return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        total += lw * lh * ld * fake_elem(format, ch);
    }
    pthread_mutex_lock(&g_mu);
    fake_state_lock();
    if (charged && total > device_free(c->dev)) {
        fake_state_unlock();
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (charged) used_add(c->dev, (int64_t)(total));
    fake_state_unlock();
    pthread_mutex_unlock(&g_mu);
    struct CUarray_st *a = calloc(1, sizeof *a);
    a->magic = ARRAY_MAGIC;
    a->dev = c->dev;
    a->size = charged ? total : 0;
    pthread_mutex_lock(&g_mu);
    rec_put(g_arrays, (uint64_t)(uintptr_t)a, 0, -1);
    pthread_mutex_unlock(&g_mu);
    *out = a;
    return CUDA_SUCCESS;
}

static CUresult array_free(struct CUarray_st *a) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    alloc_rec *r = rec_take(g_arrays, (uint64_t)(uintptr_t)a);
    if (!r) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    free(r);
    used_add(a->dev, -(int64_t)(a->size));
    pthread_mutex_unlock(&g_mu);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make((struct CUarray_st **)h, d->Width, d->Height, 1, d->Format, d->NumChannels, 1, 1);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    int sparse = (d->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
    return array_make((struct CUarray_st **)h, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1, !sparse);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    if (!d || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    int sparse = (d->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
    return array_make((struct CUarray_st **)h, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, levels,
                      !sparse);
}

EXPORT CUresult cuArrayCreate(CUarray *h, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make((struct CUarray_st **)h, d->Width, d->Height, 1, d->Format, d->NumChannels, 1, 1);
}

EXPORT CUresult cuArray3DCreate(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    int sparse = (d->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
    return array_make((struct CUarray_st **)h, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1, !sparse);
}

EXPORT CUresult cuArrayDestroy(CUarray h) { return array_free((struct CUarray_st *)h); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return array_free((struct CUarray_st *)h); }

EXPORT CUresult cuGetErrorName(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *str = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

/* Internal entry points with addresses distinct from the exports (FAKE_CUDA_PROC_INTERNAL=1). */
static CUresult internal_cuMemAlloc_v2(CUdeviceptr *d, size_t s) { return cuMemAlloc_v2(d, s); }
static CUresult internal_cuMemFree_v2(CUdeviceptr p) { return cuMemFree_v2(p); }
static CUresult internal_cuMemAlloc_v3(CUdeviceptr *d, size_t s) { return cuMemAlloc_v3(d, s); }
static CUresult internal_cuMemGetInfo_v2(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }
static CUresult internal_cuDeviceTotalMem_v2(size_t *b, CUdevice d) { return cuDeviceTotalMem_v2(b, d); }
static CUresult internal_cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t s, CUstream st) {
    return cuMemAllocAsync_ptsz(d, s, st);
}
static CUresult internal_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream st) { return cuMemFreeAsync_ptsz(p, st); }
static CUresult internal_cuMemCreate(CUmemGenericAllocationHandle *h, size_t s, const CUmemAllocationProp *p,
                                     unsigned long long f) {
    return cuMemCreate(h, s, p, f);
}
static CUresult internal_cuMemRelease(CUmemGenericAllocationHandle h) { return cuMemRelease(h); }
static CUresult internal_cuGetProcAddress_v2(const char *s, void **p, int v, cuuint64_t f,
                                             CUdriverProcAddressQueryResult *st) {
    return cuGetProcAddress_v2(s, p, v, f, st);
}

typedef struct {
    const char *base;
    int since;  /* CUDA version that introduced this ABI */
    int ptsz;   /* per-thread default stream variant */
    void *fn;
    void *internal;
} proc_entry;

#define P(base, since, ptsz, fn, internal) {base, since, ptsz, (void *)(fn), (void *)(internal)}
static const proc_entry g_procs[] = {
    P("cuInit", 2000, 0, cuInit, NULL),
    P("cuDriverGetVersion", 2020, 0, cuDriverGetVersion, NULL),
    P("cuDeviceGetCount", 2000, 0, cuDeviceGetCount, NULL),
    P("cuDeviceGet", 2000, 0, cuDeviceGet, NULL),
    P("cuDeviceGetName", 2000, 0, cuDeviceGetName, NULL),
    P("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid, NULL),
    P("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2, NULL),
    P("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2, internal_cuDeviceTotalMem_v2),
    P("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain, NULL),
    P("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease, NULL),
    P("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2, NULL),
    P("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset, NULL),
    P("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2, NULL),
    P("cuCtxCreate", 3020, 0, cuCtxCreate_v2, NULL),
    P("cuCtxCreate", 11040, 0, cuCtxCreate_v3, NULL),
    P("cuCtxCreate", 12050, 0, cuCtxCreate_v4, NULL),
    P("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2, NULL),
    P("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent, NULL),
    P("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent, NULL),
    P("cuCtxPushCurrent", 4000, 0, cuCtxPushCurrent_v2, NULL),
    P("cuCtxPopCurrent", 4000, 0, cuCtxPopCurrent_v2, NULL),
    P("cuCtxGetDevice", 2000, 0, cuCtxGetDevice, NULL),
    P("cuCtxSynchronize", 2000, 0, cuCtxSynchronize, NULL),
    P("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2, internal_cuMemGetInfo_v2),
    P("cuMemAlloc", 3020, 0, cuMemAlloc_v2, internal_cuMemAlloc_v2),
    P("cuMemAlloc", 14000, 0, cuMemAlloc_v3, internal_cuMemAlloc_v3),
    P("cuMemAlloc", 2000, 0, cuMemAlloc, NULL),
    P("cuMemFree", 2000, 0, cuMemFree, NULL),
    P("cuMemGetInfo", 2000, 0, cuMemGetInfo, NULL),
    P("cuDeviceTotalMem", 2000, 0, cuDeviceTotalMem, NULL),
    P("cuMemAllocPitch", 2000, 0, cuMemAllocPitch, NULL),
    P("cuCtxCreate", 2000, 0, cuCtxCreate, NULL),
    P("cuCtxDestroy", 2000, 0, cuCtxDestroy, NULL),
    P("cuDeviceGetMemPool", 11020, 0, cuDeviceGetMemPool, NULL),
    P("cuDeviceSetMemPool", 11020, 0, cuDeviceSetMemPool, NULL),
    P("cuMemPoolSetAttribute", 11020, 0, cuMemPoolSetAttribute, NULL),
    P("cuMemPoolGetAttribute", 11020, 0, cuMemPoolGetAttribute, NULL),
    P("cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo, NULL),
    P("cuGraphCreate", 10000, 0, cuGraphCreate, NULL),
    P("cuGraphAddMemAllocNode", 11040, 0, cuGraphAddMemAllocNode, NULL),
    P("cuGraphDestroy", 10000, 0, cuGraphDestroy, NULL),
    P("cuGraphInstantiateWithFlags", 11040, 0, cuGraphInstantiateWithFlags, NULL),
    P("cuGraphLaunch", 10000, 0, cuGraphLaunch, NULL),
    P("cuGraphExecDestroy", 10000, 0, cuGraphExecDestroy, NULL),
    P("cuDeviceGraphMemTrim", 11040, 0, cuDeviceGraphMemTrim, NULL),
    P("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2, NULL),
    P("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing, NULL),
    P("cuStreamEndCapture", 10000, 0, cuStreamEndCapture, NULL),
    P("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute, NULL),
    P("cuCtxSetLimit", 3010, 0, cuCtxSetLimit, NULL),
    P("cuCtxGetLimit", 3010, 0, cuCtxGetLimit, NULL),
    P("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2, NULL),
    P("cuMemAllocManaged", 6000, 0, cuMemAllocManaged, NULL),
    P("cuMemFree", 3020, 0, cuMemFree_v2, internal_cuMemFree_v2),
    P("cuMemAllocAsync", 11020, 0, cuMemAllocAsync, NULL),
    P("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz, internal_cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync, NULL),
    P("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz, NULL),
    P("cuMemFreeAsync", 11020, 0, cuMemFreeAsync, NULL),
    P("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz, internal_cuMemFreeAsync_ptsz),
    P("cuMemPoolCreate", 11020, 0, cuMemPoolCreate, NULL),
    P("cuMemPoolDestroy", 11020, 0, cuMemPoolDestroy, NULL),
    P("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool, NULL),
    P("cuStreamCreate", 2000, 0, cuStreamCreate, NULL),
    P("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2, NULL),
    P("cuStreamGetCtx", 9020, 0, cuStreamGetCtx, NULL),
    P("cuStreamSynchronize", 2000, 0, cuStreamSynchronize, NULL),
    P("cuMemGetAllocationGranularity", 10020, 0, cuMemGetAllocationGranularity, NULL),
    P("cuMemCreate", 10020, 0, cuMemCreate, internal_cuMemCreate),
    P("cuMemRelease", 10020, 0, cuMemRelease, internal_cuMemRelease),
    P("cuMemAddressReserve", 10020, 0, cuMemAddressReserve, NULL),
    P("cuMemAddressFree", 10020, 0, cuMemAddressFree, NULL),
    P("cuMemMap", 10020, 0, cuMemMap, NULL),
    P("cuMemUnmap", 10020, 0, cuMemUnmap, NULL),
    P("cuMemRetainAllocationHandle", 11000, 0, cuMemRetainAllocationHandle, NULL),
    P("cuMemExportToShareableHandle", 10020, 0, cuMemExportToShareableHandle, NULL),
    P("cuMemImportFromShareableHandle", 10020, 0, cuMemImportFromShareableHandle, NULL),
    P("cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle, NULL),
    P("cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle, NULL),
    P("cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2, NULL),
    P("cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle, NULL),
    P("cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2, NULL),
    P("cuGetErrorName", 6000, 0, cuGetErrorName, NULL),
    P("cuArrayCreate", 3020, 0, cuArrayCreate_v2, NULL),
    P("cuArrayCreate", 2000, 0, cuArrayCreate, NULL),
    P("cuArray3DCreate", 2000, 0, cuArray3DCreate, NULL),
    P("cuArray3DCreate", 3020, 0, cuArray3DCreate_v2, NULL),
    P("cuArrayDestroy", 2000, 0, cuArrayDestroy, NULL),
    P("cuMipmappedArrayCreate", 5000, 0, cuMipmappedArrayCreate, NULL),
    P("cuMipmappedArrayDestroy", 5000, 0, cuMipmappedArrayDestroy, NULL),
    P("cuGetProcAddress", 11030, 0, cuGetProcAddress, NULL),
    P("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2, internal_cuGetProcAddress_v2),
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (cudaVersion > driver_version()) return CUDA_ERROR_INVALID_VALUE;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int internal = getenv("FAKE_CUDA_PROC_INTERNAL") && atoi(getenv("FAKE_CUDA_PROC_INTERNAL"));
    const proc_entry *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_entry *e = &g_procs[i];
        if (strcmp(e->base, symbol) != 0) continue;
        known = 1;
        if (e->since > cudaVersion) continue;
        if (e->ptsz && !want_ptsz) continue;
        if (best == NULL || e->since > best->since || (e->ptsz && !best->ptsz)) best = e;
    }
    *pfn = NULL;
    if (!best && cudaVersion >= 2000) { /* the timing model's entry points (fake_timing.c) */
        void *t = fake_timing_proc(symbol, cudaVersion, want_ptsz, &known);
        if (t) {
            *pfn = t;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    if (best) {
        *pfn = (internal && best->internal) ? best->internal : best->fn;
        if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    } else if (status) {
        *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
