#define _GNU_SOURCE
#include "fake_devices.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static fake_device g_devices[FAKE_MAX_DEVICES];
static int g_count;
static uint64_t g_context_bytes;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_visible[FAKE_MAX_DEVICES];
static int g_visible_count;

static uint64_t parse_size(const char *text, int *ok) {
    char *end = NULL;
    *ok = 0;
    while (isspace((unsigned char)*text)) text++;
    if (!isdigit((unsigned char)*text)) return 0;
    unsigned long long value = strtoull(text, &end, 10);
    uint64_t mult = 1;
    if (strncmp(end, "Ki", 2) == 0) { mult = 1ULL << 10; end += 2; }
    else if (strncmp(end, "Mi", 2) == 0) { mult = 1ULL << 20; end += 2; }
    else if (strncmp(end, "Gi", 2) == 0) { mult = 1ULL << 30; end += 2; }
    else if (strncmp(end, "Ti", 2) == 0) { mult = 1ULL << 40; end += 2; }
    else if (*end == 'K' || *end == 'k') { mult = 1000ULL; end++; }
    else if (*end == 'M') { mult = 1000ULL * 1000; end++; }
    else if (*end == 'G') { mult = 1000ULL * 1000 * 1000; end++; }
    else if (*end == 'T') { mult = 1000ULL * 1000 * 1000 * 1000; end++; }
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') return 0;
    *ok = 1;
    return (uint64_t)value * mult;
}

static void add_device(const char *name, uint64_t total) {
    if (g_count >= FAKE_MAX_DEVICES) return;
    fake_device *d = &g_devices[g_count];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->total = total;
    unsigned char *u = d->uuid;
    u[0] = 'f'; u[1] = 'a'; u[2] = 'k'; u[3] = 'e';
    for (int i = 4; i < 16; i++) u[i] = (unsigned char)(g_count * 37 + i * 11 + 5);
    snprintf(d->uuid_str, sizeof d->uuid_str,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
    char key[32];
    d->index = g_count;
    snprintf(key, sizeof key, "FAKE_GPU_MIG_%d", g_count);
    d->mig = getenv(key) && strcmp(getenv(key), "1") == 0;
    snprintf(key, sizeof key, "FAKE_GPU_UTIL_%d", g_count);
    d->util = getenv(key) ? atoi(getenv(key)) : -1;
    if (d->util > 100) d->util = 100;
    snprintf(key, sizeof key, "FAKE_GPU_USED_%d", g_count);
    const char *used = getenv(key);
    if (used) {
        int ok;
        uint64_t v = parse_size(used, &ok);
        if (ok) d->other_used = v;
    }
    g_count++;
}

/* FAKE_GPU_UUIDS="GPU-...,GPU-...": the UUIDs of devices 0, 1, ... (one simulated machine per
 * node gets its own); entries that are not GPU-<32 hex digits in 8-4-4-4-12> are ignored. */
static void apply_uuids(void) {
    const char *list = getenv("FAKE_GPU_UUIDS");
    if (!list || !*list) return;
    char *copy = strdup(list), *save = NULL;
    int i = 0;
    for (char *t = strtok_r(copy, ",", &save); t && i < g_count; t = strtok_r(NULL, ",", &save), i++) {
        while (isspace((unsigned char)*t)) t++;
        unsigned char bytes[16];
        int n = 0, ok = strncmp(t, "GPU-", 4) == 0 && strlen(t) == 40;
        for (const char *c = t + 4; ok && *c && n < 16; c++) {
            if (*c == '-') continue;
            if (!isxdigit((unsigned char)c[0]) || !isxdigit((unsigned char)c[1])) { ok = 0; break; }
            char hex[3] = {c[0], c[1], 0};
            bytes[n++] = (unsigned char)strtoul(hex, NULL, 16);
            c++;
        }
        if (!ok || n != 16) {
            fprintf(stderr, "fake driver: FAKE_GPU_UUIDS entry '%s' is not a GPU UUID; kept the default\n", t);
            continue;
        }
        memcpy(g_devices[i].uuid, bytes, 16);
        snprintf(g_devices[i].uuid_str, sizeof g_devices[i].uuid_str, "%s", t);
    }
    free(copy);
}

static void load(void) {
    const char *spec = getenv("FAKE_GPU_DEVICES");
    if (spec == NULL || *spec == '\0') spec = "NVIDIA H100 80GB HBM3=81559Mi";
    char *copy = strdup(spec);
    char *save = NULL;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char *eq = strrchr(item, '=');
        if (!eq) {
            fprintf(stderr, "fake driver: FAKE_GPU_DEVICES item '%s' needs NAME=SIZE\n", item);
            continue;
        }
        *eq = '\0';
        int ok;
        uint64_t total = parse_size(eq + 1, &ok);
        if (!ok || total == 0) {
            fprintf(stderr, "fake driver: bad size in FAKE_GPU_DEVICES item '%s'\n", item);
            continue;
        }
        add_device(item, total);
    }
    free(copy);
    apply_uuids();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        for (int i = 0; i < g_count; i++) g_visible[i] = i;
        g_visible_count = g_count;
    } else {
        char *list = strdup(cvd), *save2 = NULL;
        for (char *t = strtok_r(list, ",", &save2); t && g_visible_count < FAKE_MAX_DEVICES;
             t = strtok_r(NULL, ",", &save2)) {
            while (isspace((unsigned char)*t)) t++;
            int found = -1;
            if (isdigit((unsigned char)*t)) {
                char *end;
                long v = strtol(t, &end, 10);
                if (*end == '\0' && v >= 0 && v < g_count) found = (int)v;
            } else if (strncmp(t, "GPU-", 4) == 0) {
                for (int i = 0; i < g_count && found < 0; i++)
                    if (strncmp(g_devices[i].uuid_str, t, strlen(t)) == 0) found = i;
            }
            if (found < 0) break;
            g_visible[g_visible_count++] = found;
        }
        free(list);
    }
    const char *ctx = getenv("FAKE_GPU_CONTEXT_BYTES");
    if (ctx) {
        int ok;
        uint64_t v = parse_size(ctx, &ok);
        if (ok) g_context_bytes = v;
    }
}

