/*
 * Allocation+free pair latency through the driver entry points, as a program sees them:
 * dlopen("libcuda.so.1") and dlsym (so, when the isolation library is preloaded, its hooks).
 *   benchalloc PAIRS SIZE  ->  "pairs=N size=S ns_per_pair=X"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tessera_cuda_types.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    size_t size = argc > 2 ? strtoull(argv[2], NULL, 0) : (1 << 20);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CUresult (*fr)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
    CUcontext ctx;
    if (init(0) || retain(&ctx, 0) || setcur(ctx)) return 3;
    CUdeviceptr p;
    for (long i = 0; i < pairs / 10 + 1; i++) { /* warm up */
        if (alloc(&p, size) || fr(p)) return 4;
    }
    double t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        if (alloc(&p, size) || fr(p)) return 4;
    }
    double t1 = now_ns();
    printf("pairs=%ld size=%zu ns_per_pair=%.1f\n", pairs, size, (t1 - t0) / pairs);
    return 0;
}
