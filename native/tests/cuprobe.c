/*
 * A scriptable CUDA driver client for the isolation tests. It reads one command per line on
 * stdin and answers one line on stdout, so a test can drive several processes step by step.
 *
 *   cuprobe dlsym          dlopen("libcuda.so.1") + dlsym of the exported (versioned) names
 *   cuprobe gpa [VERSION]  dlsym only cuGetProcAddress_v2, fetch "cuGetProcAddress" through it,
 *                          then every entry point by base name and VERSION (default 12080)
 *   cuprobe gpa1 [VERSION] the same starting from the CUDA 11 cuGetProcAddress (4 arguments)
 *   cuprobe_linked         linked with -lcuda: calls bind to the exported names at load time
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tessera_cuda_types.h"

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGetCount)(int *);
static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_release)(CUdevice);
static CUresult (*p_reset)(CUdevice);
static CUresult (*p_release1)(CUdevice);
static CUresult (*p_reset1)(CUdevice);
static CUresult (*p_setcur)(CUcontext);
static CUresult (*p_ctx_v2)(CUcontext *, unsigned, CUdevice);
static CUresult (*p_ctx_v3)(CUcontext *, void *, int, unsigned, CUdevice);
static CUresult (*p_ctx_v4)(CUcontext *, void *, unsigned, CUdevice);
static CUresult (*p_ctxdestroy)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult (*p_managed)(CUdeviceptr *, size_t, unsigned);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_unhooked)(CUdeviceptr *, size_t);
static CUresult (*p_stream)(CUstream *, unsigned);
static CUresult (*p_aalloc)(CUdeviceptr *, size_t, CUstream);
static CUresult (*p_aalloc_ptsz)(CUdeviceptr *, size_t, CUstream);
static CUresult (*p_afree)(CUdeviceptr, CUstream);
static CUresult (*p_afree_ptsz)(CUdeviceptr, CUstream);
static CUresult (*p_palloc)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*p_palloc_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*p_poolcreate)(CUmemoryPool *, const CUmemPoolProps *);
static CUresult (*p_pooldestroy)(CUmemoryPool);
static CUresult (*p_defpool)(CUmemoryPool *, CUdevice);
static CUresult (*p_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*p_releaseh)(CUmemGenericAllocationHandle);
static CUresult (*p_info)(size_t *, size_t *);
static CUresult (*p_vreserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*p_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*p_unmap)(CUdeviceptr, size_t);
static CUresult (*p_retainh)(CUmemGenericAllocationHandle *, void *);
static CUresult (*p_total)(size_t *, CUdevice);
static CUresult (*p_array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
static CUresult (*p_array3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
static CUresult (*p_mipmap)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
static CUresult (*p_arraydestroy)(CUarray);
static CUresult (*p_mipdestroy)(CUmipmappedArray);

typedef struct {
    void **slot;
    const char *base;
    const char *exported;
    int ptsz;
} entry;

static entry g_entries[] = {
    {(void **)&p_cuInit, "cuInit", "cuInit", 0},
    {(void **)&p_cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", 0},
    {(void **)&p_retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 0},
    {(void **)&p_release, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 0},
    {(void **)&p_reset, "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 0},
    {(void **)&p_release1, NULL, "cuDevicePrimaryCtxRelease", 0},
    {(void **)&p_reset1, NULL, "cuDevicePrimaryCtxReset", 0},
    {(void **)&p_setcur, "cuCtxSetCurrent", "cuCtxSetCurrent", 0},
    {(void **)&p_ctx_v2, NULL, "cuCtxCreate_v2", 0},
    {(void **)&p_ctx_v3, NULL, "cuCtxCreate_v3", 0},
    {(void **)&p_ctx_v4, "cuCtxCreate", "cuCtxCreate_v4", 0},
    {(void **)&p_ctxdestroy, "cuCtxDestroy", "cuCtxDestroy_v2", 0},
    {(void **)&p_alloc, "cuMemAlloc", "cuMemAlloc_v2", 0},
    {(void **)&p_pitch, "cuMemAllocPitch", "cuMemAllocPitch_v2", 0},
    {(void **)&p_managed, "cuMemAllocManaged", "cuMemAllocManaged", 0},
    {(void **)&p_free, "cuMemFree", "cuMemFree_v2", 0},
    {(void **)&p_stream, "cuStreamCreate", "cuStreamCreate", 0},
    {(void **)&p_aalloc, "cuMemAllocAsync", "cuMemAllocAsync", 0},
    {(void **)&p_aalloc_ptsz, "cuMemAllocAsync", "cuMemAllocAsync_ptsz", 1},
    {(void **)&p_afree, "cuMemFreeAsync", "cuMemFreeAsync", 0},
    {(void **)&p_afree_ptsz, "cuMemFreeAsync", "cuMemFreeAsync_ptsz", 1},
    {(void **)&p_palloc, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 0},
    {(void **)&p_palloc_ptsz, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 1},
    {(void **)&p_poolcreate, "cuMemPoolCreate", "cuMemPoolCreate", 0},
    {(void **)&p_pooldestroy, "cuMemPoolDestroy", "cuMemPoolDestroy", 0},
    {(void **)&p_defpool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", 0},
    {(void **)&p_create, "cuMemCreate", "cuMemCreate", 0},
    {(void **)&p_releaseh, "cuMemRelease", "cuMemRelease", 0},
    {(void **)&p_info, "cuMemGetInfo", "cuMemGetInfo_v2", 0},
    {(void **)&p_vreserve, "cuMemAddressReserve", "cuMemAddressReserve", 0},
    {(void **)&p_map, "cuMemMap", "cuMemMap", 0},
    {(void **)&p_unmap, "cuMemUnmap", "cuMemUnmap", 0},
    {(void **)&p_retainh, "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 0},
    {(void **)&p_total, "cuDeviceTotalMem", "cuDeviceTotalMem_v2", 0},
    {(void **)&p_array, "cuArrayCreate", "cuArrayCreate_v2", 0},
    {(void **)&p_array3d, "cuArray3DCreate", "cuArray3DCreate_v2", 0},
    {(void **)&p_mipmap, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 0},
    {(void **)&p_arraydestroy, "cuArrayDestroy", "cuArrayDestroy", 0},
    {(void **)&p_mipdestroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 0},
};

#ifdef LINKED
#define DECL(ret, name, args) extern ret name args;
DECL(CUresult, cuInit, (unsigned))
DECL(CUresult, cuDeviceGetCount, (int *))
DECL(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))
DECL(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice))
DECL(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice))
DECL(CUresult, cuDevicePrimaryCtxRelease, (CUdevice))
DECL(CUresult, cuDevicePrimaryCtxReset, (CUdevice))
DECL(CUresult, cuCtxSetCurrent, (CUcontext))
DECL(CUresult, cuCtxCreate_v2, (CUcontext *, unsigned, CUdevice))
DECL(CUresult, cuCtxCreate_v3, (CUcontext *, void *, int, unsigned, CUdevice))
DECL(CUresult, cuCtxCreate_v4, (CUcontext *, void *, unsigned, CUdevice))
DECL(CUresult, cuCtxDestroy_v2, (CUcontext))
DECL(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))
DECL(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned))
DECL(CUresult, cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned))
DECL(CUresult, cuMemFree_v2, (CUdeviceptr))
DECL(CUresult, fakeCudaAllocUnhooked, (CUdeviceptr *, size_t))
DECL(CUresult, cuStreamCreate, (CUstream *, unsigned))
DECL(CUresult, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))
DECL(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))
DECL(CUresult, cuMemFreeAsync, (CUdeviceptr, CUstream))
DECL(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))
DECL(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
DECL(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
DECL(CUresult, cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *))
DECL(CUresult, cuMemPoolDestroy, (CUmemoryPool))
DECL(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))
DECL(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))
DECL(CUresult, cuMemRelease, (CUmemGenericAllocationHandle))
DECL(CUresult, cuMemGetInfo_v2, (size_t *, size_t *))
DECL(CUresult, cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
DECL(CUresult, cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))
DECL(CUresult, cuMemUnmap, (CUdeviceptr, size_t))
DECL(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *))
DECL(CUresult, cuDeviceTotalMem_v2, (size_t *, CUdevice))
DECL(CUresult, cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))
DECL(CUresult, cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))
DECL(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned))
DECL(CUresult, cuArrayDestroy, (CUarray))
DECL(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray))

static void resolve_all(void) {
    p_cuInit = cuInit; p_cuDeviceGetCount = cuDeviceGetCount; p_retain = cuDevicePrimaryCtxRetain;
    p_release = cuDevicePrimaryCtxRelease_v2; p_reset = cuDevicePrimaryCtxReset_v2;
    p_release1 = cuDevicePrimaryCtxRelease; p_reset1 = cuDevicePrimaryCtxReset; p_setcur = cuCtxSetCurrent;
    p_ctx_v2 = cuCtxCreate_v2; p_ctx_v3 = cuCtxCreate_v3; p_ctx_v4 = cuCtxCreate_v4; p_ctxdestroy = cuCtxDestroy_v2;
    p_alloc = cuMemAlloc_v2; p_pitch = cuMemAllocPitch_v2; p_managed = cuMemAllocManaged; p_free = cuMemFree_v2;
    p_unhooked = fakeCudaAllocUnhooked; p_stream = cuStreamCreate; p_aalloc = cuMemAllocAsync;
    p_aalloc_ptsz = cuMemAllocAsync_ptsz; p_afree = cuMemFreeAsync; p_afree_ptsz = cuMemFreeAsync_ptsz;
    p_palloc = cuMemAllocFromPoolAsync; p_palloc_ptsz = cuMemAllocFromPoolAsync_ptsz; p_poolcreate = cuMemPoolCreate;
    p_pooldestroy = cuMemPoolDestroy; p_defpool = cuDeviceGetDefaultMemPool; p_create = cuMemCreate;
    p_releaseh = cuMemRelease; p_info = cuMemGetInfo_v2; p_total = cuDeviceTotalMem_v2;
    p_array = cuArrayCreate_v2; p_array3d = cuArray3DCreate_v2; p_mipmap = cuMipmappedArrayCreate;
    p_arraydestroy = cuArrayDestroy; p_mipdestroy = cuMipmappedArrayDestroy;
    p_vreserve = cuMemAddressReserve; p_map = cuMemMap; p_unmap = cuMemUnmap; p_retainh = cuMemRetainAllocationHandle;
}
#else
static void resolve_all(const char *mode, int version) {
    const char *path = getenv("CUPROBE_LIBCUDA"); /* a driver loaded by path, e.g. CUDA compat */
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("fatal dlopen %s\n", dlerror());
        exit(2);
    }
    p_unhooked = dlsym(h, "fakeCudaAllocUnhooked");
    gpa_v2_fn gpa2 = NULL;
    gpa_v1_fn gpa1 = NULL;
    if (strcmp(mode, "gpa") == 0) {
        gpa_v2_fn first = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
        if (!first || first("cuGetProcAddress", (void **)&gpa2, version, 0, NULL) != CUDA_SUCCESS || !gpa2) {
            printf("fatal cuGetProcAddress_v2\n");
            exit(2);
        }
    } else if (strcmp(mode, "gpa1") == 0) {
        gpa1 = (gpa_v1_fn)dlsym(h, "cuGetProcAddress");
        if (!gpa1) {
            printf("fatal cuGetProcAddress\n");
            exit(2);
        }
    }
    for (size_t i = 0; i < sizeof g_entries / sizeof g_entries[0]; i++) {
        entry *e = &g_entries[i];
        cuuint64_t flags = e->ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        if (gpa2 && e->base) gpa2(e->base, e->slot, version, flags, NULL);
        else if (gpa1 && e->base) gpa1(e->base, e->slot, version, flags);
        else *e->slot = dlsym(h, e->exported);
    }
}
#endif

