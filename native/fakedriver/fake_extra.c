/*
 * Device memory the real driver holds beyond the allocation calls, modelled as strictly as the
 * driver behaves (fake_extra.h):
 *  - module globals: loading an image allocates its __device__ variables on the context's device
 *    until the module is unloaded. A fake image is text, "FAKECUBIN globals=BYTES" (anything else
 *    has none); cuLibraryLoad* loads into the current context at once, or, with none current,
 *    into the context current at the first cuLibraryGetModule (context-independent loading);
 *  - managed memory: cuMemPrefetchAsync to another device moves its pages, and what each device
 *    holds, there (cuMemAdvise changes no placement by itself);
 *  - graphics interop: fakeGlBufferCreate is a GL driver's buffer (device memory the process
 *    holds, allocated outside CUDA); cuGraphicsGLRegisterBuffer + map hand it to CUDA;
 *  - green contexts (cuGreenCtxCreate) hold what a context holds, until cuGreenCtxDestroy;
 *  - stream-ordered pools shared between processes: a pool created with a handle type exports as
 *    a descriptor, an importer gets a pool it cannot allocate from and maps the exporter's
 *    allocations with cuMemPoolImportPointer (the memory stays the exporter's).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_extra.h"
#include "fake_timing.h"

#define EXPORT __attribute__((visibility("default")))
#define LIB_MAGIC 0x11B11B11u
#define RES_MAGIC 0x6E56E5u

/* ---- modules and libraries ---- */

CUresult fake_module_globals_take(const void *image, int dev, uint64_t *key, uint64_t *size) {
    *key = *size = 0;
    const char *s = image;
    if (strncmp(s, "FAKECUBIN", 9) != 0) return CUDA_SUCCESS;
    const char *g = strstr(s, "globals=");
    if (!g) return CUDA_SUCCESS;
    char *end;
    unsigned long long n = strtoull(g + 8, &end, 10);
    if (end == g + 8) return CUDA_ERROR_INVALID_IMAGE_;
    if (n == 0) return CUDA_SUCCESS;
    CUresult rc = fake_ipc_charge(dev, n, key);
    if (rc == CUDA_SUCCESS) *size = n;
    return rc;
}

int fake_read_image(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 1;
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *opts, void **vals) {
    (void)n; (void)opts; (void)vals;
    return cuModuleLoadData(m, image);
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin) { return cuModuleLoadData(m, fatbin); }

struct CUlib_st {
    unsigned magic;
    CUmodule mod; /* NULL until loaded into a context */
    char image[4096];
};

static CUresult lib_load(CUlibrary *lib, const char *image) {
    if (!lib || !image) return CUDA_ERROR_INVALID_VALUE;
    CUlibrary l = calloc(1, sizeof *l);
    l->magic = LIB_MAGIC;
    snprintf(l->image, sizeof l->image, "%s", image);
    int dev;
    if (fake_cuda_stream_dev(NULL, &dev)) { /* a current context: loaded into it now */
        CUresult rc = cuModuleLoadData(&l->mod, l->image);
        if (rc != CUDA_SUCCESS) {
            free(l);
            return rc;
        }
    }
    *lib = l;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv, unsigned nj, void *lo,
                                  void **lv, unsigned nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return lib_load(lib, code);
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jo, void **jv, unsigned nj, void *lo,
                                      void **lv, unsigned nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    char image[4096];
    if (!fake_read_image(path, image, sizeof image)) return CUDA_ERROR_FILE_NOT_FOUND_;
    return lib_load(lib, image);
}

EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib) {
    if (!m || !lib || lib->magic != LIB_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (!lib->mod) {
        CUresult rc = cuModuleLoadData(&lib->mod, lib->image);
        if (rc != CUDA_SUCCESS) return rc;
    }
    *m = lib->mod;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    if (!lib || lib->magic != LIB_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    lib->magic = 0;
    if (lib->mod) cuModuleUnload(lib->mod);
    free(lib);
    return CUDA_SUCCESS;
}

/* ---- managed memory ---- */

static CUresult prefetch(CUdeviceptr p, size_t count, int dst, CUstream s) {
    int dev;
    if (!fake_cuda_stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if (count == 0) return CUDA_ERROR_INVALID_VALUE;
    if (dst < -1 || (dst >= 0 && !fake_cuda_device(dst))) return CUDA_ERROR_INVALID_DEVICE;
    return fake_managed_migrate(p, dst); /* the host (-1): the device keeps its copy in the fake */
}
static int loc_dev(CUmemLocation loc) { return loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1; }

EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t count, CUdevice dst, CUstream s) {
    return prefetch(p, count, dst, s);
}
EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t count, CUdevice dst, CUstream s) {
    return prefetch(p, count, dst, s);
}
EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t count, CUmemLocation loc, unsigned flags, CUstream s) {
    return flags ? CUDA_ERROR_INVALID_VALUE : prefetch(p, count, loc_dev(loc), s);
}
EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t count, CUmemLocation loc, unsigned flags,
                                           CUstream s) {
    return cuMemPrefetchAsync_v2(p, count, loc, flags, s);
}
EXPORT CUresult cuMemAdvise(CUdeviceptr p, size_t count, int advice, CUdevice dev) {
    if (count == 0 || advice < 1 || advice > 6) return CUDA_ERROR_INVALID_VALUE;
    return fake_managed_migrate(p, -1); /* validates only: placement changes on access */
}
EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t count, int advice, CUmemLocation loc) {
    return cuMemAdvise(p, count, advice, loc_dev(loc));
}

