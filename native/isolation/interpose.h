/* The interposed names, the real entry points, and the hooks (internal). */
#ifndef TESSERA_INTERPOSE_H
#define TESSERA_INTERPOSE_H

#include "isolation.h"
#include "launch_hooks.h"
#include "held_hooks.h"

#define TS_EXPORT __attribute__((visibility("default")))

enum { TS_LIB_CUDA = 0, TS_LIB_NVML = 1 };

/* Exported driver names we hook: the hook is ts_hook_<name>, exported under <name> by alias. */
#define TS_CUDA_HOOKS(X)                                                                        \
    X(cuGetProcAddress) X(cuGetProcAddress_v2)                                                  \
    X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree_v2)                 \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)                       \
    X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)                    \
    X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemCreate) X(cuMemRelease)                       \
    X(cuMemRetainAllocationHandle) X(cuMemMap) X(cuMemUnmap)                                    \
    X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2)                                                   \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset_v2)   \
    X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset)                                     \
    X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2)                    \
    X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuMipmappedArrayCreate) X(cuArrayDestroy)      \
    X(cuMipmappedArrayDestroy)                                                                  \
    X(cuMemAlloc) X(cuMemAllocPitch) X(cuMemFree) X(cuMemGetInfo) X(cuDeviceTotalMem)           \
    X(cuCtxCreate) X(cuCtxDestroy)                                                              \
    X(cuMemPoolTrimTo) X(cuGraphAddMemAllocNode) X(cuGraphAddNode) X(cuGraphAddNode_v2)         \
    X(cuCtxSetLimit) X(cuArrayCreate) X(cuArray3DCreate)                                       \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuIpcOpenMemHandle)     \
    X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle) X(cuMemPoolExportToShareableHandle)         \
    X(cuMemPoolImportFromShareableHandle) X(cuMemPoolImportPointer) TS_LAUNCH_HOOKS(X) TS_HELD_HOOKS(X)

#define TS_NVML_HOOKS(X) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)

/* Driver entry points the hooks call but do not replace. */
#define TS_CUDA_HELPERS(X)                                                                      \
    X(cuCtxGetDevice) X(cuCtxGetCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2)           \
    X(cuStreamGetCtx) X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceGetCount)              \
    X(cuDeviceGetName) X(cuDeviceGetMemPool) X(cuDeviceGetDefaultMemPool) X(cuMemPoolGetAttribute) \
    X(cuStreamIsCapturing) X(cuCtxGetLimit) X(cuDeviceGetAttribute) X(cuMemGetAddressRange_v2)       \
    X(cuKernelGetLibrary)                                                                       \
    TS_LAUNCH_HELPERS(X)

#define TS_NVML_HELPERS(X) X(nvmlDeviceGetUUID) X(nvmlDeviceGetIndex) X(nvmlInit_v2) X(nvmlShutdown)   \
    X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetComputeRunningProcesses)                        \
    X(nvmlDeviceGetComputeRunningProcesses_v3)

typedef struct {
#define X(name) void *name;
    TS_CUDA_HOOKS(X) TS_NVML_HOOKS(X) TS_CUDA_HELPERS(X) TS_NVML_HELPERS(X)
#undef X
} ts_real_table;

extern ts_real_table ts_real;

typedef struct {
    const char *name;
    void *hook;
    void **real;
    int lib;
} ts_hook;

void *ts_real_dlsym(void *handle, const char *name);

int ts_bind(int lib);
extern int ts_bound[2]; /* 1 once ts_bind(lib) succeeded */
void ts_bind_lock(void);
void ts_bind_unlock(void);
void ts_bind_reinit(void);

/* Exports a hook under the driver's name (same translation unit as the definition). */
#define TS_ALIAS(name) \
    extern __typeof(ts_hook_##name) name __attribute__((alias("ts_hook_" #name), visibility("default")));

/* Hook definitions (hooks_cuda.c, hooks_nvml.c, interpose.c). */
CUresult ts_hook_cuGetProcAddress(const char *, void **, int, cuuint64_t);
CUresult ts_hook_cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult ts_hook_cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult ts_hook_cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult ts_hook_cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult ts_hook_cuMemFree_v2(CUdeviceptr);
CUresult ts_hook_cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult ts_hook_cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult ts_hook_cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult ts_hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult ts_hook_cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult ts_hook_cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult ts_hook_cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult ts_hook_cuMemPoolDestroy(CUmemoryPool);
CUresult ts_hook_cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult ts_hook_cuMemRelease(CUmemGenericAllocationHandle);
CUresult ts_hook_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
CUresult ts_hook_cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult ts_hook_cuMemUnmap(CUdeviceptr, size_t);
CUresult ts_hook_cuMemGetInfo_v2(size_t *, size_t *);
CUresult ts_hook_cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult ts_hook_cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult ts_hook_cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult ts_hook_cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult ts_hook_cuDevicePrimaryCtxRelease(CUdevice);
CUresult ts_hook_cuDevicePrimaryCtxReset(CUdevice);
CUresult ts_hook_cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult ts_hook_cuCtxCreate_v3(CUcontext *, void *, int, unsigned int, CUdevice);
CUresult ts_hook_cuCtxCreate_v4(CUcontext *, void *, unsigned int, CUdevice);
CUresult ts_hook_cuCtxDestroy_v2(CUcontext);
CUresult ts_hook_cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult ts_hook_cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult ts_hook_cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult ts_hook_cuArrayDestroy(CUarray);
CUresult ts_hook_cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult ts_hook_cuMemAlloc(CUdeviceptr_v1 *, unsigned int);
CUresult ts_hook_cuMemAllocPitch(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
CUresult ts_hook_cuMemFree(CUdeviceptr_v1);
CUresult ts_hook_cuMemGetInfo(unsigned int *, unsigned int *);
CUresult ts_hook_cuDeviceTotalMem(unsigned int *, CUdevice);
CUresult ts_hook_cuCtxCreate(CUcontext *, unsigned int, CUdevice);
CUresult ts_hook_cuCtxDestroy(CUcontext);
CUresult ts_hook_cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult ts_hook_cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult ts_hook_cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *);
CUresult ts_hook_cuGraphAddNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t, void *);
CUresult ts_hook_cuCtxSetLimit(int, size_t);
CUresult ts_hook_cuArrayCreate(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
CUresult ts_hook_cuArray3DCreate(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);
CUresult ts_hook_cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult ts_hook_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);
CUresult ts_hook_cuIpcOpenMemHandle(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult ts_hook_cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult ts_hook_cuIpcCloseMemHandle(CUdeviceptr);
CUresult ts_hook_cuMemPoolExportToShareableHandle(void *, CUmemoryPool, int, unsigned long long);
CUresult ts_hook_cuMemPoolImportFromShareableHandle(CUmemoryPool *, void *, int, unsigned long long);
CUresult ts_hook_cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, void *);
nvmlReturn_t ts_hook_nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t ts_hook_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

#endif