int fake_devices_load(void) {
    pthread_once(&g_once, load);
    return g_count;
}

fake_device *fake_device_get(int index) {
    fake_devices_load();
    if (index < 0 || index >= g_count) return NULL;
    return &g_devices[index];
}

uint64_t fake_context_bytes(void) {
    fake_devices_load();
    return g_context_bytes;
}

int fake_cuda_count(void) {
    fake_devices_load();
    return g_visible_count;
}

fake_device *fake_cuda_device(int ordinal) {
    fake_devices_load();
    if (ordinal < 0 || ordinal >= g_visible_count) return NULL;
    return &g_devices[g_visible[ordinal]];
}

/* ---- cross-process state (FAKE_GPU_STATE) ---- */

typedef struct {
    uint64_t magic;
    uint64_t reserved[7];
    fake_proc slots[FAKE_STATE_SLOTS];
} state_file;

#define STATE_MAGIC 0x3174617473656b66ULL /* "fkstat1" */

static pthread_once_t g_state_once = PTHREAD_ONCE_INIT;
static state_file *g_state;
static int g_state_fd = -1;
static int g_slot = -1;
static int g_slot_pid;
static pthread_mutex_t g_state_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int g_lock_depth;

static void state_open(void) {
    const char *path = getenv("FAKE_GPU_STATE");
    if (!path || !*path) return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fake driver: FAKE_GPU_STATE %s: %s (no cross-process state)\n", path, strerror(errno));
        return;
    }
    flock(fd, LOCK_EX);
    struct stat st;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(state_file)) {
        if (ftruncate(fd, sizeof(state_file)) != 0) {
            flock(fd, LOCK_UN);
            close(fd);
            return;
        }
    }
    void *m = mmap(NULL, sizeof(state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        flock(fd, LOCK_UN);
        close(fd);
        return;
    }
    g_state = m;
    if (g_state->magic != STATE_MAGIC) {
        memset(g_state, 0, sizeof *g_state);
        g_state->magic = STATE_MAGIC;
    }
    flock(fd, LOCK_UN);
    g_state_fd = fd;
}

