/*
 * Device memory shared between processes (issue #28 class 3): the invariant is that what this
 * process is charged is never less than what the driver holds for it.
 *
 *  - cuMemExportToShareableHandle: a descriptor (or a fabric handle imported elsewhere) keeps the
 *    allocation alive after every handle of this process is released and unmapped, and its
 *    copies (dup, fork, SCM_RIGHTS) are invisible from here. So an exported allocation is pinned:
 *    charged until this process exits, whatever it releases (over-charging never lets a workload
 *    past its limit). The export's identity (the descriptor's device and inode, the fabric
 *    handle's bytes) is remembered.
 *  - cuMemImportFromShareableHandle: a handle this process exported comes back as a new handle to
 *    memory already pinned, so nothing more is charged. Anything else (exported by another
 *    process) is refused in limited mode: the driver says nothing of an imported allocation's size
 *    before it is mapped, so it could not be charged (use legacy IPC, e.g. NCCL_CUMEM_ENABLE=0).
 *  - cuIpcOpenMemHandle: the opener keeps the memory alive (the exporter may free it or exit), so
 *    the opener is charged the allocation's size (cuMemGetAddressRange) until cuIpcCloseMemHandle;
 *    over the limit, the handle is closed again and the open refused.
 *  - stream-ordered pool sharing (cuMemPoolExportToShareableHandle, cuMemPoolImportFromShareableHandle,
 *    cuMemPoolImportPointer): refused in limited mode (an imported pool's memory is held by the
 *    exporter's pool, whose size this process cannot see).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "state.h"

#define REAL(name, type) ((type)ts_real.name)

typedef struct {
    int type;
    uint64_t dev, ino;
    unsigned char fabric[64];
} export_id;

/* Under ts_tab_mu. */
static export_id *g_exports;
static size_t g_n_exports, g_cap_exports;
static int g_fd_ambiguous; /* two exports shared an inode: descriptors cannot be told apart */
static ts_table g_ipc;     /* IPC-opened pointers and their charge */

static int fd_identity(int fd, uint64_t *dev, uint64_t *ino) {
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return 0;
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return 1;
}

/* Caller holds ts_tab_mu. */
static int known_export(int type, void *os) {
    uint64_t dev = 0, ino = 0;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && (g_fd_ambiguous || !fd_identity((int)(intptr_t)os, &dev, &ino)))
        return 0;
    if (type == CU_MEM_HANDLE_TYPE_FABRIC && !os) return 0;
    for (size_t i = 0; i < g_n_exports; i++) {
        const export_id *e = &g_exports[i];
        if (e->type != type) continue;
        if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ? (e->dev == dev && e->ino == ino)
                                                              : memcmp(e->fabric, os, 64) == 0)
            return 1;
    }
    return 0;
}

static void remember_export(int type, const void *out) {
    export_id e = {.type = type};
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        if (!fd_identity(*(const int *)out, &e.dev, &e.ino)) return; /* a device file: never matched */
    } else if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        memcpy(e.fabric, out, 64);
    } else {
        return;
    }
    pthread_mutex_lock(&ts_tab_mu);
    for (size_t i = 0; i < g_n_exports && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; i++)
        if (g_exports[i].type == type && g_exports[i].dev == e.dev && g_exports[i].ino == e.ino) g_fd_ambiguous = 1;
    if (g_n_exports == g_cap_exports) {
        size_t cap = g_cap_exports ? g_cap_exports * 2 : 16;
        export_id *n = realloc(g_exports, cap * sizeof *n);
        if (n) {
            g_exports = n;
            g_cap_exports = cap;
        }
    }
    if (g_n_exports < g_cap_exports) g_exports[g_n_exports++] = e;
    pthread_mutex_unlock(&ts_tab_mu);
}

/* A forked child exported nothing: what its parent exported is charged to the parent only. */
void ts_share_after_fork(void) {
    free(g_exports);
    g_exports = NULL;
    g_n_exports = g_cap_exports = 0;
    g_fd_ambiguous = 0;
    ts_table_clear(&g_ipc);
}

typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
typedef CUresult (*import_fn)(CUmemGenericAllocationHandle *, void *, int);

CUresult ts_hook_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                              unsigned long long flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemExportToShareableHandle);
    export_fn real = REAL(cuMemExportToShareableHandle, export_fn);
    if (ts_mode() == TS_MODE_PASSTHROUGH) return real(out, h, type, flags);
    /* Pinned before the export exists: from then on no release gives the charge back. */
    pthread_mutex_lock(&ts_tab_mu);
    ts_record *r = ts_table_find(&ts_handles, h);
    int was = r ? r->kind : -1;
    if (r) r->kind = TS_KIND_PINNED;
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = real(out, h, type, flags);
    if (rc != CUDA_SUCCESS) {
        if (was >= 0 && was != TS_KIND_PINNED) {
            pthread_mutex_lock(&ts_tab_mu);
            r = ts_table_find(&ts_handles, h);
            if (r) r->kind = was;
            pthread_mutex_unlock(&ts_tab_mu);
        }
        return rc;
    }
    if (out) remember_export(type, out);
    return rc;
}

