/* Memory the driver holds outside the allocation calls (hooks_held.c): hooked names, their ABIs
 * for cuGetProcAddress, and the hooks' prototypes (internal). */
#ifndef TESSERA_HELD_HOOKS_H
#define TESSERA_HELD_HOOKS_H

#include <stdint.h>

#include "tessera_cuda_types.h"

/* Refused while limits are active: X(name, why). */
#define TS_HELD_REFUSED(X)                                                                      \
    X(cuMemPrefetchBatchAsync, BATCH) X(cuMemPrefetchBatchAsync_ptsz, BATCH)                    \
    X(cuMemDiscardAndPrefetchBatchAsync, BATCH) X(cuMemDiscardAndPrefetchBatchAsync_ptsz, BATCH) \
    X(cuGraphicsGLRegisterBuffer, GFX) X(cuGraphicsGLRegisterImage, GFX)                        \
    X(cuGraphicsEGLRegisterImage, GFX) X(cuGraphicsVDPAURegisterVideoSurface, GFX)              \
    X(cuGraphicsVDPAURegisterOutputSurface, GFX) X(cuGraphicsMapResources, GFX)                 \
    X(cuGraphicsMapResources_ptsz, GFX) X(cuGraphicsResourceGetMappedPointer, GFX)              \
    X(cuGraphicsResourceGetMappedPointer_v2, GFX) X(cuGraphicsResourceGetMappedMipmappedArray, GFX) \
    X(cuGraphicsSubResourceGetMappedArray, GFX) X(cuGraphicsResourceGetMappedEglFrame, GFX)     \
    X(cuEGLStreamConsumerConnect, GFX) X(cuEGLStreamConsumerConnectWithFlags, GFX)              \
    X(cuEGLStreamProducerConnect, GFX) X(cuImportExternalMemory, GFX)                           \
    X(cuExternalMemoryGetMappedBuffer, GFX) X(cuExternalMemoryGetMappedMipmappedArray, GFX)

#define TS_HELD_HOOKS(X)                                                                        \
    X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleLoadFatBinary)          \
    X(cuGreenCtxCreate) X(cuGreenCtxDestroy)                                                    \
    X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal_v2) X(cuModuleGetGlobal) X(cuLibraryLoadData)       \
    X(cuLibraryLoadFromFile) X(cuLibraryUnload) X(cuLibraryGetModule) X(cuLibraryGetKernel)     \
    X(cuLibraryGetGlobal) X(cuLibraryGetManaged) X(cuKernelGetFunction)                         \
    X(cuMemPrefetchAsync) X(cuMemPrefetchAsync_ptsz) X(cuMemPrefetchAsync_v2)                   \
    X(cuMemPrefetchAsync_v2_ptsz) X(cuMemAdvise) X(cuMemAdvise_v2)                              \
    X(cuMemPrefetchBatchAsync) X(cuMemPrefetchBatchAsync_ptsz)                                  \
    X(cuMemDiscardAndPrefetchBatchAsync) X(cuMemDiscardAndPrefetchBatchAsync_ptsz)              \
    X(cuGraphicsGLRegisterBuffer) X(cuGraphicsGLRegisterImage) X(cuGraphicsEGLRegisterImage)    \
    X(cuGraphicsVDPAURegisterVideoSurface) X(cuGraphicsVDPAURegisterOutputSurface)              \
    X(cuGraphicsMapResources) X(cuGraphicsMapResources_ptsz)                                    \
    X(cuGraphicsResourceGetMappedPointer) X(cuGraphicsResourceGetMappedPointer_v2)              \
    X(cuGraphicsResourceGetMappedMipmappedArray) X(cuGraphicsSubResourceGetMappedArray)         \
    X(cuGraphicsResourceGetMappedEglFrame) X(cuEGLStreamConsumerConnect)                        \
    X(cuEGLStreamConsumerConnectWithFlags) X(cuEGLStreamProducerConnect)                        \
    X(cuImportExternalMemory) X(cuExternalMemoryGetMappedBuffer)                                \
    X(cuExternalMemoryGetMappedMipmappedArray)

