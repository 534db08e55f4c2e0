/*
 * Allocation+free pair latency through the driver entry points, as a program sees them:
 * dlopen("libcuda.so.1") and dlsym (so, when the isolation library is preloaded, its hooks).
 *   benchalloc PAIRS SIZE [THREADS]  ->  "pairs=N size=S threads=T ns_per_pair=X"
 *       each of THREADS threads does PAIRS pairs at once; X = wall time / PAIRS (so a library
 *       that scales shows the same X at 2 threads on 2 cores as at 1; a lock convoy, twice it)
 *   benchalloc unmap LIVE ROUNDS     ->  "live=L rounds=R ns_per_map_unmap=X"
 *       with LIVE VMM mappings alive, the cost of mapping and unmapping one more
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera_cuda_types.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static CUresult (*alloc)(CUdeviceptr *, size_t);
static CUresult (*fr)(CUdeviceptr);
static CUresult (*setcur)(CUcontext);
static CUcontext ctx;
static long g_pairs;
static size_t g_size;
static pthread_barrier_t g_go;

static void *worker(void *arg) {
    (void)arg;
    CUdeviceptr p;
    if (setcur(ctx)) return (void *)1;
    for (long i = 0; i < g_pairs / 10 + 1; i++) /* warm up */
        if (alloc(&p, g_size) || fr(p)) return (void *)1;
    pthread_barrier_wait(&g_go);
    for (long i = 0; i < g_pairs; i++)
        if (alloc(&p, g_size) || fr(p)) return (void *)1;
    return NULL;
}

static int unmap_bench(void *h, long live, long rounds) {
    typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
    reserve_fn reserve = (reserve_fn)dlsym(h, "cuMemAddressReserve");
    create_fn create = (create_fn)dlsym(h, "cuMemCreate");
    map_fn map = (map_fn)dlsym(h, "cuMemMap");
    unmap_fn unmap = (unmap_fn)dlsym(h, "cuMemUnmap");
    if (!reserve || !create || !map || !unmap) return 5;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    const size_t gran = 2 << 20;
    CUmemGenericAllocationHandle handle;
    if (create(&handle, gran, &prop, 0)) return 6;
    for (long i = 0; i < live; i++) { /* one physical allocation, mapped LIVE times */
        CUdeviceptr va;
        if (reserve(&va, gran, 0, 0, 0) || map(va, gran, 0, handle, 0)) return 7;
    }
    CUdeviceptr va;
    if (reserve(&va, gran, 0, 0, 0)) return 7;
    double t0 = now_ns();
    for (long i = 0; i < rounds; i++)
        if (map(va, gran, 0, handle, 0) || unmap(va, gran)) return 8;
    double t1 = now_ns();
    printf("live=%ld rounds=%ld ns_per_map_unmap=%.1f\n", live, rounds, (t1 - t0) / rounds);
    return 0;
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    setcur = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    alloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    fr = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
    if (init(0) || retain(&ctx, 0) || setcur(ctx)) return 3;
    if (argc > 1 && strcmp(argv[1], "unmap") == 0)
        return unmap_bench(h, argc > 2 ? atol(argv[2]) : 16000, argc > 3 ? atol(argv[3]) : 2000);
    g_pairs = argc > 1 ? atol(argv[1]) : 1000000;
    g_size = argc > 2 ? strtoull(argv[2], NULL, 0) : (1 << 20);
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads < 1 || threads > 64) return 2;
    pthread_t t[64];
    pthread_barrier_init(&g_go, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    pthread_barrier_wait(&g_go);
    double t0 = now_ns();
    int bad = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad |= r != NULL;
    }
    double t1 = now_ns();
    if (bad) return 4;
    printf("pairs=%ld size=%zu threads=%d ns_per_pair=%.1f\n", g_pairs, g_size, threads, (t1 - t0) / g_pairs);
    return 0;
}
