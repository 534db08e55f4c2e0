/*
 * A fake libnvidia-ml.so.1 over the devices of fake_devices.c. Memory "used" is what other
 * processes hold (FAKE_GPU_USED_<i>): NVML reports device-wide numbers, and the fake has no
 * view of other processes' fake-CUDA allocations.
 */
#include <stdio.h>
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
    snprintf(version, length, "570.00.fake");
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
    *v = 12080;
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
    memory->total = d->total;
    memory->used = d->other_used > d->total ? d->total : d->other_used;
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
    memory->used = d->other_used;
    unsigned long long busy = reserved + d->other_used;
    memory->free = busy >= d->total ? 0 : d->total - busy;
    return NVML_SUCCESS;
}