/* cuGetProcAddress: {base, exported variant, CUDA version of that ABI, per-thread stream}. */
#define TS_HELD_VARIANTS                                                                        \
    {"cuGreenCtxCreate", "cuGreenCtxCreate", 12040, 0},                                         \
    {"cuGreenCtxDestroy", "cuGreenCtxDestroy", 12040, 0},                                       \
    {"cuModuleLoad", "cuModuleLoad", 2000, 0},                                                  \
    {"cuModuleLoadData", "cuModuleLoadData", 2000, 0},                                          \
    {"cuModuleLoadDataEx", "cuModuleLoadDataEx", 2010, 0},                                      \
    {"cuModuleLoadFatBinary", "cuModuleLoadFatBinary", 2000, 0},                                \
    {"cuModuleUnload", "cuModuleUnload", 2000, 0},                                              \
    {"cuModuleGetFunction", "cuModuleGetFunction", 2000, 0},                                    \
    {"cuModuleGetGlobal", "cuModuleGetGlobal", 2000, 0},                                        \
    {"cuModuleGetGlobal", "cuModuleGetGlobal_v2", 3020, 0},                                     \
    {"cuLibraryLoadData", "cuLibraryLoadData", 12000, 0},                                       \
    {"cuLibraryLoadFromFile", "cuLibraryLoadFromFile", 12000, 0},                               \
    {"cuLibraryUnload", "cuLibraryUnload", 12000, 0},                                           \
    {"cuLibraryGetModule", "cuLibraryGetModule", 12000, 0},                                     \
    {"cuLibraryGetKernel", "cuLibraryGetKernel", 12000, 0},                                     \
    {"cuLibraryGetGlobal", "cuLibraryGetGlobal", 12000, 0},                                     \
    {"cuLibraryGetManaged", "cuLibraryGetManaged", 12000, 0},                                   \
    {"cuKernelGetFunction", "cuKernelGetFunction", 12000, 0},                                   \
    {"cuMemPrefetchAsync", "cuMemPrefetchAsync", 8000, 0},                                      \
    {"cuMemPrefetchAsync", "cuMemPrefetchAsync_ptsz", 8000, 1},                                 \
    {"cuMemPrefetchAsync", "cuMemPrefetchAsync_v2", 12020, 0},                                  \
    {"cuMemPrefetchAsync", "cuMemPrefetchAsync_v2_ptsz", 12020, 1},                             \
    {"cuMemAdvise", "cuMemAdvise", 8000, 0},                                                    \
    {"cuMemAdvise", "cuMemAdvise_v2", 12020, 0},                                                \
    {"cuMemPrefetchBatchAsync", "cuMemPrefetchBatchAsync", 12080, 0},                           \
    {"cuMemPrefetchBatchAsync", "cuMemPrefetchBatchAsync_ptsz", 12080, 1},                      \
    {"cuMemDiscardAndPrefetchBatchAsync", "cuMemDiscardAndPrefetchBatchAsync", 12080, 0},       \
    {"cuMemDiscardAndPrefetchBatchAsync", "cuMemDiscardAndPrefetchBatchAsync_ptsz", 12080, 1},  \
    {"cuGraphicsGLRegisterBuffer", "cuGraphicsGLRegisterBuffer", 3000, 0},                      \
    {"cuGraphicsGLRegisterImage", "cuGraphicsGLRegisterImage", 3000, 0},                        \
    {"cuGraphicsEGLRegisterImage", "cuGraphicsEGLRegisterImage", 7000, 0},                      \
    {"cuGraphicsVDPAURegisterVideoSurface", "cuGraphicsVDPAURegisterVideoSurface", 3010, 0},    \
    {"cuGraphicsVDPAURegisterOutputSurface", "cuGraphicsVDPAURegisterOutputSurface", 3010, 0},  \
    {"cuGraphicsMapResources", "cuGraphicsMapResources", 3000, 0},                              \
    {"cuGraphicsMapResources", "cuGraphicsMapResources_ptsz", 7000, 1},                         \
    {"cuGraphicsResourceGetMappedPointer", "cuGraphicsResourceGetMappedPointer", 3000, 0},      \
    {"cuGraphicsResourceGetMappedPointer", "cuGraphicsResourceGetMappedPointer_v2", 3020, 0},   \
    {"cuGraphicsResourceGetMappedMipmappedArray", "cuGraphicsResourceGetMappedMipmappedArray", 5000, 0}, \
    {"cuGraphicsSubResourceGetMappedArray", "cuGraphicsSubResourceGetMappedArray", 3000, 0},    \
    {"cuGraphicsResourceGetMappedEglFrame", "cuGraphicsResourceGetMappedEglFrame", 7000, 0},    \
    {"cuEGLStreamConsumerConnect", "cuEGLStreamConsumerConnect", 7000, 0},                      \
    {"cuEGLStreamConsumerConnectWithFlags", "cuEGLStreamConsumerConnectWithFlags", 8000, 0},    \
    {"cuEGLStreamProducerConnect", "cuEGLStreamProducerConnect", 7000, 0},                      \
    {"cuImportExternalMemory", "cuImportExternalMemory", 10000, 0},                             \
    {"cuExternalMemoryGetMappedBuffer", "cuExternalMemoryGetMappedBuffer", 10000, 0},           \
    {"cuExternalMemoryGetMappedMipmappedArray", "cuExternalMemoryGetMappedMipmappedArray", 10000, 0},

