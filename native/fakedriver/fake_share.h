/* Sharing device memory between processes in the fake driver (fake_share.c): VMM shareable
 * handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle) and legacy IPC. */
#ifndef FAKE_SHARE_H
#define FAKE_SHARE_H

#include <stdint.h>

#include "tessera_cuda_types.h"

#define FAKE_HANDLE_TYPE_FD CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
#define FAKE_HANDLE_TYPE_FABRIC CU_MEM_HANDLE_TYPE_FABRIC

/* fake_cuda.c, for fake_share.c; the fake_vmm_* and fake_ptr_range calls need fake_lock held. */
void fake_lock(void);
void fake_unlock(void);
int fake_vmm_valid(uint64_t h, uint64_t *size, int *dev, int *types);
uint64_t fake_vmm_root(uint64_t h);
int fake_vmm_exists(uint64_t h);
void fake_vmm_ref(uint64_t h);
void fake_vmm_unref(uint64_t h);
uint64_t fake_vmm_alias(uint64_t root);
int fake_ptr_range(uint64_t p, uint64_t *base, uint64_t *size, int *dev);
CUresult fake_ipc_charge(int dev, uint64_t size, uint64_t *key);
CUresult fake_ipc_release(uint64_t key);

/* fake_share.c: drops the references of exported descriptors every copy of which is closed
 * (caller holds fake_lock). */
void fake_exports_poll(void);

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type);
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr p);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuCtxGetDevice(CUdevice *dev);

#endif