typedef struct {
    int dev;
    long iters;
    size_t size;
    long ok, refused, errors;
} stress_arg;

/* One thread: allocate and free in a loop, holding up to 4 blocks at a time. */
static void *stress_thread(void *p) {
    stress_arg *a = p;
    CUcontext ctx;
    if (p_retain(&ctx, a->dev) || p_setcur(ctx)) {
        a->errors++;
        return NULL;
    }
    CUdeviceptr held[4] = {0};
    for (long i = 0; i < a->iters; i++) {
        int k = (int)(i % 4);
        if (held[k]) {
            if (p_free(held[k])) a->errors++;
            held[k] = 0;
        }
        CUresult rc = p_alloc(&held[k], a->size + (size_t)(i % 7));
        if (rc == CUDA_SUCCESS) a->ok++;
        else if (rc == CUDA_ERROR_OUT_OF_MEMORY) { a->refused++; held[k] = 0; }
        else { a->errors++; held[k] = 0; }
    }
    for (int k = 0; k < 4; k++)
        if (held[k] && p_free(held[k])) a->errors++;
    return NULL;
}

#define MAXOBJ 256
static void *g_objs[MAXOBJ];
static int g_nobj;

static int keep(void *p) {
    if (g_nobj >= MAXOBJ) return -1;
    g_objs[g_nobj] = p;
    return g_nobj++;
}

