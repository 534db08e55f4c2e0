/* A plugin that loads the CUDA driver only when called (adversary3 dlmopen-late): loaded with
 * dlmopen into its own namespace, where the preloaded isolation library does not exist. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>

#include "tessera_cuda_types.h"

static void *lib;

uint64_t plugin_fill(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 0;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(lib, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
    CUcontext c;
    if (!init || !retain || !set || !alloc || init(0) || retain(&c, 0) || set(c)) return 0;
    uint64_t total = 0;
    CUdeviceptr p;
    while (total < (4096ULL << 20) && alloc(&p, 64ULL << 20) == CUDA_SUCCESS) total += 64ULL << 20;
    return total;
}

unsigned long long plugin_held(void) {
    unsigned long long b = 0;
    if (!lib) return 0;
    CUresult (*held)(CUdevice, unsigned long long *) = (CUresult(*)(CUdevice, unsigned long long *))dlsym(lib, "fakeCudaHeldBytes");
    if (held) held(0, &b);
    return b;
}
