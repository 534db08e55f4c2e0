/*
 * Context memory measured by the library itself (docs/isolation.md "Context memory").
 *
 * When neither the configuration file (`context-overhead`, written by tessera-node from its own
 * measurement) nor TESSERA_GPU_CONTEXT_OVERHEAD says what a CUDA context holds, the first context
 * a process creates on a device is measured through NVML, the driver's own view:
 *
 *   1. what NVML lists for this process on the device right after the context exists (exact:
 *      other tenants do not disturb it) — found only where NVML's PIDs are this process's
 *      (not inside a container with its own PID namespace, where NVML reports host PIDs);
 *   2. else the drop in the device's free memory across the creation (NVML before and after).
 *
 * A reading of 0, one above a quarter of the device (another process allocated meanwhile) or no
 * NVML at all means "not measured": the per-model default stands. Never 0.
 */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "state.h"

typedef nvmlReturn_t (*init_fn)(void);
typedef nvmlReturn_t (*by_uuid_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef CUresult (*total_fn)(size_t *, CUdevice);

typedef struct { /* nvmlProcessInfo_v1_t (nvmlDeviceGetComputeRunningProcesses) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} proc_v1;
typedef struct { /* nvmlProcessInfo_v2_t (_v2 and _v3) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} proc_v2;

#define MAX_PROCS 256
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

static int nvml_free(nvmlDevice_t dev, uint64_t *out) {
    nvmlMemory_t m;
    if (!ts_real.nvmlDeviceGetMemoryInfo || ((mem_fn)ts_real.nvmlDeviceGetMemoryInfo)(dev, &m) != NVML_SUCCESS)
        return 0;
    *out = m.free;
    return 1;
}

void ts_ctx_probe_before(const char *uuid, ts_ctx_probe *p) {
    memset(p, 0, sizeof *p);
    if (!uuid || !uuid[0] || ts_bind(TS_LIB_NVML) != 0 || !ts_real.nvmlInit_v2 || !ts_real.nvmlDeviceGetHandleByUUID) {
        p->why = "NVML is not available";
        return;
    }
    if (((init_fn)ts_real.nvmlInit_v2)() != NVML_SUCCESS) {
        p->why = "nvmlInit failed";
        return;
    }
    p->initialized = 1;
    if (((by_uuid_fn)ts_real.nvmlDeviceGetHandleByUUID)(uuid, &p->dev) != NVML_SUCCESS) {
        p->why = "NVML does not know the device's UUID";
        return;
    }
    p->have_free = nvml_free(p->dev, &p->free_before);
    p->ok = 1;
}

/* What NVML lists for this process on the device; 0 when it does not list this PID. */
static uint64_t own_bytes(nvmlDevice_t dev) {
    unsigned int me = (unsigned int)getpid();
    unsigned int n = MAX_PROCS;
    if (ts_real.nvmlDeviceGetComputeRunningProcesses_v3) {
        proc_v2 procs[MAX_PROCS];
        typedef nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, proc_v2 *);
        if (((fn)ts_real.nvmlDeviceGetComputeRunningProcesses_v3)(dev, &n, procs) != NVML_SUCCESS) return 0;
        for (unsigned int i = 0; i < n && i < MAX_PROCS; i++)
            if (procs[i].pid == me && procs[i].usedGpuMemory != NOT_AVAILABLE) return procs[i].usedGpuMemory;
    } else if (ts_real.nvmlDeviceGetComputeRunningProcesses) {
        proc_v1 procs[MAX_PROCS];
        typedef nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, proc_v1 *);
        if (((fn)ts_real.nvmlDeviceGetComputeRunningProcesses)(dev, &n, procs) != NVML_SUCCESS) return 0;
        for (unsigned int i = 0; i < n && i < MAX_PROCS; i++)
            if (procs[i].pid == me && procs[i].usedGpuMemory != NOT_AVAILABLE) return procs[i].usedGpuMemory;
    }
    return 0;
}

uint64_t ts_ctx_probe_after(ts_ctx_probe *p, int ordinal, const char **how) {
    uint64_t bytes = 0;
    *how = p->why ? p->why : "no reading";
    if (p->ok) {
        bytes = own_bytes(p->dev);
        if (bytes) {
            *how = "NVML's memory of this process";
        } else {
            uint64_t after;
            if (p->have_free && nvml_free(p->dev, &after) && after < p->free_before) {
                bytes = p->free_before - after;
                *how = "the drop in the device's free memory";
            } else {
                *how = "NVML shows neither this process nor a drop in free memory";
            }
        }
    }
    if (p->initialized && ts_real.nvmlShutdown) ((init_fn)ts_real.nvmlShutdown)();
    p->initialized = 0;
    size_t total = 0;
    if (bytes && ts_real.cuDeviceTotalMem_v2 &&
        ((total_fn)ts_real.cuDeviceTotalMem_v2)(&total, ordinal) == CUDA_SUCCESS && bytes > total / 4) {
        *how = "the reading is above a quarter of the device (another process allocated meanwhile?)";
        bytes = 0;
    }
    return bytes;
}
