/*
 * Device memory shared between processes, as the real driver does it (issue #28 class 3):
 *
 *  - cuMemExportToShareableHandle of a VMM allocation created with that handle type in
 *    requestedHandleTypes. A POSIX file descriptor is a reference to the allocation: the memory
 *    lives until the program's handles are released, every mapping is unmapped AND every copy of
 *    the descriptor (dup, fork, SCM_RIGHTS) is closed. Here the descriptor is the write end of a
 *    pipe whose read end the driver keeps: when every copy is closed the read end reports
 *    POLLHUP, and the reference goes (checked at the driver's next accounting call). A fabric
 *    handle (64 opaque bytes) is no reference: only handles imported from it are.
 *  - cuMemImportFromShareableHandle gives a new handle to the same allocation (a reference of its
 *    own, to release like any handle). This fake imports only what this process exported (the
 *    per-process tables hold no other process's allocations); an unknown descriptor or fabric
 *    handle is CUDA_ERROR_INVALID_VALUE.
 *  - Legacy IPC: cuIpcGetMemHandle of a cuMemAlloc allocation; cuIpcOpenMemHandle in another
 *    process maps it there and keeps the memory alive until cuIpcCloseMemHandle, even after the
 *    exporter frees it or exits: the fake counts the opened bytes for the opening process too
 *    (stricter than a driver that counts them once, never looser).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_share.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_EXPORTS 1024

typedef struct {
    int used;
    int type;
    uint64_t root;  /* the allocation (its creating handle) */
    int rfd;        /* FD: the read end the driver keeps */
    uint64_t dev, ino;
    unsigned char fabric[64];
} export_rec;

static export_rec g_exports[MAX_EXPORTS];

void fake_exports_poll(void) {
    for (int i = 0; i < MAX_EXPORTS; i++) {
        export_rec *e = &g_exports[i];
        if (!e->used || e->type != FAKE_HANDLE_TYPE_FD) continue;
        struct pollfd p = {.fd = e->rfd, .events = POLLIN};
        if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) {
            close(e->rfd);
            e->used = 0;
            fake_vmm_unref(e->root); /* every copy of the descriptor is closed */
        }
    }
}

static export_rec *new_export(void) {
    for (int i = 0; i < MAX_EXPORTS; i++)
        if (!g_exports[i].used) return &g_exports[i];
    return NULL;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags) {
    if (!shareable || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != FAKE_HANDLE_TYPE_FD && type != FAKE_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_SUPPORTED;
    fake_lock();
    fake_exports_poll();
    int types = 0;
    CUresult rc = CUDA_SUCCESS;
    export_rec *e = NULL;
    if (!fake_vmm_valid(h, NULL, NULL, &types)) rc = CUDA_ERROR_INVALID_VALUE;
    else if (!(types & type)) rc = CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
    else if (!(e = new_export())) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        uint64_t root = fake_vmm_root(h);
        if (type == FAKE_HANDLE_TYPE_FD) {
            int fds[2];
            struct stat st;
            if (pipe2(fds, O_CLOEXEC) != 0 || fstat(fds[1], &st) != 0) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                *e = (export_rec){.used = 1, .type = type, .root = root, .rfd = fds[0],
                                  .dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino};
                fake_vmm_ref(root); /* the descriptor is a reference */
                *(int *)shareable = fds[1];
            }
        } else {
            *e = (export_rec){.used = 1, .type = type, .root = root, .rfd = -1};
            memcpy(e->fabric, "FAKEFAB", 8);
            int pid = getpid();
            memcpy(e->fabric + 8, &pid, sizeof pid);
            memcpy(e->fabric + 16, &root, sizeof root);
            for (int i = 24; i < 64; i++) e->fabric[i] = (unsigned char)rand();
            memcpy(shareable, e->fabric, 64);
        }
    }
    fake_unlock();
    return rc;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type) {
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != FAKE_HANDLE_TYPE_FD && type != FAKE_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_SUPPORTED;
    struct stat st;
    if (type == FAKE_HANDLE_TYPE_FD && fstat((int)(intptr_t)os_handle, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type == FAKE_HANDLE_TYPE_FABRIC && !os_handle) return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    fake_exports_poll();
    uint64_t root = 0;
    for (int i = 0; i < MAX_EXPORTS && !root; i++) {
        export_rec *e = &g_exports[i];
        if (!e->used || e->type != type) continue;
        if (type == FAKE_HANDLE_TYPE_FD ? (e->dev == (uint64_t)st.st_dev && e->ino == (uint64_t)st.st_ino)
                                        : memcmp(e->fabric, os_handle, 64) == 0)
            root = e->root;
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (root && fake_vmm_exists(root)) {
        *h = fake_vmm_alias(root);
        rc = CUDA_SUCCESS;
    }
    fake_unlock();
    return rc;
}

/* ---- legacy IPC ---- */

typedef struct {
    char magic[8];
    int32_t pid;
    int32_t dev;
    uint64_t key;
    uint64_t size;
} ipc_blob;

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
    if (!handle || !p) return CUDA_ERROR_INVALID_VALUE;
    uint64_t base, size;
    int dev;
    fake_lock();
    int found = fake_ptr_range(p, &base, &size, &dev);
    fake_unlock();
    if (!found || base != p || dev < 0) return CUDA_ERROR_INVALID_VALUE;
    ipc_blob b = {.magic = "FAKEIPC", .pid = getpid(), .dev = dev, .key = base, .size = size};
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &b, sizeof b);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    if (!p || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
    ipc_blob b;
    memcpy(&b, &handle, sizeof b);
    if (memcmp(b.magic, "FAKEIPC", 8) != 0 || b.size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (b.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* not in the exporting process */
    CUdevice cur;
    if (cuCtxGetDevice(&cur) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t key;
    CUresult rc = fake_ipc_charge(b.dev, b.size, &key);
    if (rc == CUDA_SUCCESS) *p = key;
    return rc;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    return cuIpcOpenMemHandle_v2(p, handle, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return fake_ipc_release(p);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    uint64_t b, s;
    int dev;
    fake_lock();
    int found = fake_ptr_range(p, &b, &s, &dev);
    fake_unlock();
    if (!found) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = b;
    if (size) *size = s;
    return CUDA_SUCCESS;
}
