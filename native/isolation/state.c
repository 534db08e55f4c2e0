/* Process state: configuration, devices, tracked allocations, fork handling. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "state.h"
#include "compute.h"

ts_config ts_cfg;
ts_dev ts_devs[TS_MAX_DEVICES];
pthread_mutex_t ts_tab_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t ts_measure_mu = PTHREAD_MUTEX_INITIALIZER;
ts_table ts_handles, ts_maps, ts_ctxs, ts_pools, ts_arrays;
int ts_primary_refs[TS_MAX_DEVICES];
int ts_custom_ctxs[TS_MAX_DEVICES];

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;
static int g_refusals;

int ts_mode(void) {
    if (__atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE)) return ts_cfg.mode;
    pthread_mutex_lock(&g_init_mu);
    if (!g_loaded) {
        ts_log_init();
        Dl_info self;
        if (ts_log_level >= TS_LOG_DEBUG && dladdr((void *)ts_mode, &self) && self.dli_fname)
            TS_DEBUG("loaded from %s", self.dli_fname); /* our own path: from dladdr, never assumed */
        ts_config_load(&ts_cfg);
        if (ts_cfg.mode == TS_MODE_LIMITED) {
            char err[sizeof ts_cfg.error];
            if (ts_region_attach(ts_cfg.region, err, sizeof err) != 0) {
                snprintf(ts_cfg.error, sizeof ts_cfg.error, "%s", err);
                ts_cfg.mode = TS_MODE_FAILED;
            }
        }
        if (ts_cfg.mode == TS_MODE_FAILED) {
            ts_log(TS_LOG_ERROR, "%s; every GPU memory allocation will be refused (fail closed)", ts_cfg.error);
        } else if (ts_cfg.mode == TS_MODE_LIMITED) {
            TS_INFO("limits from %s, region %s, context overhead %llu bytes", ts_cfg.source,
                    ts_cfg.region[0] ? ts_cfg.region : "(private)", (unsigned long long)ts_cfg.context_overhead);
            if (ts_cfg.has_default) TS_INFO("every device: limit %llu bytes", (unsigned long long)ts_cfg.default_limit);
            for (int i = 0; i < ts_cfg.n_entries; i++)
                TS_INFO("device index=%d uuid=%s: request %llu, limit %llu bytes", ts_cfg.entries[i].index,
                        ts_cfg.entries[i].uuid[0] ? ts_cfg.entries[i].uuid : "-",
                        (unsigned long long)ts_cfg.entries[i].request, (unsigned long long)ts_cfg.entries[i].limit);
        } else {
            TS_DEBUG("no limit configured: pass-through");
        }
        __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_init_mu);
    return ts_cfg.mode;
}

void ts_report_refusal(const char *what) {
    int n = __atomic_fetch_add(&g_refusals, 1, __ATOMIC_RELAXED);
    int level = n == 0 ? TS_LOG_ERROR : TS_LOG_DEBUG;
    if (level <= ts_log_level)
        ts_log(level, "%s refused: %s (fail closed)", what, ts_cfg.error);
}

