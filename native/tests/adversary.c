/*
 * Adversarial programs against the isolation library (issue #12): each subcommand tries one way
 * to make the driver hold more device memory than the workload's limit, then prints what the
 * (fake) driver holds for this process per device:
 *
 *   held0=BYTES held1=BYTES refused=N
 *
 * tests/isolation/test_adversary.py runs each under a limit and checks heldN <= limit. Filling
 * is done in 64 MiB steps until the library refuses, stopping at 4 GiB per device either way.
 *
 *   adversary CLASS [ARG]
 *   four-contexts prints "charged=BYTES" before that line: what the library charges for four
 *   contexts (the primary and three of cuCtxCreate), as the hooked cuMemGetInfo reports it.
 *
 *   classes: contexts, four-contexts, pool-reserve, set-pool, static-runtime, default-pool-reserve, foreign-pool, graph-node, capture,
 *            ctx-limit, legacy, deepbind LIB, dlvsym, libc-dlsym, dlmopen, driver-copy PATH,
 *            gpa-newer, alloc
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera_cuda_types.h"

#define MiB (1ULL << 20)
#define STEP (64 * MiB)
#define CAP (4096 * MiB)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static void *h;
static int refused;

static void *sym(const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "adversary: %s not found\n", name);
        exit(3);
    }
    return p;
}
#define CALL(type, name, ...) ((type)sym(name))(__VA_ARGS__)

static CUcontext start(int dev) {
    CUcontext ctx = NULL;
    if (CALL(CUresult (*)(unsigned), "cuInit", 0) != 0) exit(4);
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    if (!retain || retain(&ctx, dev) != 0) {
        refused++;
        return NULL;
    }
    CALL(CUresult (*)(CUcontext), "cuCtxSetCurrent", ctx);
    return ctx;
}

/* Allocates with f in STEP pieces until refused or CAP (a NULL f: the lookup was refused). */
static void fill(alloc_fn f) {
    CUdeviceptr p;
    if (!f) {
        refused++;
        return;
    }
    for (uint64_t total = 0; total < CAP; total += STEP)
        if (f(&p, STEP) != CUDA_SUCCESS) {
            refused++;
            return;
        }
}

static unsigned long long held_in(void *lib, int dev) {
    unsigned long long b = 0;
    CUresult (*held)(CUdevice, unsigned long long *) = (CUresult(*)(CUdevice, unsigned long long *))dlsym(lib, "fakeCudaHeldBytes");
    if (held) held(dev, &b);
    return b;
}

static void report(unsigned long long extra0) {
    printf("held0=%llu held1=%llu refused=%d\n", held_in(h, 0) + extra0, held_in(h, 1), refused);
}

static CUstream new_stream(void) {
    CUstream s;
    CALL(CUresult (*)(CUstream *, unsigned), "cuStreamCreate", &s, 0);
    return s;
}