CUresult ts_hook_cuGreenCtxCreate(void **, void *, CUdevice, unsigned);
CUresult ts_hook_cuGreenCtxDestroy(void *);
CUresult ts_hook_cuModuleLoad(void **, const char *);
CUresult ts_hook_cuModuleLoadData(void **, const void *);
CUresult ts_hook_cuModuleLoadDataEx(void **, const void *, unsigned, void *, void **);
CUresult ts_hook_cuModuleLoadFatBinary(void **, const void *);
CUresult ts_hook_cuModuleUnload(void *);
CUresult ts_hook_cuModuleGetFunction(void **, void *, const char *);
CUresult ts_hook_cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, void *, const char *);
CUresult ts_hook_cuModuleGetGlobal(CUdeviceptr_v1 *, unsigned int *, void *, const char *);
CUresult ts_hook_cuLibraryLoadData(void **, const void *, void *, void **, unsigned, void *, void **, unsigned);
CUresult ts_hook_cuLibraryLoadFromFile(void **, const char *, void *, void **, unsigned, void *, void **, unsigned);
CUresult ts_hook_cuLibraryUnload(void *);
CUresult ts_hook_cuLibraryGetModule(void **, void *);
CUresult ts_hook_cuLibraryGetKernel(void **, void *, const char *);
CUresult ts_hook_cuLibraryGetGlobal(CUdeviceptr *, size_t *, void *, const char *);
CUresult ts_hook_cuLibraryGetManaged(CUdeviceptr *, size_t *, void *, const char *);
CUresult ts_hook_cuKernelGetFunction(void **, void *);
CUresult ts_hook_cuMemPrefetchAsync(CUdeviceptr, size_t, CUdevice, CUstream);
CUresult ts_hook_cuMemPrefetchAsync_ptsz(CUdeviceptr, size_t, CUdevice, CUstream);
CUresult ts_hook_cuMemPrefetchAsync_v2(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
CUresult ts_hook_cuMemPrefetchAsync_v2_ptsz(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
CUresult ts_hook_cuMemAdvise(CUdeviceptr, size_t, int, CUdevice);
CUresult ts_hook_cuMemAdvise_v2(CUdeviceptr, size_t, int, CUmemLocation);
#define TS_HELD_REFUSED_PROTO(name, why)                                                        \
    CUresult ts_hook_##name(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);
TS_HELD_REFUSED(TS_HELD_REFUSED_PROTO)

#endif
