/* A library that calls the driver directly; the adversary loads it with RTLD_DEEPBIND, so its
 * references would bind to libcuda before the preloaded hooks. */
#include "tessera_cuda_types.h"

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);

CUresult deep_alloc(CUdeviceptr *dptr, size_t size) { return cuMemAlloc_v2(dptr, size); }