void ts_format_uuid(const unsigned char *u, char *out, size_t len) {
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
typedef CUresult (*name_fn)(char *, int, CUdevice);
typedef CUresult (*total_fn)(size_t *, CUdevice);

/*
 * Bytes charged per CUDA context on a device: the configured context-overhead (tessera-node
 * measures it by creating a context on the real GPU), else — until the library has measured the
 * first context itself (ctxmeasure.c) and when it cannot — the default for the GPU's architecture
 * (the same table as tessera.core.gpu_models.default_headroom: CUDA 12 contexts hold roughly
 * 300-550 MiB), at most an eighth of the device, never 0.
 */
static uint64_t context_overhead(int ordinal) {
    if (ts_cfg.context_overhead > 0) return ts_cfg.context_overhead;
    static const struct { const char *token; unsigned mib; } models[] = {
        {"GH200", 512}, {"GB200", 512}, {"H100", 512}, {"H200", 512}, {"H800", 512}, {"B200", 512},
        {"A100", 448}, {"A800", 448}, {"A10", 448}, {"A30", 448}, {"A40", 448}, {"L40", 448}, {"L4", 448},
        {"V100", 320}, {"T4", 320},
    };
    unsigned mib = 512;
    char name[128] = "";
    if (ts_real.cuDeviceGetName && ((name_fn)ts_real.cuDeviceGetName)(name, (int)sizeof name - 1, ordinal) == CUDA_SUCCESS) {
        name[sizeof name - 1] = '\0';
        for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
            if (strstr(name, models[i].token)) {
                mib = models[i].mib;
                break;
            }
    }
    uint64_t bytes = (uint64_t)mib << 20;
    size_t total = 0;
    if (ts_real.cuDeviceTotalMem_v2 && ((total_fn)ts_real.cuDeviceTotalMem_v2)(&total, ordinal) == CUDA_SUCCESS &&
        total / 8 < bytes)
        bytes = total / 8;
    return bytes ? bytes : 1;
}

ts_dev *ts_device(int ordinal) {
    if (ordinal < 0 || ordinal >= TS_MAX_DEVICES) return NULL;
    ts_dev *d = &ts_devs[ordinal];
    if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) return d;
    pthread_mutex_lock(&g_init_mu);
    if (!d->ready) {
        d->uuid[0] = '\0';
        uuid_fn get = (uuid_fn)(ts_real.cuDeviceGetUuid_v2 ? ts_real.cuDeviceGetUuid_v2 : ts_real.cuDeviceGetUuid);
        CUuuid u;
        if (get && get(&u, ordinal) == CUDA_SUCCESS) ts_format_uuid((unsigned char *)u.bytes, d->uuid, sizeof d->uuid);
        d->ctx_overhead = context_overhead(ordinal);
        d->ctx_fixed = ts_cfg.context_overhead > 0; /* else measured at the first context */
        const ts_entry *e = ts_config_match(&ts_cfg, ordinal, d->uuid);
        d->rdev = -1;
        d->limited = 1;
        if (e) {
            d->limit = e->limit;
        } else if (ts_cfg.from_file) {
            d->limit = 0;
            ts_log(TS_LOG_ERROR, "device %d (%s) is not in %s; allocations on it are refused", ordinal,
                   d->uuid[0] ? d->uuid : "uuid unknown", ts_cfg.source);
        } else if (ts_cfg.has_default) {
            d->limit = ts_cfg.default_limit;
        } else {
            d->limited = 0;
        }
        if (d->limited) {
            char key[TS_UUID_LEN];
            if (d->uuid[0]) snprintf(key, sizeof key, "%s", d->uuid);
            else snprintf(key, sizeof key, "index-%d", ordinal);
            d->rdev = ts_region_device(key, d->limit);
            if (d->rdev == -2) { /* the region lock was not free in time: refuse now, retry later */
                d->rdev = -1;
                d->limit = 0;
                pthread_mutex_unlock(&g_init_mu);
                return d;
            }
            if (d->rdev < 0) d->limit = 0;
            else if (ts_region_limit(d->rdev) < d->limit) {
                /* Another process of the workload registered this device (by UUID) first, with a
                 * smaller limit: the smaller one holds (a reordered CUDA_VISIBLE_DEVICES or a
                 * rewritten variable never moves or raises a limit). */
                TS_INFO("device %d (%s): the workload's region holds a limit of %llu bytes, below this "
                        "process's %llu; the smaller applies", ordinal, key,
                        (unsigned long long)ts_region_limit(d->rdev), (unsigned long long)d->limit);
                d->limit = ts_region_limit(d->rdev);
            }
            if (d->rdev >= 0 && e) ts_loans_device(d->rdev, ordinal, d->uuid, e->request, e->limit);
            TS_DEBUG("device %d (%s): limit %llu bytes, region entry %d", ordinal, key,
                     (unsigned long long)d->limit, d->rdev);
        } else {
            TS_DEBUG("device %d (%s): no limit", ordinal, d->uuid[0] ? d->uuid : "uuid unknown");
        }
        __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_init_mu);
    return d;
}

static void prepare(void) {
    pthread_mutex_lock(&ts_measure_mu);
    ts_bind_lock();
    pthread_mutex_lock(&g_init_mu);
    pthread_mutex_lock(&ts_tab_mu);
    ts_ptrs_fork_prepare();
}

static void parent(void) {
    ts_ptrs_fork_parent();
    pthread_mutex_unlock(&ts_tab_mu);
    pthread_mutex_unlock(&g_init_mu);
    ts_bind_unlock();
    pthread_mutex_unlock(&ts_measure_mu);
}

static void child(void) {
    pthread_mutex_init(&ts_tab_mu, NULL);
    pthread_mutex_init(&g_init_mu, NULL);
    pthread_mutex_init(&ts_measure_mu, NULL);
    ts_bind_reinit();
    ts_region_detach_after_fork();
    ts_loans_detach_after_fork();
    ts_compute_after_fork();
    ts_ptrs_fork_child();
    ts_share_after_fork();
    ts_table_clear(&ts_handles);
    ts_table_clear(&ts_maps);
    ts_table_clear(&ts_arrays);
    ts_table_clear(&ts_ctxs);
    ts_table_clear(&ts_pools);
    memset(ts_devs, 0, sizeof ts_devs);
    memset(ts_primary_refs, 0, sizeof ts_primary_refs);
    memset(ts_custom_ctxs, 0, sizeof ts_custom_ctxs);
    g_loaded = 0;
    g_refusals = 0;
}

__attribute__((constructor)) static void ts_constructor(void) {
    ts_env_snapshot(); /* the configuration as it is at load, before main (envsnap.c) */
    ts_log_init();
    pthread_atfork(prepare, parent, child);
}
