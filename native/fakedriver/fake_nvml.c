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
 * FAKE_GPU_MIG_<i>=1 on an A100/H100/H200: MIG mode (GPU and compute instances in FAKE_GPU_STATE);
 * FAKE_GPU_MIG_MODE_DIR: the file DIR/<i> ("1"/"0"), where it exists, is the mode at each call.
 * FAKE_NVML_FAIL=FUNCTION=CODE,...: that MIG call fails with that NVML error.
 * FAKE_NVML_DRIVER_VERSION selects driver-branch behaviour: from 615.* the per-cgroup memory
 * limits (nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1, fake_memlimits.c) exist and
 * the fake CUDA enforces them; below, the calls are NVML_ERROR_FUNCTION_NOT_FOUND.
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
    int mig;          /* a MIG device handle: compute instance ci of GPU instance gi */
    unsigned gi, ci;
};

static struct nvmlDevice_st g_handles[FAKE_MAX_DEVICES];
static struct nvmlDevice_st g_mig_handles[FAKE_MAX_DEVICES][FAKE_MIG_IDS][FAKE_MIG_MAX_CI];
static int g_init;

static int is_mig_handle(nvmlDevice_t h) {
    return (const char *)h >= (const char *)g_mig_handles &&
           (const char *)h < (const char *)g_mig_handles + sizeof g_mig_handles;
}

static fake_device *dev_of(nvmlDevice_t h) {
    if (h < &g_handles[0] || h >= &g_handles[FAKE_MAX_DEVICES]) return NULL;
    return fake_device_get(h->index);
}

