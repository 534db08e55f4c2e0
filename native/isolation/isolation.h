/* Internal interfaces of libtessera-cuda.so (nothing here is exported). */
#ifndef TESSERA_ISOLATION_H
#define TESSERA_ISOLATION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera_cuda_types.h"

#define TS_MAX_DEVICES 32
#define TS_UUID_LEN 64
#define TS_PATH_LEN 4096

/* ---- logging (log.c) ---- */
enum { TS_LOG_OFF = -1, TS_LOG_ERROR = 0, TS_LOG_WARN = 1, TS_LOG_INFO = 2, TS_LOG_DEBUG = 3 };
extern int ts_log_level;
void ts_log_init(void);
/* The configuration variables as they were at load (envsnap.c): TESSERA_* and CUDA_VISIBLE_DEVICES. */
void ts_env_snapshot(void);
const char *ts_getenv(const char *name);
const char *const *ts_env_all(void); /* NULL-terminated "NAME=value" list */
void ts_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs at the default level the first time key is seen (refusals the user must see once). */
void ts_log_once(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TS_DEBUG(...) do { if (ts_log_level >= TS_LOG_DEBUG) ts_log(TS_LOG_DEBUG, __VA_ARGS__); } while (0)
#define TS_INFO(...) do { if (ts_log_level >= TS_LOG_INFO) ts_log(TS_LOG_INFO, __VA_ARGS__); } while (0)

/* ---- configuration (config.c) ---- */
enum { TS_MODE_PASSTHROUGH = 0, TS_MODE_LIMITED = 1, TS_MODE_FAILED = 2 };

typedef struct {
    int index;              /* visible CUDA index, -1 when the entry is keyed by UUID only */
    char uuid[TS_UUID_LEN]; /* "" when keyed by index only */
    uint64_t request;
    uint64_t limit;
} ts_entry;

typedef struct {
    int mode;
    int from_file;
    char source[TS_PATH_LEN]; /* file path, or "environment" */
    char error[1024];         /* why mode is TS_MODE_FAILED */
    int n_entries;
    ts_entry entries[TS_MAX_DEVICES];
    int has_default;          /* TESSERA_GPU_MEMORY_LIMIT: every device without its own entry */
    uint64_t default_limit;
    uint64_t context_overhead;
    char region[TS_PATH_LEN]; /* "" = private to this process */
} ts_config;

#define TS_DEFAULT_CONFIG_DIR "/etc/tessera"
#define TS_DEFAULT_CONFIG_PATH TS_DEFAULT_CONFIG_DIR "/gpu-isolation.conf"

void ts_config_load(ts_config *cfg);
/* Kubernetes quantity ("8G", "8Gi", "500M", "1e9", plain bytes) to bytes; 0 on error. */
int ts_parse_quantity(const char *text, uint64_t *out);
/* The entry that applies to a device, or NULL: by UUID first, then by index. */
const ts_entry *ts_config_match(const ts_config *cfg, int index, const char *uuid);

/* ---- descriptors the program could close under us (fdguard.c) ---- */
typedef struct {
    int fd;
    uint64_t dev, ino;
    char path[TS_PATH_LEN];
} ts_fd;
void ts_fd_remember(ts_fd *f, int fd, const char *path);
/* The descriptor, checked to still name the same file (reopened by path if not); -1: none. */
int ts_fd_get(ts_fd *f);

/* ---- shared region (region.c) ---- */
int ts_region_attach(const char *path, char *err, size_t errlen); /* path "" = private */
void ts_region_detach_after_fork(void);
int ts_region_device(const char *key, uint64_t limit); /* region device index, -1, or -2: lock busy */
int ts_region_find_device(const char *key);                       /* without registering */
uint64_t ts_region_limit(int rdev); /* the workload's limit for the device: the first writer's */
/* 1 if reserved, 0 if it would exceed limit, -1 on region failure. */
int ts_region_reserve(int rdev, uint64_t size, uint64_t limit);
void ts_region_release(int rdev, uint64_t size);
uint64_t ts_region_used(int rdev);                                 /* after reclaiming the dead */

/* ---- loans of dynamic fractions (loans.c; /work/notes/loans-hooks.md) ---- */
int ts_loans_configure(char *rest, char *err, size_t errlen); /* the `loans` line; 1 ok, 0 err */
void ts_loans_device(int rdev, int ordinal, const char *uuid, uint64_t request, uint64_t limit);
int ts_loans_reserve(int rdev, uint64_t size); /* 1 charged, 0 refused; may wait for a reclaim */
void ts_loans_release(int rdev, uint64_t size);
/* After a driver CUDA_ERROR_OUT_OF_MEMORY: 1 (having slept a little) while this thread's last
 * reservation waited for a reclaim and its wait has time left, so the caller calls the driver
 * again — a killed process's memory is freed by the driver a moment after the process ends. */
int ts_loans_retry_driver(int rdev);
void ts_loans_detach_after_fork(void);

/* ---- process-local tables (table.c) ---- */
typedef struct {
    uint64_t key;
    uint64_t size;
    int32_t rdev;   /* region device index */
    int32_t ordinal;
    int32_t kind;   /* TS_KIND_* */
    int32_t refs;   /* VMM handles: handle references + live mappings */
    uint64_t aux;   /* VMM mappings: the handle mapped there */
} ts_record;

/* TS_KIND_PINNED: a VMM allocation exported to other processes (hooks_share.c): charged until exit. */
enum { TS_KIND_SYNC = 0, TS_KIND_ASYNC = 1, TS_KIND_OTHER = 2, TS_KIND_POOL = 3, TS_KIND_PINNED = 4 };

typedef struct {
    ts_record *slots;
    size_t cap, count, tombstones;
} ts_table;

int ts_table_put(ts_table *t, uint64_t key, uint64_t size, int rdev, int ordinal, int kind);
int ts_table_take(ts_table *t, uint64_t key, ts_record *out);
int ts_table_put_record(ts_table *t, const ts_record *r);
/* The record of key, valid until the table next changes; NULL if absent. */
ts_record *ts_table_find(ts_table *t, uint64_t key);
/* Removes the first record whose key lies in [lo, hi); returns 1 if one was removed. */
int ts_table_take_range(ts_table *t, uint64_t lo, uint64_t hi, ts_record *out);
void ts_table_clear(ts_table *t);
/* Removes every record of one CUDA ordinal and kind; adds their bytes per region device to sums. */
void ts_table_drop_ordinal(ts_table *t, int ordinal, int kind, uint64_t sums[TS_MAX_DEVICES]);

/* ---- charged device pointers, sharded by address (ptrs.c) ---- */
int ts_ptrs_put(const ts_record *r);
int ts_ptrs_take(uint64_t key, ts_record *out);
void ts_ptrs_drop_ordinal(int ordinal, int kind, uint64_t sums[TS_MAX_DEVICES]);
void ts_ptrs_fork_prepare(void);
void ts_ptrs_fork_parent(void);
void ts_ptrs_fork_child(void);

#endif