static void *obj(const char *text) {
    long i = strtol(text, NULL, 10);
    if (i < 0) return (void *)(uintptr_t)(-i); /* -1, -2: the special streams 1 and 2 */
    return i < g_nobj ? g_objs[i] : NULL;
}

static CUstream stream_arg(const char *text) {
    if (!text || strcmp(text, "null") == 0) return NULL;
    if (strcmp(text, "legacy") == 0) return (CUstream)(uintptr_t)1;
    if (strcmp(text, "ptds") == 0) return (CUstream)(uintptr_t)2;
    return (CUstream)obj(text);
}

#define NEED(fn) if (!(fn)) { printf("missing\n"); continue; }

int main(int argc, char **argv) {
#ifdef LINKED
    (void)argc; (void)argv;
    resolve_all();
#else
    const char *mode = argc > 1 ? argv[1] : "dlsym";
    int version = argc > 2 ? atoi(argv[2]) : 12080;
    resolve_all(mode, version);
#endif
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char *argv2[8] = {0};
        int n = 0;
        char *save = NULL;
        for (char *t = strtok_r(line, " \t\r\n", &save); t && n < 8; t = strtok_r(NULL, " \t\r\n", &save)) argv2[n++] = t;
        if (n == 0) continue;
        const char *c = argv2[0];
        unsigned long long a1 = n > 1 ? strtoull(argv2[1], NULL, 0) : 0;
        CUresult rc;
        if (strcmp(c, "exit") == 0) {
            printf("bye\n");
            return 0;
        } else if (strcmp(c, "owner_alloc") == 0) {
            Dl_info info;
            const char *name = dladdr((void *)p_alloc, &info) && info.dli_fname ? info.dli_fname : "?";
            const char *slash = strrchr(name, '/');
            printf("owner=%s\n", slash ? slash + 1 : name);
            continue;
        } else if (strcmp(c, "resolved") == 0) {
            int missing = 0;
            for (size_t i = 0; i < sizeof g_entries / sizeof g_entries[0]; i++) missing += *g_entries[i].slot == NULL;
            printf("missing=%d\n", missing);
        } else if (strcmp(c, "sync") == 0) { /* cuCtxSynchronize: pools trim to their release threshold */
            void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
            CUresult (*sync)(void) = drv ? (CUresult(*)(void))dlsym(drv, "cuCtxSynchronize") : NULL;
            printf("rc=%d\n", sync ? sync() : -1);
        } else if (strcmp(c, "init") == 0) {
            NEED(p_cuInit);
            printf("rc=%d\n", p_cuInit(0));
        } else if (strcmp(c, "count") == 0) {
            int k = -1;
            rc = p_cuDeviceGetCount(&k);
            printf("rc=%d count=%d\n", rc, k);
        } else if (strcmp(c, "ctx") == 0) {
            CUcontext ctx = NULL;
            rc = p_retain(&ctx, (int)a1);
            if (rc == CUDA_SUCCESS) rc = p_setcur(ctx);
            printf("rc=%d\n", rc);
        } else if (strcmp(c, "release") == 0) {
            printf("rc=%d\n", p_release((int)a1));
        } else if (strcmp(c, "reset") == 0) {
            printf("rc=%d\n", p_reset((int)a1));
        } else if (strcmp(c, "release1") == 0) {
            printf("rc=%d\n", p_release1((int)a1));
        } else if (strcmp(c, "reset1") == 0) {
            printf("rc=%d\n", p_reset1((int)a1));
        } else if (strcmp(c, "ctxcreate") == 0) {
            CUcontext ctx = NULL;
            const char *v = n > 2 ? argv2[2] : "v2";
            if (strcmp(v, "v3") == 0) rc = p_ctx_v3(&ctx, NULL, 0, 0, (int)a1);
            else if (strcmp(v, "v4") == 0) rc = p_ctx_v4(&ctx, NULL, 0, (int)a1);
            else rc = p_ctx_v2(&ctx, 0, (int)a1);
            printf("rc=%d ctx=%d\n", rc, rc ? -1 : keep(ctx));
        } else if (strcmp(c, "ctxdestroy") == 0) {
            printf("rc=%d\n", p_ctxdestroy((CUcontext)obj(argv2[1])));
        } else if (strcmp(c, "setctx") == 0) {
            printf("rc=%d\n", p_setcur((CUcontext)obj(argv2[1])));
        } else if (strcmp(c, "alloc") == 0 || strcmp(c, "managed") == 0 || strcmp(c, "unhooked") == 0) {
            CUdeviceptr p = 0;
            if (c[0] == 'a') rc = p_alloc(&p, a1);
            else if (c[0] == 'm') rc = p_managed(&p, a1, 1);
            else { NEED(p_unhooked); rc = p_unhooked(&p, a1); }
            printf("rc=%d ptr=%#llx\n", rc, p);
        } else if (strcmp(c, "alloc_nullptr") == 0) {
            printf("rc=%d\n", p_alloc(NULL, a1));
        } else if (strcmp(c, "pitch") == 0) {
            CUdeviceptr p = 0;
            size_t pitch = 0;
            rc = p_pitch(&p, &pitch, a1, strtoull(argv2[2], NULL, 0), (unsigned)strtoul(argv2[3], NULL, 0));
            printf("rc=%d ptr=%#llx pitch=%zu\n", rc, p, pitch);
        } else if (strcmp(c, "free") == 0) {
            printf("rc=%d\n", p_free(a1));
        } else if (strcmp(c, "stream") == 0) {
            CUstream s = NULL;
            rc = p_stream(&s, 0);
            printf("rc=%d stream=%d\n", rc, rc ? -1 : keep(s));
        } else if (strcmp(c, "aalloc") == 0 || strcmp(c, "aalloc_ptsz") == 0) {
            CUdeviceptr p = 0;
            CUstream s = stream_arg(n > 2 ? argv2[2] : NULL);
            rc = (c[6] == '_' ? p_aalloc_ptsz : p_aalloc)(&p, a1, s);
            printf("rc=%d ptr=%#llx\n", rc, p);
        } else if (strcmp(c, "afree") == 0 || strcmp(c, "afree_ptsz") == 0) {
            CUstream s = stream_arg(n > 2 ? argv2[2] : NULL);
            printf("rc=%d\n", (c[5] == '_' ? p_afree_ptsz : p_afree)(a1, s));
        } else if (strcmp(c, "pool") == 0) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = 1;
            if (strcmp(argv2[1], "host") == 0) props.location.type = CU_MEM_LOCATION_TYPE_HOST;
            else { props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = (int)a1; }
            CUmemoryPool pool = NULL;
            rc = p_poolcreate(&pool, &props);
            printf("rc=%d pool=%d\n", rc, rc ? -1 : keep(pool));
        } else if (strcmp(c, "defpool") == 0) {
            CUmemoryPool pool = NULL;
            rc = p_defpool(&pool, (int)a1);
            printf("rc=%d pool=%d\n", rc, rc ? -1 : keep(pool));
        } else if (strcmp(c, "pooldestroy") == 0) {
            printf("rc=%d\n", p_pooldestroy((CUmemoryPool)obj(argv2[1])));
        } else if (strcmp(c, "palloc") == 0 || strcmp(c, "palloc_ptsz") == 0) {
            CUdeviceptr p = 0;
            CUstream s = stream_arg(n > 3 ? argv2[3] : NULL);
            rc = (c[6] == '_' ? p_palloc_ptsz : p_palloc)(&p, a1, (CUmemoryPool)obj(argv2[2]), s);
            printf("rc=%d ptr=%#llx\n", rc, p);
        } else if (strcmp(c, "create") == 0) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            if (strcmp(argv2[2], "host") == 0) prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
            else { prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = atoi(argv2[2]); }
            CUmemGenericAllocationHandle hnd = 0;
            rc = p_create(&hnd, a1, &prop, 0);
            printf("rc=%d handle=%#llx\n", rc, hnd);
        } else if (strcmp(c, "create_nullprop") == 0) {
            CUmemGenericAllocationHandle hnd = 0;
            printf("rc=%d\n", p_create(&hnd, a1, NULL, 0));
        } else if (strcmp(c, "array") == 0) {
            /* array W H FORMAT CHANNELS */
            CUDA_ARRAY_DESCRIPTOR d = {a1, strtoull(argv2[2], NULL, 0), (int)strtol(argv2[3], NULL, 0),
                                       (unsigned)strtoul(argv2[4], NULL, 0)};
            CUarray h = NULL;
            rc = p_array(&h, &d);
            printf("rc=%d handle=%#llx\n", rc, (unsigned long long)(uintptr_t)h);
        } else if (strcmp(c, "array3d") == 0 || strcmp(c, "mipmap") == 0) {
            /* array3d W H D FORMAT CHANNELS FLAGS | mipmap W H D FORMAT CHANNELS LEVELS */
            CUDA_ARRAY3D_DESCRIPTOR d = {a1, strtoull(argv2[2], NULL, 0), strtoull(argv2[3], NULL, 0),
                                         (int)strtol(argv2[4], NULL, 0), (unsigned)strtoul(argv2[5], NULL, 0), 0};
            unsigned last = (unsigned)strtoul(argv2[6], NULL, 0);
            void *h = NULL;
            if (c[0] == 'a') {
                d.Flags = last;
                rc = p_array3d((CUarray *)&h, &d);
            } else {
                rc = p_mipmap((CUmipmappedArray *)&h, &d, last);
            }
            printf("rc=%d handle=%#llx\n", rc, (unsigned long long)(uintptr_t)h);
        } else if (strcmp(c, "arraydestroy") == 0) {
            printf("rc=%d\n", p_arraydestroy((CUarray)(uintptr_t)a1));
        } else if (strcmp(c, "mipdestroy") == 0) {
            printf("rc=%d\n", p_mipdestroy((CUmipmappedArray)(uintptr_t)a1));
        } else if (strcmp(c, "vreserve") == 0) {
            CUdeviceptr p = 0;
            rc = p_vreserve(&p, a1, 0, 0, 0);
            printf("rc=%d ptr=%#llx\n", rc, p);
        } else if (strcmp(c, "map") == 0) {
            printf("rc=%d\n", p_map(a1, strtoull(argv2[2], NULL, 0), 0, strtoull(argv2[3], NULL, 0), 0));
        } else if (strcmp(c, "unmap") == 0) {
            printf("rc=%d\n", p_unmap(a1, strtoull(argv2[2], NULL, 0)));
        } else if (strcmp(c, "retainh") == 0) {
            CUmemGenericAllocationHandle hnd = 0;
            rc = p_retainh(&hnd, (void *)(uintptr_t)a1);
            printf("rc=%d handle=%#llx\n", rc, hnd);
        } else if (strcmp(c, "releaseh") == 0) {
            printf("rc=%d\n", p_releaseh(a1));
        } else if (strcmp(c, "info") == 0) {
            size_t f = 7, t = 7;
            const char *which = n > 1 ? argv2[1] : "both";
            size_t *fp = strcmp(which, "nullfree") == 0 || strcmp(which, "nullboth") == 0 ? NULL : &f;
            size_t *tp = strcmp(which, "nulltotal") == 0 || strcmp(which, "nullboth") == 0 ? NULL : &t;
            rc = p_info(fp, tp);
            printf("rc=%d free=%zu total=%zu\n", rc, f, t);
        } else if (strcmp(c, "total") == 0) {
            size_t t = 7;
            rc = p_total(n > 2 ? NULL : &t, (int)a1);
            printf("rc=%d total=%zu\n", rc, t);
        } else if (strcmp(c, "stress") == 0) {
            int nthreads = (int)a1;
            stress_arg args[16] = {0};
            pthread_t th[16];
            if (nthreads < 1 || nthreads > 16) { printf("bad\n"); continue; }
            for (int i = 0; i < nthreads; i++) {
                args[i].dev = 0;
                args[i].iters = strtol(argv2[2], NULL, 0);
                args[i].size = strtoull(argv2[3], NULL, 0);
                pthread_create(&th[i], NULL, stress_thread, &args[i]);
            }
            long ok = 0, refused = 0, errors = 0;
            for (int i = 0; i < nthreads; i++) {
                pthread_join(th[i], NULL);
                ok += args[i].ok; refused += args[i].refused; errors += args[i].errors;
            }
            printf("ok=%ld refused=%ld errors=%ld\n", ok, refused, errors);
        } else if (strcmp(c, "fork") == 0) {
            /* fork SIZE MS: the child allocates SIZE (if > 0) and sleeps MS before exiting */
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                CUdeviceptr p = 0;
                if (a1 > 0 && p_alloc(&p, a1) != CUDA_SUCCESS) _exit(3);
                usleep((useconds_t)strtoul(argv2[2], NULL, 0) * 1000);
                _exit(0);
            }
            printf("child=%d\n", (int)pid);
        } else if (strcmp(c, "sleep") == 0) {
            usleep((useconds_t)a1 * 1000);
            printf("ok\n");
        } else {
            printf("unknown %s\n", c);
        }
    }
    return 0;
}
