/*
 * Fuzzer over the hooked entry points (issue #28), run under an AddressSanitizer + UBSan build
 * of the library (libtessera-cuda-asan.so, with libasan preloaded first) on the fake driver.
 * Random calls with hostile arguments: sizes near SIZE_MAX and 0, foreign and stale pointers,
 * double frees, pool memory freed by the synchronous API and the other way round, VMM handles
 * released twice, unmapped twice, mapped at odd ranges, context limits, NULL out-pointers, VMM
 * handles exported and imported back (descriptors closed, junk descriptors, fabric handles),
 * IPC handles opened and closed, modules and libraries of odd sizes loaded (eagerly and lazily) and
 * unloaded, managed memory prefetched and advised to any device, green contexts.
 * After every call the invariant is checked: what the driver holds for the process
 * (fakeCudaHeldBytes) is at most the limit. Any sanitizer finding aborts the run.
 *
 *   fuzz_hooks SECONDS SEED LIMIT_BYTES  ->  "calls=N held_max=B seed=S"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda_types.h"

static void *h;
static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static void *sym(const char *n) {
    void *p = dlsym(h, n);
    if (!p) {
        fprintf(stderr, "fuzz_hooks: %s missing\n", n);
        exit(3);
    }
    return p;
}
#define F(type, name) ((type)sym(name))

static size_t odd_size(void) {
    static const size_t special[] = {0, 1, 511, 512, 4095, 1 << 20, 2 << 20, 64 << 20, (size_t)1 << 31,
                                     (size_t)1 << 32, SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2, SIZE_MAX - 4095,
                                     (size_t)1 << 40, 3 << 20};
    if (next() % 3 == 0) return next() % (256 << 20);
    return special[next() % (sizeof special / sizeof special[0])];
}

#define POOL 64
static CUdeviceptr ptrs[POOL];
static CUmemGenericAllocationHandle handles[POOL];
static CUdeviceptr maps[POOL];
static size_t map_size[POOL];
static int fds[POOL];
static unsigned char fabric[POOL][64];
static void *mods[POOL], *libs[POOL], *greens[POOL];

static CUdeviceptr any_ptr(void) {
    switch (next() % 4) {
    case 0: return 0;
    case 1: return (CUdeviceptr)next();
    default: return ptrs[next() % POOL];
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    rng = argc > 2 ? strtoull(argv[2], NULL, 0) : 88172645463325252ULL;
    if (!rng) rng = 1;
    uint64_t limit = argc > 3 ? strtoull(argv[3], NULL, 0) : (1ULL << 30);
    uint64_t seed = rng;
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
    CUresult (*held)(CUdevice, unsigned long long *) = F(CUresult(*)(CUdevice, unsigned long long *), "fakeCudaHeldBytes");
    if (F(CUresult(*)(unsigned), "cuInit")(0)) return 3;
    CUcontext ctx;
    if (F(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain")(&ctx, 0) == 0)
        F(CUresult(*)(CUcontext), "cuCtxSetCurrent")(ctx);
    CUstream s = NULL;
    F(CUresult(*)(CUstream *, unsigned), "cuStreamCreate")(&s, 0);
    CUmemoryPool dpool = NULL;
    F(CUresult(*)(CUmemoryPool *, CUdevice), "cuDeviceGetDefaultMemPool")(&dpool, 0);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long long calls = 0, held_max = 0;
    int trace = getenv("FUZZ_TRACE") ? atoi(getenv("FUZZ_TRACE")) : 0; /* each call on stderr, to find what a seed did */
    int ncases = getenv("FUZZ_CASES") ? atoi(getenv("FUZZ_CASES")) : 29; /* the first N kinds of call only */
    if (ncases < 1 || ncases > 29) ncases = 29;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
        int slot = (int)(next() % POOL);
        CUdeviceptr p = 0;
        size_t sz = odd_size();
        int op = (int)(next() % ncases);
        if (trace) fprintf(stderr, "fuzz_hooks: call %llu: case %d slot %d size %zu\n", calls, op, slot, sz);
        switch (op) {
        case 0: F(CUresult(*)(CUdeviceptr *, size_t), "cuMemAlloc_v2")(next() % 16 ? &p : NULL, sz); break;
        case 1: F(CUresult(*)(CUdeviceptr), "cuMemFree_v2")(any_ptr()); break;
        case 2: F(CUresult(*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync")(&p, sz, s); break;
        case 3: F(CUresult(*)(CUdeviceptr, CUstream), "cuMemFreeAsync")(any_ptr(), s); break;
        case 4: F(CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), "cuMemAllocFromPoolAsync")(
                    &p, sz, next() % 8 ? dpool : (CUmemoryPool)(uintptr_t)next(), s); break;
        case 5: {
            size_t pitch = 0;
            F(CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned), "cuMemAllocPitch_v2")(
                &p, next() % 8 ? &pitch : NULL, odd_size(), next() % 4096, (unsigned)(next() % 20));
            break;
        }
        case 6: F(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")(&p, sz, 1); break;
        case 7: {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            prop.location.type = next() % 6 ? CU_MEM_LOCATION_TYPE_DEVICE : (int)(next() % 5);
            prop.location.id = next() % 8 ? 0 : (int)next();
            prop.requestedHandleTypes = (int[]){0, 1, 8, 9, 2}[next() % 5];
            size_t vs = next() % 2 ? (size_t)((next() % 64) + 1) << 21 : sz;
            F(CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long),
              "cuMemCreate")(&handles[slot], vs, next() % 16 ? &prop : NULL, 0);
            map_size[slot] = vs;
            break;
        }
        case 8: F(CUresult(*)(CUmemGenericAllocationHandle), "cuMemRelease")(handles[next() % POOL]); break;
        case 9: {
            CUdeviceptr va = 0;
            size_t len = map_size[slot] ? map_size[slot] : (2 << 20);
            F(CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long), "cuMemAddressReserve")(
                &va, len, 0, 0, 0);
            if (F(CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long),
                  "cuMemMap")(va, next() % 8 ? len : odd_size(), 0, handles[next() % POOL], 0) == 0)
                maps[slot] = va;
            break;
        }
        case 10: F(CUresult(*)(CUdeviceptr, size_t), "cuMemUnmap")(maps[slot], next() % 4 ? map_size[slot] : odd_size()); break;
        case 11: {
            CUmemGenericAllocationHandle r;
            if (F(CUresult(*)(CUmemGenericAllocationHandle *, void *), "cuMemRetainAllocationHandle")(
                    &r, (void *)(uintptr_t)(next() % 2 ? maps[slot] : any_ptr())) == 0)
                handles[slot] = r;
            break;
        }
        case 12: F(CUresult(*)(CUmemoryPool, size_t), "cuMemPoolTrimTo")(dpool, next() % 2 ? 0 : sz); break;
        case 13: F(CUresult(*)(int, size_t), "cuCtxSetLimit")((int)(next() % 6), odd_size()); break;
        case 14: {
            size_t fr = 0, tot = 0;
            F(CUresult(*)(size_t *, size_t *), "cuMemGetInfo_v2")(next() % 8 ? &fr : NULL, next() % 8 ? &tot : NULL);
            break;
        }
        case 15: {
            CUDA_ARRAY3D_DESCRIPTOR d;
            memset(&d, 0, sizeof d);
            d.Width = next() % 70000;
            d.Height = next() % 70000;
            d.Depth = next() % 4;
            d.Format = (unsigned)(next() % 0x30);
            d.NumChannels = (unsigned)(next() % 5);
            CUarray a = NULL;
            if (F(CUresult(*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *), "cuArray3DCreate_v2")(&a, &d) == 0 && next() % 2)
                F(CUresult(*)(CUarray), "cuArrayDestroy")(a);
            break;
        }
        case 16: {
            CUcontext c2 = NULL;
            if (F(CUresult(*)(CUcontext *, unsigned, CUdevice), "cuCtxCreate_v2")(&c2, 0, (CUdevice)(next() % 3)) == 0) {
                if (next() % 2) F(CUresult(*)(CUcontext), "cuCtxDestroy_v2")(c2);
                F(CUresult(*)(CUcontext), "cuCtxSetCurrent")(ctx);
            }
            break;
        }
        case 17: F(CUresult(*)(CUstream), "cuStreamSynchronize")(s); break;
        case 18: F(CUresult(*)(CUdeviceptr_v1), "cuMemFree")((CUdeviceptr_v1)next()); break;
        case 19: {
            CUdeviceptr_v1 q = 0;
            F(CUresult(*)(CUdeviceptr_v1 *, unsigned), "cuMemAlloc")(&q, (unsigned)odd_size());
            break;
        }
        case 20: { /* export a handle (descriptor, fabric, or a type it was not created for) */
            int type = (int[]){1, 8, 2, 0}[next() % 4];
            unsigned char out[64];
            memset(out, 0, sizeof out);
            if (F(CUresult(*)(void *, CUmemGenericAllocationHandle, int, unsigned long long),
                  "cuMemExportToShareableHandle")(next() % 16 ? out : NULL, handles[next() % POOL], type,
                                                  next() % 8 ? 0 : next()) == 0) {
                if (type == 1) {
                    int fd;
                    memcpy(&fd, out, sizeof fd);
                    if (fds[slot] > 0) close(fds[slot]);
                    fds[slot] = fd;
                } else {
                    memcpy(fabric[slot], out, 64);
                }
            }
            break;
        }
        case 21: { /* import back: an exported descriptor or fabric handle, a closed one, junk */
            CUmemGenericAllocationHandle got = 0;
            int type = next() % 2 ? 1 : 8;
            void *os = type == 1 ? (void *)(intptr_t)(next() % 4 ? fds[slot] : (int)(next() % 64))
                                 : (void *)(next() % 8 ? fabric[slot] : NULL);
            if (F(CUresult(*)(CUmemGenericAllocationHandle *, void *, int), "cuMemImportFromShareableHandle")(
                    next() % 16 ? &got : NULL, os, type) == 0 && got)
                handles[slot] = got;
            break;
        }
        case 22: { /* a descriptor closed: the driver may free what only it kept alive */
            if (fds[slot] > 0) close(fds[slot]);
            fds[slot] = 0;
            break;
        }
        case 23: { /* IPC: a handle of our own allocation opened here (refused by the driver), junk, close */
            CUipcMemHandle ih;
            memset(&ih, (int)(next() & 0xff), sizeof ih);
            if (next() % 2) F(CUresult(*)(CUipcMemHandle *, CUdeviceptr), "cuIpcGetMemHandle")(&ih, any_ptr());
            CUdeviceptr q = 0;
            F(CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned), "cuIpcOpenMemHandle_v2")(next() % 16 ? &q : NULL, ih, 1);
            F(CUresult(*)(CUdeviceptr), "cuIpcCloseMemHandle")(next() % 2 ? q : any_ptr());
            break;
        }
        case 24: { /* a module with odd-sized __device__ variables; replaces (unloads) the slot's */
            char image[64];
            snprintf(image, sizeof image, "FAKECUBIN globals=%zu", odd_size());
            if (trace) fprintf(stderr, "fuzz_hooks: image %s\n", image);
            if (mods[slot]) F(CUresult(*)(void *), "cuModuleUnload")(mods[slot]);
            mods[slot] = NULL;
            F(CUresult(*)(void **, const void *), "cuModuleLoadData")(&mods[slot], image);
            break;
        }
        case 25: { /* a library: loaded, lazily into the context, unloaded */
            char image[64];
            snprintf(image, sizeof image, "FAKECUBIN globals=%zu", odd_size());
            if (trace) fprintf(stderr, "fuzz_hooks: image %s\n", image);
            if (libs[slot] && next() % 2) {
                void *m = NULL;
                F(CUresult(*)(void **, void *), "cuLibraryGetModule")(&m, libs[slot]);
                break;
            }
            if (libs[slot]) F(CUresult(*)(void *), "cuLibraryUnload")(libs[slot]);
            libs[slot] = NULL;
            F(CUresult(*)(void **, const void *, void *, void **, unsigned, void *, void **, unsigned),
              "cuLibraryLoadData")(&libs[slot], image, NULL, NULL, 0, NULL, NULL, 0);
            break;
        }
        case 26: { /* managed memory (or anything) prefetched to any device, the host, a bad one */
            int dst = (int)(next() % 4) - 1;
            CUmemLocation loc = {next() % 2 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST, dst};
            if (next() % 2) F(CUresult(*)(CUdeviceptr, size_t, CUdevice, CUstream), "cuMemPrefetchAsync")(any_ptr(), sz, dst, s);
            else F(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream), "cuMemPrefetchAsync_v2")(
                any_ptr(), sz, loc, 0, s);
            break;
        }
        case 27: F(CUresult(*)(CUdeviceptr, size_t, int, CUdevice), "cuMemAdvise")(any_ptr(), sz, (int)(next() % 8),
                                                                                    (int)(next() % 4) - 1);
            break;
        case 28: { /* a green context created, or the slot's destroyed */
            int desc = 1;
            if (greens[slot]) {
                F(CUresult(*)(void *), "cuGreenCtxDestroy")(greens[slot]);
                greens[slot] = NULL;
            } else {
                F(CUresult(*)(void **, void *, CUdevice, unsigned), "cuGreenCtxCreate")(&greens[slot], &desc,
                                                                                       (int)(next() % 3), 1);
            }
            break;
        }
        }
        if (p) ptrs[slot] = p;
        calls++;
        if (trace > 1) { /* FUZZ_TRACE=2: the library's charge against what the driver holds, on the current device */
            size_t fr = 0, tot = 0;
            unsigned long long b = 0;
            CUdevice cd = 0;
            F(CUresult(*)(CUdevice *), "cuCtxGetDevice")(&cd);
            F(CUresult(*)(size_t *, size_t *), "cuMemGetInfo_v2")(&fr, &tot);
            held(cd, &b);
            if (b > tot - fr) fprintf(stderr, "fuzz_hooks: held %llu > charged %zu on device %d\n", b, tot - fr, cd);
        }
        for (int dev = 0; dev < 2; dev++) {
            unsigned long long b = 0;
            held(dev, &b);
            if (b > held_max) held_max = b;
            if (b > limit) {
                fprintf(stderr, "fuzz_hooks: the driver holds %llu bytes on device %d over the %llu limit after "
                        "call %llu (seed %llu)\n", b, dev, (unsigned long long)limit, calls, (unsigned long long)seed);
                return 1;
            }
        }
    }
    printf("calls=%llu held_max=%llu seed=%llu\n", calls, held_max, (unsigned long long)seed);
    return 0;
}