/* ---- graphics interop: a fake GL driver's buffers ---- */

#define MAX_GL 64
static struct {
    uint64_t key, size;
} g_gl[MAX_GL + 1]; /* buffer names 1..MAX_GL, as glGenBuffers gives */
static pthread_mutex_t g_gl_mu = PTHREAD_MUTEX_INITIALIZER;

struct CUgraphicsResource_st {
    unsigned magic;
    unsigned buffer;
    int mapped;
};

/* Not a CUDA call: the GL driver allocating a buffer of size bytes on the current context's
 * device (glBufferData), held by this process outside any CUDA allocation call. */
EXPORT CUresult fakeGlBufferCreate(size_t size, unsigned *buffer) {
    int dev;
    if (!buffer || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!fake_cuda_stream_dev(NULL, &dev)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_gl_mu);
    unsigned b = 1;
    while (b <= MAX_GL && g_gl[b].key) b++;
    CUresult rc = b > MAX_GL ? CUDA_ERROR_OUT_OF_MEMORY : fake_ipc_charge(dev, size, &g_gl[b].key);
    if (rc == CUDA_SUCCESS) {
        g_gl[b].size = size;
        *buffer = b;
    }
    pthread_mutex_unlock(&g_gl_mu);
    return rc;
}

EXPORT CUresult cuGraphicsGLRegisterBuffer(CUgraphicsResource *res, unsigned buffer, unsigned flags) {
    (void)flags;
    if (!res || buffer == 0 || buffer > MAX_GL || !g_gl[buffer].key) return CUDA_ERROR_INVALID_VALUE;
    CUgraphicsResource r = calloc(1, sizeof *r);
    r->magic = RES_MAGIC;
    r->buffer = buffer;
    *res = r;
    return CUDA_SUCCESS;
}
static CUresult set_mapped(unsigned n, CUgraphicsResource *res, int mapped) {
    if (!res || n == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!res[i] || res[i]->magic != RES_MAGIC || res[i]->mapped == mapped) return CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; i < n; i++) res[i]->mapped = mapped;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphicsMapResources(unsigned n, CUgraphicsResource *res, CUstream s) {
    (void)s;
    return set_mapped(n, res, 1);
}
EXPORT CUresult cuGraphicsUnmapResources(unsigned n, CUgraphicsResource *res, CUstream s) {
    (void)s;
    return set_mapped(n, res, 0);
}
EXPORT CUresult cuGraphicsResourceGetMappedPointer_v2(CUdeviceptr *p, size_t *size, CUgraphicsResource res) {
    if (!res || res->magic != RES_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!res->mapped) return CUDA_ERROR_NOT_MAPPED_;
    if (p) *p = g_gl[res->buffer].key;
    if (size) *size = g_gl[res->buffer].size;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphicsUnregisterResource(CUgraphicsResource res) {
    if (!res || res->magic != RES_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    res->magic = 0;
    free(res);
    return CUDA_SUCCESS;
}

/* ---- stream-ordered pools shared between processes ---- */

EXPORT CUresult cuMemPoolExportToShareableHandle(void *out, CUmemoryPool pool, int type, unsigned long long flags) {
    int dev, htypes;
    if (!out || flags || !fake_pool_info(pool, &dev, &htypes) || dev < 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(htypes & type)) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fake-cuda-pool", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (dprintf(fd, "pool dev=%d pid=%d\n", dev, (int)getpid()) <= 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, int type,
                                                   unsigned long long flags) {
    if (!pool || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    char buf[64] = {0};
    int dev, pid;
    if (pread((int)(intptr_t)handle, buf, sizeof buf - 1, 0) <= 0 || sscanf(buf, "pool dev=%d pid=%d", &dev, &pid) != 2)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = fake_pool_imported(dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr p) {
    uint64_t base, size;
    int dev;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    int ok = fake_ptr_range(p, &base, &size, &dev);
    fake_unlock();
    if (!ok || base != p) return CUDA_ERROR_INVALID_VALUE;
    memset(data, 0, sizeof *data);
    memcpy(data->reserved, &base, 8);
    memcpy(data->reserved + 8, &size, 8);
    return CUDA_SUCCESS;
}

/* The importer maps the exporter's allocation: the exporter's pool holds it, not the importer. */
EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *data) {
    if (!p || !data || !fake_pool_is_imported(pool)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t base;
    memcpy(&base, data->reserved, 8);
    if (!base) return CUDA_ERROR_INVALID_VALUE;
    *p = base;
    return CUDA_SUCCESS;
}

/* ---- green contexts ---- */

#define GREEN_MAGIC 0x62EE4C7Cu
struct CUgreenCtx_st {
    unsigned magic;
    int dev;
};

/* desc: the SM partition (not modelled); the context's memory is taken as for any context. */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned flags) {
    if (!g || !desc || flags != 1 /* CU_GREEN_CTX_DEFAULT_STREAM, required */) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || !fake_cuda_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = fake_ctx_charge(dev, 1);
    if (rc != CUDA_SUCCESS) return rc;
    CUgreenCtx n = calloc(1, sizeof *n);
    n->magic = GREEN_MAGIC;
    n->dev = dev;
    *g = n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g) {
    if (!g || g->magic != GREEN_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    g->magic = 0;
    fake_ctx_charge(g->dev, -1);
    free(g);
    return CUDA_SUCCESS;
}