int fake_state_enabled(void) {
    pthread_once(&g_state_once, state_open);
    return g_state != NULL;
}

/* Alive and not a zombie: the driver frees a process's memory when it exits. The answer is
 * kept for 20 ms per pid, so the several NVML calls of one reading scan /proc once. */
static int pid_alive_uncached(int pid);
static int pid_alive(int pid) {
    enum { CACHE = 1024 };
    static __thread int c_pid[CACHE], c_alive[CACHE];
    static __thread long long c_at[CACHE];
    if (pid <= 0) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    int i = pid % CACHE;
    if (c_pid[i] == pid && now - c_at[i] < 20000000LL) return c_alive[i];
    c_pid[i] = pid;
    c_alive[i] = pid_alive_uncached(pid);
    c_at[i] = now;
    return c_alive[i];
}

static int pid_alive_uncached(int pid) {
    if (kill(pid, 0) != 0 && errno != EPERM) return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

void fake_state_lock(void) {
    if (!fake_state_enabled()) return;
    pthread_mutex_lock(&g_state_mu);
    if (g_lock_depth++ == 0) flock(g_state_fd, LOCK_EX);
}

void fake_state_unlock(void) {
    if (!fake_state_enabled()) return;
    if (--g_lock_depth == 0) flock(g_state_fd, LOCK_UN);
    pthread_mutex_unlock(&g_state_mu);
}

uint64_t fake_state_others(int phys) {
    if (!fake_state_enabled() || phys < 0 || phys >= FAKE_MAX_DEVICES) return 0;
    uint64_t sum = 0;
    int me = getpid();
    for (int s = 0; s < FAKE_STATE_SLOTS; s++) {
        fake_proc *p = &g_state->slots[s];
        int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (pid == 0 || pid == me || !pid_alive(pid)) continue;
        sum += __atomic_load_n(&p->used[phys], __ATOMIC_RELAXED);
    }
    return sum;
}

/* This process's slot (claimed on first use; a forked child claims its own). */
static fake_proc *own_slot(void) {
    int me = getpid();
    if (g_slot >= 0 && g_slot_pid == me) return &g_state->slots[g_slot];
    fake_state_lock();
    int found = -1;
    for (int s = 0; s < FAKE_STATE_SLOTS && found < 0; s++) {
        int pid = g_state->slots[s].pid;
        if (pid == 0 || pid == me || !pid_alive(pid)) found = s;
    }
    if (found >= 0) {
        fake_proc *p = &g_state->slots[found];
        memset(p->used, 0, sizeof p->used);
        const char *sm = getenv("FAKE_GPU_SM_UTIL");
        p->sm_util = sm ? (unsigned)atoi(sm) : 0;
        if (p->sm_util > 100) p->sm_util = 100;
        __atomic_store_n(&p->pid, me, __ATOMIC_RELEASE);
        g_slot = found;
        g_slot_pid = me;
    }
    fake_state_unlock();
    return found >= 0 ? &g_state->slots[found] : NULL;
}

void fake_state_add(int phys, int64_t delta) {
    if (!fake_state_enabled() || phys < 0 || phys >= FAKE_MAX_DEVICES || delta == 0) return;
    fake_proc *p = own_slot();
    if (!p) return;
    __atomic_add_fetch(&p->used[phys], (uint64_t)delta, __ATOMIC_RELEASE);
}

int fake_state_procs(fake_proc *out, int max) {
    if (!fake_state_enabled()) return 0;
    int n = 0;
    for (int s = 0; s < FAKE_STATE_SLOTS && n < max; s++) {
        fake_proc *p = &g_state->slots[s];
        int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (pid == 0 || !pid_alive(pid)) continue;
        fake_proc copy;
        copy.pid = pid;
        copy.sm_util = p->sm_util;
        int any = 0;
        for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
            copy.used[d] = __atomic_load_n(&p->used[d], __ATOMIC_RELAXED);
            any |= copy.used[d] != 0;
        }
        if (any) out[n++] = copy;
    }
    return n;
}
