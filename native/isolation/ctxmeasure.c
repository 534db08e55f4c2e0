/*
 * Context memory measured by the library itself (docs/isolation.md "Context memory").
 *
 * When neither the configuration file (`context-overhead`, written by tessera-node from its own
 * measurement) nor TESSERA_GPU_CONTEXT_OVERHEAD says what a CUDA context holds, the first context
 * a process creates on a device is measured through NVML, the driver's own view, in ways no other
 * process can distort (issue #28 class 3):
 *
 *   1. what NVML lists for this process's PID on the device right after the context exists;
 *   2. where NVML lists other PIDs (a container with its own PID namespace: NVML reports host
 *      PIDs), this process's entry is found by two probe allocations of random sizes (whole
 *      2 MiB pages, charged while they exist): the one entry that grew by exactly the first and
 *      then by exactly the second is this process, and what it listed before them is the
 *      context. Another tenant allocating or freeing meanwhile changes its own entry, not ours;
 *      no unique match means "not measured".
 *
 * The drop in the device's free memory across the creation is NOT a measurement: another
 * tenant's concurrent free makes it read low. It may only raise the charge above the default.
 * A reading above a quarter of the device, or none at all, means "not measured": the per-model
 * default stands. Never 0.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* What NVML lists on the device: n entries of (pid, bytes); -1 when it cannot list. */
static int list_procs(nvmlDevice_t dev, unsigned *pids, uint64_t *bytes) {
    unsigned int n = MAX_PROCS;
    if (ts_real.nvmlDeviceGetComputeRunningProcesses_v3) {
        proc_v2 procs[MAX_PROCS];
        typedef nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, proc_v2 *);
        if (((fn)ts_real.nvmlDeviceGetComputeRunningProcesses_v3)(dev, &n, procs) != NVML_SUCCESS) return -1;
        for (unsigned int i = 0; i < n && i < MAX_PROCS; i++) {
            pids[i] = procs[i].pid;
            bytes[i] = procs[i].usedGpuMemory;
        }
    } else if (ts_real.nvmlDeviceGetComputeRunningProcesses) {
        proc_v1 procs[MAX_PROCS];
        typedef nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, proc_v1 *);
        if (((fn)ts_real.nvmlDeviceGetComputeRunningProcesses)(dev, &n, procs) != NVML_SUCCESS) return -1;
        for (unsigned int i = 0; i < n && i < MAX_PROCS; i++) {
            pids[i] = procs[i].pid;
            bytes[i] = procs[i].usedGpuMemory;
        }
    } else {
        return -1;
    }
    return n > MAX_PROCS ? MAX_PROCS : (int)n;
}

static int find_pid(const unsigned *pids, int n, unsigned pid) {
    for (int i = 0; i < n; i++)
        if (pids[i] == pid) return i;
    return -1;
}

/* What NVML lists for this process on the device; 0 when it does not list this PID. */
static uint64_t own_bytes(nvmlDevice_t dev) {
    unsigned pids[MAX_PROCS];
    uint64_t bytes[MAX_PROCS];
    int n = list_procs(dev, pids, bytes);
    int i = n > 0 ? find_pid(pids, n, (unsigned)getpid()) : -1;
    return i >= 0 && bytes[i] != NOT_AVAILABLE ? bytes[i] : 0;
}

#define PROBE_PAGE (2ULL << 20)

typedef CUresult (*push_fn)(CUcontext);
typedef CUresult (*pop_fn)(CUcontext *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* This process's NVML entry, found by two probe allocations (see the top); its bytes before the
 * probes, or 0 when no single entry matches. The probes are charged on rdev while they exist. */
static uint64_t probe_match(nvmlDevice_t dev, CUcontext ctx, int rdev, uint64_t limit) {
    if (!ctx || !ts_real.cuMemAlloc_v2 || !ts_real.cuMemFree_v2 || !ts_real.cuCtxPushCurrent_v2 ||
        !ts_real.cuCtxPopCurrent_v2)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned seed = (unsigned)ts.tv_nsec ^ ((unsigned)getpid() << 16);
    uint64_t k1 = 1 + (uint64_t)(rand_r(&seed) % 8), k2 = 1 + (k1 + (uint64_t)(rand_r(&seed) % 7)) % 8;
    uint64_t s1 = k1 * PROBE_PAGE, s2 = k2 * PROBE_PAGE;
    static unsigned pids[3][MAX_PROCS];
    static uint64_t bytes[3][MAX_PROCS]; /* under ts_measure_mu */
    int n[3] = {-1, -1, -1};
    n[0] = list_procs(dev, pids[0], bytes[0]);
    if (n[0] <= 0) return 0; /* NVML lists nobody: nothing to match */
    if (rdev >= 0 && ts_region_reserve(rdev, s1 + s2, limit) != 1) return 0;
    CUdeviceptr p1 = 0, p2 = 0;
    if (((push_fn)ts_real.cuCtxPushCurrent_v2)(ctx) == CUDA_SUCCESS) {
        if (((alloc_fn)ts_real.cuMemAlloc_v2)(&p1, s1) == CUDA_SUCCESS) {
            n[1] = list_procs(dev, pids[1], bytes[1]);
            if (((alloc_fn)ts_real.cuMemAlloc_v2)(&p2, s2) == CUDA_SUCCESS) {
                n[2] = list_procs(dev, pids[2], bytes[2]);
                ((free_fn)ts_real.cuMemFree_v2)(p2);
            }
            ((free_fn)ts_real.cuMemFree_v2)(p1);
        }
        ((pop_fn)ts_real.cuCtxPopCurrent_v2)(NULL);
    }
    if (rdev >= 0) ts_region_release(rdev, s1 + s2);
    if (n[0] <= 0 || n[1] <= 0 || n[2] <= 0) return 0;
    uint64_t found = 0;
    int matches = 0;
    for (int i = 0; i < n[2]; i++) {
        int a = find_pid(pids[0], n[0], pids[2][i]), b = find_pid(pids[1], n[1], pids[2][i]);
        if (a < 0 || b < 0 || bytes[0][a] == NOT_AVAILABLE || bytes[1][b] == NOT_AVAILABLE ||
            bytes[2][i] == NOT_AVAILABLE)
            continue;
        if (bytes[1][b] - bytes[0][a] == s1 && bytes[2][i] - bytes[1][b] == s2) {
            matches++;
            found = bytes[0][a];
        }
    }
    return matches == 1 ? found : 0;
}

uint64_t ts_ctx_probe_after(ts_ctx_probe *p, int ordinal, CUcontext ctx, int rdev, uint64_t limit, int *exact,
                            const char **how) {
    uint64_t bytes = 0;
    *exact = 0;
    *how = p->why ? p->why : "no reading";
    if (p->ok) {
        bytes = own_bytes(p->dev);
        if (bytes) {
            *how = "NVML's memory of this process";
            *exact = 1;
        } else if ((bytes = probe_match(p->dev, ctx, rdev, limit)) != 0) {
            *how = "NVML's memory of this process, found by two probe allocations";
            *exact = 1;
        } else {
            uint64_t after;
            if (p->have_free && nvml_free(p->dev, &after) && after < p->free_before) {
                bytes = p->free_before - after;
                *how = "the drop in the device's free memory (a lower bound only: other processes can free meanwhile)";
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
        *exact = 0;
    }
    return bytes;
}
