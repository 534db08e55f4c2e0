/*
 * NVML hooks: nvidia-smi and monitoring libraries inside the workload see the limit as the
 * device's memory and the workload's own usage (all its processes, from the shared region).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"

typedef nvmlReturn_t (*mem_v1_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*mem_v2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*uuid_fn)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*index_fn)(nvmlDevice_t, unsigned int *);

/* The CUDA-visible index of an NVML device under CUDA_VISIBLE_DEVICES, or -1 if hidden. */
static int visible_index(int nvml_index, const char *uuid) {
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES"); /* live: the driver reads it live at cuInit */
    if (!cvd) return nvml_index;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", cvd);
    int pos = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), pos++) {
        while (isspace((unsigned char)*tok)) tok++;
        if (isdigit((unsigned char)*tok)) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (*end != '\0' && !isspace((unsigned char)*end)) break;
            if (v == nvml_index) return pos;
        } else if (strncmp(tok, "GPU-", 4) == 0 || strncmp(tok, "MIG-", 4) == 0) {
            if (uuid && strncmp(uuid, tok, strlen(tok)) == 0) return pos;
        } else {
            break; /* CUDA stops at the first entry it cannot parse */
        }
    }
    return -1;
}

typedef struct {
    uint64_t total, used, free;
} view;

/* Fills the workload's view of a device; 0 if it is not limited (report what NVML says). */
static int workload_view(nvmlDevice_t dev, uint64_t phys_total, uint64_t phys_free, view *v) {
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return 0;
    if (mode == TS_MODE_FAILED) {
        *v = (view){0, 0, 0};
        return 1;
    }
    char uuid[96] = "";
    unsigned int nvml_index = 0;
    int have_index = 0;
    if (ts_real.nvmlDeviceGetUUID) ((uuid_fn)ts_real.nvmlDeviceGetUUID)(dev, uuid, sizeof uuid);
    if (ts_real.nvmlDeviceGetIndex)
        have_index = ((index_fn)ts_real.nvmlDeviceGetIndex)(dev, &nvml_index) == NVML_SUCCESS;
    int vis = have_index ? visible_index((int)nvml_index, uuid) : -1;
    const ts_entry *e = ts_config_match(&ts_cfg, vis, uuid);
    uint64_t limit;
    if (e) limit = e->limit;
    else if (ts_cfg.from_file) limit = 0;
    else if (ts_cfg.has_default) limit = ts_cfg.default_limit;
    else return 0;
    int rdev = uuid[0] ? ts_region_find_device(uuid) : -1;
    if (rdev < 0 && vis >= 0) {
        char key[32];
        snprintf(key, sizeof key, "index-%d", vis);
        rdev = ts_region_find_device(key);
    }
    uint64_t used = rdev >= 0 ? ts_region_used(rdev) : 0;
    v->total = limit < phys_total ? limit : phys_total;
    v->used = used < v->total ? used : v->total;
    v->free = v->total - v->used;
    if (phys_free < v->free) v->free = phys_free;
    return 1;
}

nvmlReturn_t ts_hook_nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    if (ts_bind(TS_LIB_NVML) != 0 || !ts_real.nvmlDeviceGetMemoryInfo) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = ((mem_v1_fn)ts_real.nvmlDeviceGetMemoryInfo)(dev, m);
    view v;
    if (rc != NVML_SUCCESS || !m || !workload_view(dev, m->total, m->free, &v)) return rc;
    m->total = v.total;
    m->used = v.used;
    m->free = v.free;
    return rc;
}

nvmlReturn_t ts_hook_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    if (ts_bind(TS_LIB_NVML) != 0 || !ts_real.nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = ((mem_v2_fn)ts_real.nvmlDeviceGetMemoryInfo_v2)(dev, m);
    view v;
    if (rc != NVML_SUCCESS || !m || !workload_view(dev, m->total, m->free, &v)) return rc;
    m->total = v.total;
    m->reserved = 0;
    m->used = v.used;
    m->free = v.free;
    return rc;
}

TS_ALIAS(nvmlDeviceGetMemoryInfo)
TS_ALIAS(nvmlDeviceGetMemoryInfo_v2)