CUresult ts_hook_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemImportFromShareableHandle);
    import_fn real = REAL(cuMemImportFromShareableHandle, import_fn);
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(h, os, type);
    pthread_mutex_lock(&ts_tab_mu);
    int ours = known_export(type, os);
    pthread_mutex_unlock(&ts_tab_mu);
    if (!ours) {
        ts_log_once("vmm-import", "cuMemImportFromShareableHandle refused: the handle was not exported by this "
                    "process, and the memory it keeps alive cannot be charged here (its size is unknown until "
                    "mapped); share memory through cuIpc* instead (NCCL: NCCL_CUMEM_ENABLE=0)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return real(h, os, type); /* ours: already pinned and charged */
}

/* ---- legacy IPC ---- */

typedef CUresult (*ipc_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*ipc_close_fn)(CUdeviceptr);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

static CUresult ipc_open(ipc_open_fn real, CUdeviceptr *p, CUipcMemHandle hdl, unsigned int flags) {
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return real(p, hdl, flags);
    int ord, rdev;
    CUresult rc = ts_current_ordinal(&ord);
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(p, hdl, flags);
    if (rc != CUDA_SUCCESS || !p) return rc;
    size_t size = 0;
    ipc_close_fn close_fn = REAL(cuIpcCloseMemHandle, ipc_close_fn);
    if (!ts_real.cuMemGetAddressRange_v2 ||
        REAL(cuMemGetAddressRange_v2, range_fn)(NULL, &size, *p) != CUDA_SUCCESS || size == 0) {
        ts_log_once("ipc-size", "cuIpcOpenMemHandle refused: the driver does not say how large the opened memory "
                    "is, so it cannot be charged");
        if (close_fn) close_fn(*p);
        *p = 0;
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    rc = ts_reserve(mode, ord, size, &rdev, "cuIpcOpenMemHandle");
    if (rc != CUDA_SUCCESS) {
        if (close_fn) close_fn(*p);
        *p = 0;
        return rc;
    }
    if (rdev >= 0) {
        pthread_mutex_lock(&ts_tab_mu);
        int bad = ts_table_put(&g_ipc, *p, size, rdev, ord, TS_KIND_OTHER);
        pthread_mutex_unlock(&ts_tab_mu);
        if (bad) ts_log(TS_LOG_WARN, "cannot record IPC memory %#llx; it stays charged", (unsigned long long)*p);
    }
    return CUDA_SUCCESS;
}

CUresult ts_hook_cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle hdl, unsigned int flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuIpcOpenMemHandle);
    return ipc_open(REAL(cuIpcOpenMemHandle, ipc_open_fn), p, hdl, flags);
}

CUresult ts_hook_cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle hdl, unsigned int flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuIpcOpenMemHandle_v2);
    return ipc_open(REAL(cuIpcOpenMemHandle_v2, ipc_open_fn), p, hdl, flags);
}

CUresult ts_hook_cuIpcCloseMemHandle(CUdeviceptr p) {
    BIND_OR_FAIL();
    NEED_REAL(cuIpcCloseMemHandle);
    ipc_close_fn real = REAL(cuIpcCloseMemHandle, ipc_close_fn);
    ts_record r;
    pthread_mutex_lock(&ts_tab_mu);
    int found = ts_table_take(&g_ipc, p, &r);
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = real(p);
    if (!found) return rc;
    if (rc == CUDA_SUCCESS) {
        ts_region_release(r.rdev, r.size);
    } else {
        pthread_mutex_lock(&ts_tab_mu);
        ts_table_put_record(&g_ipc, &r);
        pthread_mutex_unlock(&ts_tab_mu);
    }
    return rc;
}

/* ---- stream-ordered pools shared between processes: refused ---- */

static CUresult refuse_pool_sharing(const char *what) {
    ts_log_once("pool-share", "%s refused: memory of a pool shared between processes is held by the exporting "
                "pool, which the importer cannot see or charge (fail closed)", what);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult ts_hook_cuMemPoolExportToShareableHandle(void *out, CUmemoryPool pool, int type, unsigned long long flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolExportToShareableHandle);
    if (ts_mode() != TS_MODE_PASSTHROUGH) return refuse_pool_sharing("cuMemPoolExportToShareableHandle");
    return REAL(cuMemPoolExportToShareableHandle, CUresult(*)(void *, CUmemoryPool, int, unsigned long long))(
        out, pool, type, flags);
}

CUresult ts_hook_cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *os, int type, unsigned long long flags) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolImportFromShareableHandle);
    if (ts_mode() != TS_MODE_PASSTHROUGH) return refuse_pool_sharing("cuMemPoolImportFromShareableHandle");
    return REAL(cuMemPoolImportFromShareableHandle, CUresult(*)(CUmemoryPool *, void *, int, unsigned long long))(
        pool, os, type, flags);
}

CUresult ts_hook_cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, void *data) {
    BIND_OR_FAIL();
    NEED_REAL(cuMemPoolImportPointer);
    if (ts_mode() != TS_MODE_PASSTHROUGH) return refuse_pool_sharing("cuMemPoolImportPointer");
    return REAL(cuMemPoolImportPointer, CUresult(*)(CUdeviceptr *, CUmemoryPool, void *))(p, pool, data);
}

TS_ALIAS(cuMemExportToShareableHandle)
TS_ALIAS(cuMemImportFromShareableHandle)
TS_ALIAS(cuIpcOpenMemHandle)
TS_ALIAS(cuIpcOpenMemHandle_v2)
TS_ALIAS(cuIpcCloseMemHandle)
TS_ALIAS(cuMemPoolExportToShareableHandle)
TS_ALIAS(cuMemPoolImportFromShareableHandle)
TS_ALIAS(cuMemPoolImportPointer)
