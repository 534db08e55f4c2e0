/*
 * A fake libnvidia-ml.so.1 over the devices of fake_devices.c. Memory "used" is what processes
 * outside the simulation hold (FAKE_GPU_USED_<i>) plus, with FAKE_GPU_STATE, what every live
 * fake-CUDA process of the simulated machine holds; those processes are listed with their memory
 * and SM utilisation (FAKE_GPU_SM_UTIL of each).
 *
 * Knobs (environment): FAKE_GPU_DEVICES, FAKE_GPU_UUIDS, FAKE_GPU_USED_<i>, FAKE_GPU_STATE (see
 * fake_devices.h); FAKE_GPU_MIG_<i>=1 (MIG mode on); FAKE_GPU_UTIL_<i> (device utilisation, else
 * the sum of its processes' SM utilisation, at most 100); FAKE_NVML_DRIVER_VERSION (default
 * 570.00.fake); FAKE_CUDA_DRIVER_VERSION (default 12080); FAKE_GPU_NVLINK=all|pairs (NVLink P2P
 * between every pair / between devices 2k and 2k+1; default none); topology: devices 2k and 2k+1
 * share a PCIe switch (SINGLE), devices in the same half share a NUMA node (NODE), else SYSTEM.
 * FAKE_NVML_HOST_PIDS=1: processes are listed by the PID the host sees (PID + 1000000), as NVML
 * lists them to a process inside a container with its own PID namespace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_devices.h"
#include "tessera_cuda_types.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    int index;
};

static struct nvmlDevice_st g_handles[FAKE_MAX_DEVICES];
static int g_init;

static fake_device *dev_of(nvmlDevice_t h) {
    if (h < &g_handles[0] || h >= &g_handles[FAKE_MAX_DEVICES]) return NULL;
    return fake_device_get(h->index);
}

/* Bytes in use on the device: other processes (FAKE_GPU_USED_<i>) + live fake-CUDA processes. */
static uint64_t device_used(fake_device *d) {
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = fake_state_procs(procs, FAKE_STATE_SLOTS);
    uint64_t sum = d->other_used;
    for (int i = 0; i < n; i++) sum += procs[i].used[d->index];
    return sum;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int n = fake_devices_load();
    for (int i = 0; i < n; i++) g_handles[i].index = i;
    g_init++;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (g_init == 0) return NVML_ERROR_UNINITIALIZED;
    g_init--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    const char *v = getenv("FAKE_NVML_DRIVER_VERSION");
    snprintf(version, length, "%s", v && *v ? v : "570.00.fake");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "12.570.00.fake");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    const char *env = getenv("FAKE_CUDA_DRIVER_VERSION");
    *v = env && *env ? atoi(env) : 12080;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)fake_devices_load();
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)fake_devices_load()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_handles[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fake_devices_load(); i++) {
        if (strcmp(fake_device_get(i)->uuid_str, uuid) == 0) {
            *device = &g_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!dev_of(device) || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(d->uuid_str) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", d->uuid_str);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !name) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(d->name) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, length, "%s", d->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t used = device_used(d);
    memory->total = d->total;
    memory->used = used > d->total ? d->total : used;
    memory->free = d->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != TESSERA_NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const unsigned long long reserved = 512ULL << 20;
    memory->total = d->total;
    memory->reserved = reserved;
    memory->used = device_used(d);
    unsigned long long busy = reserved + memory->used;
    memory->free = busy >= d->total ? 0 : d->total - busy;
    return NVML_SUCCESS;
}

/* ---- processes, utilisation, topology, MIG (what tessera-node reads) ---- */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

#define NVML_VALUE_NOT_AVAILABLE_U32 0xFFFFFFFFu

/* The live processes with memory on device d (at most max). */
static int procs_on(fake_device *d, fake_proc *out, int max) {
    fake_proc all[FAKE_STATE_SLOTS];
    int n = fake_state_procs(all, FAKE_STATE_SLOTS), k = 0;
    for (int i = 0; i < n && k < max; i++)
        if (all[i].used[d->index]) out[k++] = all[i];
    return k;
}

/* The PID NVML reports for a process (FAKE_NVML_HOST_PIDS: the host's, not the caller's). */
static unsigned reported_pid(int pid) {
    const char *h = getenv("FAKE_NVML_HOST_PIDS");
    return (unsigned)pid + (h && strcmp(h, "1") == 0 ? 1000000u : 0u);
}

static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, int v1) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = procs_on(d, procs, FAKE_STATE_SLOTS);
    if (*count < (unsigned)n) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *o = &((nvmlProcessInfo_v1_t *)infos)[i];
            o->pid = reported_pid(procs[i].pid);
            o->usedGpuMemory = procs[i].used[d->index];
        } else {
            nvmlProcessInfo_v2_t *o = &((nvmlProcessInfo_v2_t *)infos)[i];
            o->pid = reported_pid(procs[i].pid);
            o->usedGpuMemory = procs[i].used[d->index];
            o->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_U32;
            o->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_U32;
        }
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return running(device, count, infos, 0);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return running(device, count, infos, 0);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return running(device, count, infos, 1);
}
/* The fake has no graphics work: no process is listed. */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    (void)infos;
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!dev_of(device) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

