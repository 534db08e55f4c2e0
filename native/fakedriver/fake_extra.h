/* More memory the real driver holds for a process, modelled by the fake (fake_extra.c): module
 * globals (__device__ variables of cuModuleLoad* / cuLibraryLoad*), managed memory migrating to
 * another device (cuMemPrefetchAsync), graphics interop (a fake GL buffer registered with
 * cuGraphicsGLRegisterBuffer) and stream-ordered pools shared between processes. */
#ifndef FAKE_EXTRA_H
#define FAKE_EXTRA_H

#include "fake_devices.h"
#include "tessera_launch_types.h"

#define CUDA_ERROR_FILE_NOT_FOUND_ 301
#define CUDA_ERROR_INVALID_IMAGE_ 200
#define CUDA_ERROR_NOT_MAPPED_ 211

typedef struct CUlib_st *CUlibrary;
typedef struct CUgraphicsResource_st *CUgraphicsResource;
typedef struct { unsigned char reserved[64]; } CUmemPoolPtrExportData;

/* fake_extra.c, for fake_timing.c's modules. */
CUresult fake_module_globals_take(const void *image, int dev, uint64_t *key, uint64_t *size);
int fake_read_image(const char *path, char *buf, size_t len);

/* fake_cuda.c, for fake_extra.c. */
CUresult fake_ipc_charge(int dev, uint64_t size, uint64_t *key);
CUresult fake_ipc_release(uint64_t key);
CUresult fake_managed_migrate(uint64_t p, int dst);
CUresult fake_ctx_charge(int dev, int sign);
CUresult cuInit(unsigned int flags);
int fake_pool_info(CUmemoryPool p, int *dev, int *htypes);
CUmemoryPool fake_pool_imported(int dev);
int fake_pool_is_imported(CUmemoryPool p);
int fake_ptr_range(uint64_t p, uint64_t *base, uint64_t *size, int *dev);
void fake_lock(void);
void fake_unlock(void);

CUresult cuModuleLoadData(CUmodule *m, const void *image);
CUresult cuModuleUnload(CUmodule m);
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *opts, void **vals);
CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin);
CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
                           unsigned nl);
CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jo, void **jv, unsigned nj, void *lo,
                               void **lv, unsigned nl);
CUresult cuLibraryUnload(CUlibrary lib);
CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib);
CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t count, CUdevice dst, CUstream s);
CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t count, CUdevice dst, CUstream s);
CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t count, CUmemLocation loc, unsigned flags, CUstream s);
CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t count, CUmemLocation loc, unsigned flags, CUstream s);
CUresult cuMemAdvise(CUdeviceptr p, size_t count, int advice, CUdevice dev);
CUresult cuMemAdvise_v2(CUdeviceptr p, size_t count, int advice, CUmemLocation loc);
CUresult cuGraphicsGLRegisterBuffer(CUgraphicsResource *res, unsigned buffer, unsigned flags);
CUresult cuGraphicsMapResources(unsigned n, CUgraphicsResource *res, CUstream s);
CUresult cuGraphicsUnmapResources(unsigned n, CUgraphicsResource *res, CUstream s);
CUresult cuGraphicsResourceGetMappedPointer_v2(CUdeviceptr *p, size_t *size, CUgraphicsResource res);
CUresult cuGraphicsUnregisterResource(CUgraphicsResource res);
CUresult cuMemPoolExportToShareableHandle(void *out, CUmemoryPool pool, int type, unsigned long long flags);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, int type, unsigned long long flags);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr p);
CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *data);
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned flags);
CUresult cuGreenCtxDestroy(CUgreenCtx g);

/* cuGetProcAddress entries (fake_timing.c's table). */
#define FAKE_EXTRA_PROCS                                                                        \
    T("cuModuleLoadDataEx", 2010, 0, cuModuleLoadDataEx),                                       \
    T("cuModuleLoadFatBinary", 2000, 0, cuModuleLoadFatBinary),                                 \
    T("cuLibraryLoadData", 12000, 0, cuLibraryLoadData),                                        \
    T("cuLibraryLoadFromFile", 12000, 0, cuLibraryLoadFromFile),                                \
    T("cuLibraryUnload", 12000, 0, cuLibraryUnload),                                            \
    T("cuLibraryGetModule", 12000, 0, cuLibraryGetModule),                                      \
    T("cuMemPrefetchAsync", 8000, 0, cuMemPrefetchAsync),                                       \
    T("cuMemPrefetchAsync", 8000, 1, cuMemPrefetchAsync_ptsz),                                  \
    T("cuMemPrefetchAsync", 12020, 0, cuMemPrefetchAsync_v2),                                   \
    T("cuMemPrefetchAsync", 12020, 1, cuMemPrefetchAsync_v2_ptsz),                              \
    T("cuMemAdvise", 8000, 0, cuMemAdvise),                                                     \
    T("cuMemAdvise", 12020, 0, cuMemAdvise_v2),                                                 \
    T("cuGraphicsGLRegisterBuffer", 3000, 0, cuGraphicsGLRegisterBuffer),                       \
    T("cuGraphicsMapResources", 3000, 0, cuGraphicsMapResources),                               \
    T("cuGraphicsUnmapResources", 3000, 0, cuGraphicsUnmapResources),                           \
    T("cuGraphicsResourceGetMappedPointer", 3020, 0, cuGraphicsResourceGetMappedPointer_v2),    \
    T("cuGraphicsUnregisterResource", 3000, 0, cuGraphicsUnregisterResource),                   \
    T("cuMemPoolExportToShareableHandle", 11020, 0, cuMemPoolExportToShareableHandle),          \
    T("cuMemPoolImportFromShareableHandle", 11020, 0, cuMemPoolImportFromShareableHandle),      \
    T("cuMemPoolExportPointer", 11020, 0, cuMemPoolExportPointer),                              \
    T("cuMemPoolImportPointer", 11020, 0, cuMemPoolImportPointer),                              \
    T("cuGreenCtxCreate", 12040, 0, cuGreenCtxCreate),                                          \
    T("cuGreenCtxDestroy", 12040, 0, cuGreenCtxDestroy),

#endif