/* Frees into a pool that keeps the memory reserved, then allocates again elsewhere. */
static void pool_then_fill(CUmemoryPool pool, int use_pool_api) {
    cuuint64_t keep = UINT64_MAX;
    CALL(CUresult (*)(CUmemoryPool, int, void *), "cuMemPoolSetAttribute", pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
         &keep);
    CUstream s = new_stream();
    CUdeviceptr ptrs[64];
    int n = 0;
    for (; n < 16; n++) {
        CUresult rc = use_pool_api
                          ? CALL(CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), "cuMemAllocFromPoolAsync",
                                 &ptrs[n], STEP, pool, s)
                          : CALL(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync", &ptrs[n], STEP, s);
        if (rc != CUDA_SUCCESS) {
            refused++;
            break;
        }
    }
    for (int i = 0; i < n; i++) CALL(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync", ptrs[i], s);
    fill((alloc_fn)sym("cuMemAlloc_v2"));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: adversary CLASS [ARG]\n");
        return 2;
    }
    const char *c = argv[1];
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "adversary: %s\n", dlerror());
        return 3;
    }
    unsigned long long extra0 = 0;
    if (strcmp(c, "alloc") == 0) {
        start(0);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
    } else if (strcmp(c, "contexts") == 0) {
        start(0);
        for (int i = 0; i < 4; i++) {
            CUcontext x;
            if (CALL(CUresult (*)(CUcontext *, unsigned, CUdevice), "cuCtxCreate_v2", &x, 0, 0) != 0) refused++;
        }
        fill((alloc_fn)sym("cuMemAlloc_v2"));
    } else if (strcmp(c, "four-contexts") == 0) {
        CUcontext primary = start(0);
        for (int i = 0; i < 3; i++) {
            CUcontext x;
            if (CALL(CUresult (*)(CUcontext *, unsigned, CUdevice), "cuCtxCreate_v2", &x, 0, 0) != 0) refused++;
        }
        if (primary) CALL(CUresult (*)(CUcontext), "cuCtxSetCurrent", primary);
        size_t free_b = 0, total_b = 0;
        if (CALL(CUresult (*)(size_t *, size_t *), "cuMemGetInfo_v2", &free_b, &total_b) == 0)
            printf("charged=%llu\n", (unsigned long long)(total_b - free_b));
    } else if (strcmp(c, "pool-reserve") == 0) {
        start(0);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = 1;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CUmemoryPool pool;
        if (CALL(CUresult (*)(CUmemoryPool *, const CUmemPoolProps *), "cuMemPoolCreate", &pool, &props) != 0) return 5;
        pool_then_fill(pool, 1);
    } else if (strcmp(c, "set-pool") == 0) {
        /* A pool of the program's made device 0's current pool: cuMemAllocAsync allocates from it. */
        start(0);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = 1;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CUmemoryPool pool;
        if (CALL(CUresult (*)(CUmemoryPool *, const CUmemPoolProps *), "cuMemPoolCreate", &pool, &props) != 0) return 5;
        if (CALL(CUresult (*)(CUdevice, CUmemoryPool), "cuDeviceSetMemPool", 0, pool) != 0) return 5;
        pool_then_fill(pool, 0);
    } else if (strcmp(c, "static-runtime") == 0) {
        /* What libcudart_static does: dlopen libcuda, dlsym cuGetProcAddress_v2, then fetch every
         * entry point through it (here cuMemAlloc for CUDA 12.0). */
        start(0);
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
            (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))sym(
                "cuGetProcAddress_v2");
        void *f = NULL;
        CUdriverProcAddressQueryResult q;
        if (gpa("cuMemAlloc", &f, 12000, 0, &q) != CUDA_SUCCESS || !f) {
            fprintf(stderr, "adversary: cuGetProcAddress_v2(cuMemAlloc, 12000) failed\n");
            return 5;
        }
        fill((alloc_fn)f);
    } else if (strcmp(c, "default-pool-reserve") == 0) {
        start(0);
        CUmemoryPool pool;
        CALL(CUresult (*)(CUmemoryPool *, CUdevice), "cuDeviceGetDefaultMemPool", &pool, 0);
        pool_then_fill(pool, 0);
    } else if (strcmp(c, "foreign-pool") == 0) {
        /* Device 1 filled to its limit from its own context, then more from device 1's default
         * pool with a stream of device 0. */
        CUcontext c0 = start(0);
        CUcontext c1;
        CALL(CUresult (*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &c1, 1);
        CALL(CUresult (*)(CUcontext), "cuCtxSetCurrent", c1);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
        CALL(CUresult (*)(CUcontext), "cuCtxSetCurrent", c0);
        CUmemoryPool pool;
        CALL(CUresult (*)(CUmemoryPool *, CUdevice), "cuDeviceGetMemPool", &pool, 1);
        CUstream s = new_stream();
        CUdeviceptr p;
        for (int i = 0; i < 16; i++)
            if (CALL(CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), "cuMemAllocFromPoolAsync", &p, STEP,
                     pool, s) != 0) {
                refused++;
                break;
            }
    } else if (strcmp(c, "graph-node") == 0) {
        start(0);
        CUgraph g;
        CUgraphNode node;
        CUgraphExec exec;
        CALL(CUresult (*)(CUgraph *, unsigned), "cuGraphCreate", &g, 0);
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps.allocType = 1;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.bytesize = 16 * STEP;
        if (CALL(CUresult (*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *),
                 "cuGraphAddMemAllocNode", &node, g, NULL, 0, &params) != 0)
            refused++;
        else if (CALL(CUresult (*)(CUgraphExec *, CUgraph, unsigned long long), "cuGraphInstantiateWithFlags", &exec, g,
                      0) == 0)
            CALL(CUresult (*)(CUgraphExec, CUstream), "cuGraphLaunch", exec, NULL);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
    } else if (strcmp(c, "capture") == 0) {
        start(0);
        CUstream s = new_stream();
        CUgraph g;
        CUgraphExec exec;
        CALL(CUresult (*)(CUstream, int), "cuStreamBeginCapture_v2", s, 0);
        CUdeviceptr p;
        int ok = CALL(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync", &p, 16 * STEP, s) == 0;
        if (ok) CALL(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync", p, s);
        else refused++;
        CALL(CUresult (*)(CUstream, CUgraph *), "cuStreamEndCapture", s, &g);
        if (CALL(CUresult (*)(CUgraphExec *, CUgraph, unsigned long long), "cuGraphInstantiateWithFlags", &exec, g, 0) == 0)
            CALL(CUresult (*)(CUgraphExec, CUstream), "cuGraphLaunch", exec, s);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
    } else if (strcmp(c, "ctx-limit") == 0) {
        start(0);
        if (CALL(CUresult (*)(int, size_t), "cuCtxSetLimit", CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)(16 * STEP)) != 0) refused++;
        if (CALL(CUresult (*)(int, size_t), "cuCtxSetLimit", CU_LIMIT_STACK_SIZE, (size_t)8192) != 0) refused++;
        fill((alloc_fn)sym("cuMemAlloc_v2"));
    } else if (strcmp(c, "legacy") == 0) {
        start(0);
        CUresult (*a)(CUdeviceptr_v1 *, unsigned int) = (CUresult(*)(CUdeviceptr_v1 *, unsigned int))sym("cuMemAlloc");
        CUdeviceptr_v1 p;
        for (uint64_t total = 0; total < CAP; total += STEP)
            if (a(&p, (unsigned int)STEP) != 0) {
                refused++;
                break;
            }
        unsigned int f = 0, t = 0;
        CALL(CUresult (*)(unsigned int *, unsigned int *), "cuMemGetInfo", &f, &t);
        fprintf(stderr, "legacy cuMemGetInfo free=%u total=%u\n", f, t);
    } else if (strcmp(c, "legacy-array") == 0) {
        start(0);
        CUresult (*a)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *) =
            (CUresult(*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *))sym("cuArrayCreate");
        CUresult (*a3)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *) =
            (CUresult(*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *))sym("cuArray3DCreate");
        CUDA_ARRAY_DESCRIPTOR_v1 d = {8192, 8192, 0x01, 1};      /* 64 MiB of uint8 */
        CUDA_ARRAY3D_DESCRIPTOR_v1 d3 = {4096, 4096, 4, 0x01, 1, 0}; /* 64 MiB */
        CUarray arr;
        for (uint64_t total = 0; total < CAP; total += 2 * STEP) {
            if (a(&arr, &d) != 0 || a3(&arr, &d3) != 0) {
                refused++;
                break;
            }
        }
    } else if (strcmp(c, "deepbind") == 0 && argc > 2) {
        start(0);
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_DEEPBIND);
        if (!lib) {
            fprintf(stderr, "adversary: %s\n", dlerror());
            return 3;
        }
        fill((alloc_fn)dlsym(lib, "deep_alloc"));
    } else if (strcmp(c, "dlvsym") == 0) {
        start(0);
        void *f = dlvsym(h, "cuMemAlloc_v2", "GLIBC_2.2.5");
        if (!f) f = dlvsym(h, "cuMemAlloc_v2", "libcuda.so.1");
        if (!f) {
            fprintf(stderr, "adversary: dlvsym found nothing: %s\n", dlerror());
            refused++;
        } else {
            fill((alloc_fn)f);
        }
    } else if (strcmp(c, "libc-dlsym") == 0) {
        start(0);
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        void *(*real_dlsym)(void *, const char *) = (void *(*)(void *, const char *))dlsym(libc, "dlsym");
        fill((alloc_fn)real_dlsym(h, "cuMemAlloc_v2"));
    } else if (strcmp(c, "dlmopen") == 0) {
        start(0);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
        void *other = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        if (!other) {
            fprintf(stderr, "adversary: dlmopen refused: %s\n", dlerror());
            refused++;
        } else {
            void *saved = h;
            h = other;
            if (start(0)) fill((alloc_fn)dlsym(other, "cuMemAlloc_v2"));
            extra0 = held_in(other, 0);
            h = saved;
        }
    } else if (strcmp(c, "driver-copy") == 0 && argc > 2) {
        start(0);
        fill((alloc_fn)sym("cuMemAlloc_v2"));
        void *copy = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!copy) {
            fprintf(stderr, "adversary: %s\n", dlerror());
            refused++;
        } else {
            void *saved = h;
            h = copy;
            if (start(0)) fill((alloc_fn)dlsym(copy, "cuMemAlloc_v2"));
            extra0 = held_in(copy, 0);
            h = saved;
        }
    } else if (strcmp(c, "gpa-newer") == 0) {
        start(0);
        CUresult (*gpa)(const char *, void **, int, cuuint64_t) =
            (CUresult(*)(const char *, void **, int, cuuint64_t))sym("cuGetProcAddress");
        void *f = NULL;
        CUresult rc = gpa("cuMemAlloc", &f, 14000, 0);
        if (rc != CUDA_SUCCESS || !f) {
            fprintf(stderr, "adversary: cuGetProcAddress(cuMemAlloc, 14000) -> %d\n", rc);
            refused++;
        } else {
            fill((alloc_fn)f);
        }
    } else {
        fprintf(stderr, "adversary: unknown class %s\n", c);
        return 2;
    }
    report(extra0);
    return 0;
}