static unsigned long long now_us(void);

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long lastSeen) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = procs_on(d, procs, FAKE_STATE_SLOTS);
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!samples || *count < (unsigned)n) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long ts = now_us();
    if (ts <= lastSeen) ts = lastSeen + 1;
    for (int i = 0; i < n; i++) {
        samples[i].pid = (unsigned)procs[i].pid;
        samples[i].timeStamp = ts;
        samples[i].smUtil = procs[i].sm_util;
        samples[i].memUtil = (unsigned)(procs[i].used[d->index] * 100 / d->total);
        samples[i].encUtil = 0;
        samples[i].decUtil = 0;
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !util) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned gpu = 0;
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = procs_on(d, procs, FAKE_STATE_SLOTS);
    for (int i = 0; i < n; i++) gpu += procs[i].sm_util;
    util->gpu = d->util >= 0 ? (unsigned)d->util : (gpu > 100 ? 100 : gpu);
    uint64_t used = device_used(d);
    util->memory = (unsigned)((used > d->total ? d->total : used) * 100 / d->total);
    return NVML_SUCCESS;
}

enum { TOPO_INTERNAL = 0, TOPO_SINGLE = 10, TOPO_MULTIPLE = 20, TOPO_HOSTBRIDGE = 30, TOPO_NODE = 40,
       TOPO_SYSTEM = 50 };

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *da = dev_of(a), *db = dev_of(b);
    if (!da || !db || !level) return NVML_ERROR_INVALID_ARGUMENT;
    int n = fake_devices_load(), half = (n + 1) / 2;
    if (da->index == db->index) *level = TOPO_INTERNAL;
    else if (da->index / 2 == db->index / 2) *level = TOPO_SINGLE;
    else if ((da->index < half) == (db->index < half)) *level = TOPO_NODE;
    else *level = TOPO_SYSTEM;
    return NVML_SUCCESS;
}

enum { P2P_OK = 0, P2P_NOT_SUPPORTED = 5 };
#define P2P_CAPS_INDEX_NVLINK 2

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *da = dev_of(a), *db = dev_of(b);
    if (!da || !db || !status) return NVML_ERROR_INVALID_ARGUMENT;
    const char *nv = getenv("FAKE_GPU_NVLINK");
    int linked = 0;
    if (nv && strcmp(nv, "all") == 0) linked = 1;
    else if (nv && strcmp(nv, "pairs") == 0) linked = da->index / 2 == db->index / 2;
    if (da->index == db->index) linked = 0;
    if (index == P2P_CAPS_INDEX_NVLINK) *status = linked ? P2P_OK : P2P_NOT_SUPPORTED;
    else *status = da->index == db->index ? P2P_NOT_SUPPORTED : P2P_OK;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = (unsigned)d->mig;
    *pending = (unsigned)d->mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)d->index;
    return NVML_SUCCESS;
}

/* Compute capability from the product name, as the real models report it. */
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    static const struct { const char *word; int major, minor; } table[] = {
        {"H100", 9, 0}, {"H200", 9, 0}, {"A100", 8, 0}, {"L4", 8, 9}, {"T4", 7, 5}, {"V100", 7, 0},
    };
    *major = 8;
    *minor = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strstr(d->name, table[i].word)) {
            *major = table[i].major;
            *minor = table[i].minor;
            break;
        }
    }
    return NVML_SUCCESS;
}

#include <time.h>
static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}