static int mig_of(nvmlDevice_t h, fake_device **parent, fake_gi *gi, const fake_mig_profile **p);
static void mig_uuid_of(fake_device *d, const fake_gi *g, unsigned ci, char *out, size_t len);
static uint64_t mig_used_bytes(fake_device *d, unsigned gi);

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
    for (int i = 0; i < FAKE_MAX_DEVICES; i++)
        for (int g = 0; g < FAKE_MIG_IDS; g++)
            for (int c = 0; c < FAKE_MIG_MAX_CI; c++)
                g_mig_handles[i][g][c] = (struct nvmlDevice_st){i, 1, (unsigned)g, (unsigned)c};
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
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
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
    int phys;
    unsigned gi, ci;
    if (strncmp(uuid, "MIG-", 4) == 0 && fake_mig_find(uuid, &phys, &gi, &ci)) {
        *device = &g_mig_handles[phys][gi][ci];
        return NVML_SUCCESS;
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
    fake_device *parent;
    fake_gi g;
    const fake_mig_profile *p;
    if (uuid && mig_of(device, &parent, &g, &p)) {
        char text[48];
        mig_uuid_of(parent, &g, device->ci, text, sizeof text);
        if (length < strlen(text) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
        snprintf(uuid, length, "%s", text);
        return NVML_SUCCESS;
    }
    fake_device *d = dev_of(device);
    if (!d || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(d->uuid_str) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", d->uuid_str);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *parent;
    fake_gi g;
    const fake_mig_profile *p;
    if (name && mig_of(device, &parent, &g, &p)) {
        char text[160];
        snprintf(text, sizeof text, "%s MIG %s", parent->name, p->name);
        if (length < strlen(text) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
        snprintf(name, length, "%s", text);
        return NVML_SUCCESS;
    }
    fake_device *d = dev_of(device);
    if (!d || !name) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(d->name) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, length, "%s", d->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *parent;
    fake_gi g;
    const fake_mig_profile *p;
    if (memory && mig_of(device, &parent, &g, &p)) {
        /* A MIG device: its GPU instance's memory and what the processes on it use. */
        uint64_t total = p->memory_mib << 20, used = mig_used_bytes(parent, g.id);
        memory->total = total;
        memory->used = used > total ? total : used;
        memory->free = total - memory->used;
        return NVML_SUCCESS;
    }
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
    fake_device *parent;
    fake_gi g;
    const fake_mig_profile *p;
    if (memory && mig_of(device, &parent, &g, &p)) {
        if (memory->version != TESSERA_NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        uint64_t total = p->memory_mib << 20, used = mig_used_bytes(parent, g.id);
        memory->total = total;
        memory->reserved = 0;
        memory->used = used > total ? total : used;
        memory->free = total - memory->used;
        return NVML_SUCCESS;
    }
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

static int procs_on_mig(fake_device *d, unsigned gi, int ci, fake_proc *out, int max);

static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, int v1) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    fake_gi g;
    const fake_mig_profile *p;
    int on_mig = !d && mig_of(device, &d, &g, &p);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = on_mig ? procs_on_mig(d, device->gi, (int)device->ci, procs, FAKE_STATE_SLOTS)
                   : procs_on(d, procs, FAKE_STATE_SLOTS);
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
            uint32_t tag = procs[i].mig[d->index];
            o->gpuInstanceId = tag ? (tag - 1) >> 8 : NVML_VALUE_NOT_AVAILABLE_U32;
            o->computeInstanceId = tag ? (tag - 1) & 0xff : NVML_VALUE_NOT_AVAILABLE_U32;
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
    int n;
    if (!fake_mig_profiles(d, &n)) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned)fake_mig_mode(d);
    *pending = (unsigned)fake_mig_mode(d);
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

/* ---- MIG: GPU instances, compute instances, MIG devices ----
 * The instances live in fake_devices.c's cross-process state; handles are per process and are
 * checked against that state on every call, so a handle to an instance another process destroyed
 * is refused (NVML_ERROR_INVALID_ARGUMENT), as a real handle becomes invalid. */

#define GI_PROFILE_COUNT 0x12 /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define CI_PROFILE_COUNT 0x9  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
#define GI_INFO_V2 ((unsigned)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
#define CI_INFO_V2 ((unsigned)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2u << 24)))

struct nvmlGpuInstance_st { int dev; unsigned id; };
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
struct nvmlComputeInstance_st { int dev; unsigned gi, id; };
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

static struct nvmlGpuInstance_st g_gi_handles[FAKE_MAX_DEVICES][FAKE_MIG_IDS];

/* FAKE_NVML_FAIL="FUNCTION=CODE,...": that MIG call fails with that NVML error in this process
 * (a driver error a test cannot otherwise provoke, e.g. a compute instance that cannot be made). */
static nvmlReturn_t injected(const char *fn) {
    const char *spec = getenv("FAKE_NVML_FAIL");
    size_t len = strlen(fn);
    for (const char *at = spec; at && *at;) {
        if (strncmp(at, fn, len) == 0 && at[len] == '=') return (nvmlReturn_t)atoi(at + len + 1);
        at = strchr(at, ',');
        if (at) at++;
    }
    return NVML_SUCCESS;
}
/* Changing MIG partitions needs the MIG config capability, which the NVIDIA container toolkit
 * gives only to a container with CAP_SYS_ADMIN (NVIDIA_MIG_CONFIG_DEVICES); without it the real
 * driver answers NVML_ERROR_NO_PERMISSION. The fake checks the caller's effective capability
 * set the same way, so an agent run without the chart's MIG opt-in fails as it would on a node. */
static int mig_config_denied(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 1;
    char line[256];
    unsigned long long eff = 0;
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1) { found = 1; break; }
    fclose(f);
    return !found || !(eff & (1ull << 21)); /* CAP_SYS_ADMIN */
}
static struct nvmlComputeInstance_st g_ci_handles[FAKE_MAX_DEVICES][FAKE_MIG_IDS][FAKE_MIG_MAX_CI];

/* Compute instance profiles NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE (ids 0..4). */
static const unsigned CI_SLICES[] = {1, 2, 3, 4, 7};
#define N_CI_PROFILES 5

static nvmlGpuInstance_t gi_handle(int dev, unsigned id) {
    g_gi_handles[dev][id] = (struct nvmlGpuInstance_st){dev, id};
    return &g_gi_handles[dev][id];
}

static nvmlComputeInstance_t ci_handle(int dev, unsigned gi, unsigned id) {
    g_ci_handles[dev][gi][id] = (struct nvmlComputeInstance_st){dev, gi, id};
    return &g_ci_handles[dev][gi][id];
}

static const fake_mig_profile *profile_by_id(fake_device *d, unsigned id) {
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    for (int i = 0; i < n; i++)
        if (t[i].id == id) return &t[i];
    return NULL;
}

/* The live GPU instance `id` of device dev (under the state lock), or NULL. */
static fake_gi *gi_find(int dev, unsigned id) {
    fake_mig_state *st = fake_mig_state_get();
    for (int k = 0; k < FAKE_MIG_MAX_GI; k++)
        if (st->gi[dev][k].live && st->gi[dev][k].id == id) return &st->gi[dev][k];
    return NULL;
}

static fake_gi *gi_of(nvmlGpuInstance_t h) {
    if ((const char *)h < (const char *)g_gi_handles ||
        (const char *)h >= (const char *)g_gi_handles + sizeof g_gi_handles)
        return NULL;
    if (!fake_device_get(h->dev)) return NULL;
    return gi_find(h->dev, h->id);
}

static int ci_valid(nvmlComputeInstance_t h) {
    if ((const char *)h < (const char *)g_ci_handles ||
        (const char *)h >= (const char *)g_ci_handles + sizeof g_ci_handles)
        return 0;
    if (!fake_device_get(h->dev) || h->id >= FAKE_MIG_MAX_CI) return 0;
    fake_gi *g = gi_find(h->dev, h->gi);
    return g && g->ci_live[h->id];
}

/* Live processes on GPU instance gi of device dev (ci < 0: any of its compute instances). */
static int procs_on_mig(fake_device *d, unsigned gi, int ci, fake_proc *out, int max) {
    fake_proc all[FAKE_STATE_SLOTS];
    int n = fake_state_procs(all, FAKE_STATE_SLOTS), k = 0;
    for (int i = 0; i < n && k < max; i++) {
        uint32_t tag = all[i].mig[d->index];
        if (tag == 0 || (tag - 1) >> 8 != gi) continue;
        if (ci >= 0 && ((tag - 1) & 0xff) != (unsigned)ci) continue;
        out[k++] = all[i];
    }
    return k;
}

/* Memory slots taken and compute slices used by the live GPU instances of device d. */
static void mig_used(fake_device *d, unsigned *slots_mask, unsigned *compute) {
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    *slots_mask = 0;
    *compute = 0;
    for (int k = 0; k < FAKE_MIG_MAX_GI; k++) {
        fake_gi *g = &fake_mig_state_get()->gi[d->index][k];
        if (!g->live) continue;
        *slots_mask |= ((1u << t[g->profile].slots) - 1) << g->start;
        *compute += t[g->profile].compute;
    }
}

static unsigned mig_count_of(fake_device *d, const fake_mig_profile *p) {
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    unsigned c = 0;
    for (int k = 0; k < FAKE_MIG_MAX_GI; k++) {
        fake_gi *g = &fake_mig_state_get()->gi[d->index][k];
        if (g->live && &t[g->profile] == p) c++;
    }
    return c;
}

/* Whether profile p fits at start now (under the lock). */
static int gi_fits(fake_device *d, const fake_mig_profile *p, unsigned start) {
    unsigned mask, compute;
    mig_used(d, &mask, &compute);
    unsigned want = ((1u << p->slots) - 1) << start;
    return !(mask & want) && compute + p->compute <= FAKE_MIG_COMPUTE && mig_count_of(d, p) < p->max_count;
}

static void fill_gi_info(const fake_mig_profile *p, unsigned *id, unsigned *p2p, unsigned *slices,
                         unsigned *count, unsigned *sms, unsigned *ce, unsigned *dec, unsigned *enc,
                         unsigned *jpeg, unsigned *ofa, unsigned long long *mib) {
    int me = strstr(p->name, "+me") != NULL || p->compute == 7;
    *id = p->id;
    *p2p = 0;
    *slices = p->compute;
    *count = p->max_count;
    *sms = p->sms;
    *ce = p->compute;
    *dec = me ? 5 : p->compute / 2;
    *enc = 0;
    *jpeg = me ? 1 : 0;
    *ofa = me ? 1 : 0;
    *mib = p->memory_mib;
}

/* The table row of NVML_GPU_INSTANCE_PROFILE_* `profile`, or an NVML error. */
static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned profile, const fake_mig_profile **out) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || profile >= GI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    if (!t || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < n; i++) {
        if (t[i].index == profile) {
            *out = &t[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info) {
    const fake_mig_profile *p = NULL;
    nvmlReturn_t r = gi_profile(device, profile, &p);
    if (r != NVML_SUCCESS) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    fill_gi_info(p, &info->id, &info->isP2pSupported, &info->sliceCount, &info->instanceCount,
                 &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount,
                 &info->encoderCount, &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_info_v2(const fake_mig_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info || info->version != GI_INFO_V2) return NVML_ERROR_INVALID_ARGUMENT;
    fill_gi_info(p, &info->id, &info->isP2pSupported, &info->sliceCount, &info->instanceCount,
                 &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount,
                 &info->encoderCount, &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info) {
    const fake_mig_profile *p = NULL;
    nvmlReturn_t r = gi_profile(device, profile, &p);
    return r != NVML_SUCCESS ? r : gi_info_v2(p, info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    return gi_info_v2(p, info);
}

/* Placements are listed whether MIG mode is on or not (as NVML documents). */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (unsigned s = 0; s < FAKE_MIG_SLOTS; s++) {
        if (!(p->starts & (1u << s))) continue;
        if (placements) placements[n] = (nvmlGpuInstancePlacement_t){s, p->slots};
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count) {
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

/* Creates the GPU instance at start (under the lock); the caller checked the placement. */
static nvmlReturn_t gi_create(fake_device *d, const fake_mig_profile *p, unsigned start, nvmlGpuInstance_t *out) {
    fake_mig_state *st = fake_mig_state_get();
    if (!gi_fits(d, p, start)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int slot = -1;
    for (int k = 0; k < FAKE_MIG_MAX_GI && slot < 0; k++)
        if (!st->gi[d->index][k].live) slot = k;
    unsigned id = 0;
    for (unsigned cand = 1; cand < FAKE_MIG_IDS && id == 0; cand++)
        if (!gi_find(d->index, cand)) id = cand;
    if (slot < 0 || id == 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    fake_gi *g = &st->gi[d->index][slot];
    memset(g, 0, sizeof *g);
    g->id = id;
    g->profile = (uint32_t)(p - t);
    g->start = start;
    __atomic_store_n(&g->live, 1, __ATOMIC_RELEASE);
    *out = gi_handle(d->index, id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gpuInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (mig_config_denied()) return NVML_ERROR_NO_PERMISSION;
    fake_device *d = dev_of(device);
    if (!d || !placement || !gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    if (injected("nvmlDeviceCreateGpuInstanceWithPlacement")) return injected("nvmlDeviceCreateGpuInstanceWithPlacement");
    int n;
    if (!fake_mig_profiles(d, &n) || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (placement->start >= FAKE_MIG_SLOTS || !(p->starts & (1u << placement->start)) ||
        placement->size != p->slots)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    nvmlReturn_t r = gi_create(d, p, placement->start, gpuInstance);
    fake_state_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                nvmlGpuInstance_t *gpuInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (mig_config_denied()) return NVML_ERROR_NO_PERMISSION;
    fake_device *d = dev_of(device);
    if (!d || !gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    if (!fake_mig_profiles(d, &n) || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    fake_state_lock();
    for (unsigned s = 0; s < FAKE_MIG_SLOTS && r != NVML_SUCCESS; s++)
        if ((p->starts & (1u << s)) && gi_fits(d, p, s)) r = gi_create(d, p, s, gpuInstance);
    fake_state_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    fake_state_lock();
    unsigned mask, compute, c = 0, have = mig_count_of(d, p);
    mig_used(d, &mask, &compute);
    for (unsigned s = 0; s < FAKE_MIG_SLOTS; s++) {
        unsigned want = ((1u << p->slots) - 1) << s;
        if (!(p->starts & (1u << s)) || (mask & want) || compute + p->compute > FAKE_MIG_COMPUTE ||
            have + c >= p->max_count)
            continue;
        mask |= want;
        compute += p->compute;
        c++;
    }
    fake_state_unlock();
    *count = c;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (mig_config_denied()) return NVML_ERROR_NO_PERMISSION;
    if (injected("nvmlGpuInstanceDestroy")) return injected("nvmlGpuInstanceDestroy");
    fake_state_lock();
    fake_gi *g = gi_of(gpuInstance);
    nvmlReturn_t r = NVML_SUCCESS;
    if (!g) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        fake_proc procs[1];
        int cis = 0;
        for (int c = 0; c < FAKE_MIG_MAX_CI; c++) cis += g->ci_live[c] != 0;
        if (cis > 0 || procs_on_mig(fake_device_get(gpuInstance->dev), g->id, -1, procs, 1) > 0)
            r = NVML_ERROR_IN_USE;
        else
            __atomic_store_n(&g->live, 0, __ATOMIC_RELEASE);
    }
    fake_state_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    const fake_mig_profile *t = fake_mig_profiles(d, &n);
    if (!t || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    const fake_mig_profile *p = profile_by_id(d, profileId);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    unsigned k = 0;
    for (int s = 0; s < FAKE_MIG_MAX_GI; s++) {
        fake_gi *g = &fake_mig_state_get()->gi[d->index][s];
        if (!g->live || &t[g->profile] != p) continue;
        if (gpuInstances) gpuInstances[k] = gi_handle(d->index, g->id);
        k++;
    }
    fake_state_unlock();
    if (k > 0 && !gpuInstances) return NVML_ERROR_INVALID_ARGUMENT;
    *count = k;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !gpuInstance || id >= FAKE_MIG_IDS) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    if (!fake_mig_profiles(d, &n) || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    fake_state_lock();
    fake_gi *g = gi_find(d->index, id);
    fake_state_unlock();
    if (!g) return NVML_ERROR_NOT_FOUND;
    *gpuInstance = gi_handle(d->index, id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    fake_gi *g = gi_of(gpuInstance);
    fake_gi copy;
    if (g) copy = *g;
    fake_state_unlock();
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    fake_device *d = fake_device_get(gpuInstance->dev);
    int n;
    const fake_mig_profile *p = &fake_mig_profiles(d, &n)[copy.profile];
    info->device = &g_handles[d->index];
    info->id = copy.id;
    info->profileId = p->id;
    info->placement = (nvmlGpuInstancePlacement_t){copy.start, p->slots};
    return NVML_SUCCESS;
}

/* The compute slices of GPU instance g. */
static unsigned gi_slices(int dev, const fake_gi *g) {
    int n;
    return fake_mig_profiles(fake_device_get(dev), &n)[g->profile].compute;
}

static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned profile, unsigned eng,
                               unsigned *slices, unsigned *gi_compute, unsigned *sms) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (profile >= CI_PROFILE_COUNT || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    fake_gi *g = gi_of(gpuInstance);
    fake_gi copy;
    if (g) copy = *g;
    fake_state_unlock();
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned c = gi_slices(gpuInstance->dev, &copy);
    if (profile >= N_CI_PROFILES || CI_SLICES[profile] > c) return NVML_ERROR_NOT_SUPPORTED;
    int n;
    const fake_mig_profile *p = &fake_mig_profiles(fake_device_get(gpuInstance->dev), &n)[copy.profile];
    *slices = CI_SLICES[profile];
    *gi_compute = c;
    *sms = p->sms * CI_SLICES[profile] / c;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info) {
    unsigned slices, c, sms;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &slices, &c, &sms);
    if (r != NVML_SUCCESS) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlComputeInstanceProfileInfo_t){profile, slices, c / slices, sms, c, 0, 0, 0, 0};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info) {
    unsigned slices, c, sms;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &slices, &c, &sms);
    if (r != NVML_SUCCESS) return r;
    if (!info || info->version != CI_INFO_V2) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = c / slices;
    info->multiprocessorCount = sms;
    info->sharedCopyEngineCount = c;
    if (slices == c) snprintf(info->name, sizeof info->name, "MIG %ug", c);
    else snprintf(info->name, sizeof info->name, "MIG %uc.%ug", slices, c);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (mig_config_denied()) return NVML_ERROR_NO_PERMISSION;
    if (!computeInstance || profileId >= CI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (injected("nvmlGpuInstanceCreateComputeInstance")) return injected("nvmlGpuInstanceCreateComputeInstance");
    fake_state_lock();
    nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    fake_gi *g = gi_of(gpuInstance);
    if (!g) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else if (profileId >= N_CI_PROFILES || CI_SLICES[profileId] > gi_slices(gpuInstance->dev, g)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    } else {
        unsigned c = gi_slices(gpuInstance->dev, g), want = CI_SLICES[profileId], taken = 0;
        int free_id = -1;
        for (int k = 0; k < FAKE_MIG_MAX_CI; k++) {
            if (g->ci_live[k]) taken |= ((1u << g->ci_slices[k]) - 1) << g->ci_start[k];
            else if (free_id < 0) free_id = k;
        }
        for (unsigned s = 0; s + want <= c && free_id >= 0 && r != NVML_SUCCESS; s += want) {
            if (taken & (((1u << want) - 1) << s)) continue;
            fake_mig_state *st = fake_mig_state_get();
            g->ci_slices[free_id] = want;
            g->ci_start[free_id] = s;
            g->ci_serial[free_id] = ++st->serial;
            __atomic_store_n(&g->ci_live[free_id], 1, __ATOMIC_RELEASE);
            *computeInstance = ci_handle(gpuInstance->dev, g->id, (unsigned)free_id);
            r = NVML_SUCCESS;
        }
    }
    fake_state_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (mig_config_denied()) return NVML_ERROR_NO_PERMISSION;
    fake_state_lock();
    nvmlReturn_t r = NVML_SUCCESS;
    if (!ci_valid(computeInstance)) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        fake_proc procs[1];
        fake_gi *g = gi_find(computeInstance->dev, computeInstance->gi);
        if (procs_on_mig(fake_device_get(computeInstance->dev), g->id, (int)computeInstance->id, procs, 1) > 0)
            r = NVML_ERROR_IN_USE;
        else
            __atomic_store_n(&g->ci_live[computeInstance->id], 0, __ATOMIC_RELEASE);
    }
    fake_state_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances, unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!count || profileId >= CI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (profileId >= N_CI_PROFILES) return NVML_ERROR_NOT_SUPPORTED;
    fake_state_lock();
    fake_gi *g = gi_of(gpuInstance);
    unsigned k = 0;
    for (int c = 0; g && c < FAKE_MIG_MAX_CI; c++) {
        if (!g->ci_live[c] || g->ci_slices[c] != CI_SLICES[profileId]) continue;
        if (computeInstances) computeInstances[k] = ci_handle(gpuInstance->dev, g->id, (unsigned)c);
        k++;
    }
    fake_state_unlock();
    if (!g || (k > 0 && !computeInstances)) return NVML_ERROR_INVALID_ARGUMENT;
    *count = k;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!computeInstance || id >= FAKE_MIG_MAX_CI) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    fake_gi *g = gi_of(gpuInstance);
    int live = g && g->ci_live[id];
    unsigned gid = g ? g->id : 0;
    fake_state_unlock();
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (!live) return NVML_ERROR_NOT_FOUND;
    *computeInstance = ci_handle(gpuInstance->dev, gid, id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    int ok = ci_valid(computeInstance);
    unsigned slices = 0, start = 0;
    if (ok) {
        fake_gi *g = gi_find(computeInstance->dev, computeInstance->gi);
        slices = g->ci_slices[computeInstance->id];
        start = g->ci_start[computeInstance->id];
    }
    fake_state_unlock();
    if (!ok) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned profile = 0;
    for (unsigned i = 0; i < N_CI_PROFILES; i++)
        if (CI_SLICES[i] == slices) profile = i;
    info->device = &g_handles[computeInstance->dev];
    info->gpuInstance = gi_handle(computeInstance->dev, computeInstance->gi);
    info->id = computeInstance->id;
    info->profileId = profile;
    info->placement = (nvmlComputeInstancePlacement_t){start, slices};
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(ci, info);
}

/* ---- MIG devices (one per compute instance), usable like device handles for some queries ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    *count = fake_mig_profiles(d, &n) && fake_mig_mode(d) ? FAKE_MIG_COMPUTE : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d = dev_of(device);
    if (!d || !migDevice) return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    if (!fake_mig_profiles(d, &n) || !fake_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= FAKE_MIG_COMPUTE) return NVML_ERROR_INVALID_ARGUMENT;
    /* MIG devices in the order of their GPU instance id, then compute instance id. */
    fake_state_lock();
    unsigned seen = 0;
    nvmlDevice_t found = NULL;
    for (unsigned id = 0; id < FAKE_MIG_IDS && !found; id++) {
        fake_gi *g = gi_find(d->index, id);
        for (unsigned c = 0; g && c < FAKE_MIG_MAX_CI && !found; c++)
            if (g->ci_live[c] && seen++ == index) found = &g_mig_handles[d->index][id][c];
    }
    fake_state_unlock();
    if (!found) return NVML_ERROR_NOT_FOUND;
    *migDevice = found;
    return NVML_SUCCESS;
}

/* What a MIG device handle names now: its parent, GPU instance (copied) and profile; 0 when the
 * handle is not a MIG device's or its compute instance is gone. */
static int mig_of(nvmlDevice_t h, fake_device **parent, fake_gi *gi, const fake_mig_profile **p) {
    if (!is_mig_handle(h)) return 0;
    fake_device *d = fake_device_get(h->index);
    if (!d) return 0;
    fake_state_lock();
    fake_gi *g = gi_find(h->index, h->gi);
    int ok = g && h->ci < FAKE_MIG_MAX_CI && g->ci_live[h->ci];
    if (ok) *gi = *g;
    fake_state_unlock();
    if (!ok) return 0;
    int n;
    *parent = d;
    *p = &fake_mig_profiles(d, &n)[gi->profile];
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!isMig || (!dev_of(device) && !is_mig_handle(device))) return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = is_mig_handle(device) ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d;
    fake_gi g;
    const fake_mig_profile *p;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (dev_of(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (!mig_of(device, &d, &g, &p)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d;
    fake_gi g;
    const fake_mig_profile *p;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (dev_of(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (!mig_of(device, &d, &g, &p)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    fake_device *d;
    fake_gi g;
    const fake_mig_profile *p;
    if (!device || !mig_of(migDevice, &d, &g, &p)) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_handles[d->index];
    return NVML_SUCCESS;
}

static void mig_uuid_of(fake_device *d, const fake_gi *g, unsigned ci, char *out, size_t len) {
    unsigned char bytes[16];
    fake_mig_uuid(d, g->ci_serial[ci], out, len, bytes);
}

/* Bytes the processes on GPU instance gi use (the memory its compute instances share). */
static uint64_t mig_used_bytes(fake_device *d, unsigned gi) {
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = procs_on_mig(d, gi, -1, procs, FAKE_STATE_SLOTS);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += procs[i].used[d->index];
    return sum;
}

/* ---- per-cgroup memory limits (r615+; fake_memlimits.c) ---- */
typedef struct {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit;
} fake_nvmlSetMemoryLimits_v1_t;
typedef struct {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit, currentUsed;
} fake_nvmlGetMemoryLimits_v1_t;

EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device,
                                                 fake_nvmlSetMemoryLimits_v1_t *limits) {
    if (fake_driver_branch() < FAKE_MEMLIMIT_MIN_BRANCH) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (is_mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    fake_device *d = dev_of(device);
    if (!d || !limits || !limits->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    return (nvmlReturn_t)fake_memlimit_set(d->index, limits->nameSpace, limits->softLimit,
                                           limits->hardLimit);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device,
                                                 fake_nvmlGetMemoryLimits_v1_t *limits) {
    if (fake_driver_branch() < FAKE_MEMLIMIT_MIN_BRANCH) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (is_mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    fake_device *d = dev_of(device);
    if (!d || !limits || !limits->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t soft, hard, used;
    int rc = fake_memlimit_get(d->index, limits->nameSpace, &soft, &hard, &used);
    if (rc == NVML_SUCCESS) {
        limits->softLimit = soft;
        limits->hardLimit = hard;
        limits->currentUsed = used;
    }
    return (nvmlReturn_t)rc;
}
