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
static int g_context_set; /* FAKE_GPU_CONTEXT_BYTES given */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static fake_device *g_visible[FAKE_MAX_DEVICES];
static int g_visible_count;
static fake_device g_mig_view[FAKE_MAX_DEVICES]; /* MIG devices named in CUDA_VISIBLE_DEVICES */

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
    d->mig_gi = d->mig_ci = -1;
    snprintf(key, sizeof key, "FAKE_GPU_MIG_%d", g_count);
    int n_profiles = 0;
    fake_mig_profiles(d, &n_profiles);
    d->mig = n_profiles > 0 && getenv(key) && strcmp(getenv(key), "1") == 0;
    if (getenv(key) && strcmp(getenv(key), "1") == 0 && n_profiles == 0)
        fprintf(stderr, "fake driver: %s: %s has no MIG; the device stays whole\n", key, d->name);
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
        for (int i = 0; i < g_count; i++) g_visible[i] = &g_devices[i];
        g_visible_count = g_count;
    } else {
        char *list = strdup(cvd), *save2 = NULL;
        for (char *t = strtok_r(list, ",", &save2); t && g_visible_count < FAKE_MAX_DEVICES;
             t = strtok_r(NULL, ",", &save2)) {
            while (isspace((unsigned char)*t)) t++;
            fake_device *found = NULL;
            int phys;
            unsigned gi, ci;
            if (isdigit((unsigned char)*t)) {
                char *end;
                long v = strtol(t, &end, 10);
                if (*end == '\0' && v >= 0 && v < g_count) found = &g_devices[v];
            } else if (strncmp(t, "GPU-", 4) == 0) {
                for (int i = 0; i < g_count && !found; i++)
                    if (strncmp(g_devices[i].uuid_str, t, strlen(t)) == 0) found = &g_devices[i];
            } else if (strncmp(t, "MIG-", 4) == 0 && fake_mig_find(t, &phys, &gi, &ci)) {
                /* A MIG device: its GPU instance's memory, its own UUID, charged to the GPU. */
                fake_device *m = &g_mig_view[g_visible_count];
                *m = g_devices[phys];
                fake_state_lock();
                fake_gi *g = NULL;
                for (int k = 0; k < FAKE_MIG_MAX_GI; k++) {
                    fake_gi *x = &fake_mig_state_get()->gi[phys][k];
                    if (x->live && x->id == gi) g = x;
                }
                int n;
                const fake_mig_profile *table = fake_mig_profiles(m, &n);
                if (g) {
                    unsigned char bytes[16];
                    m->total = table[g->profile].memory_mib << 20;
                    fake_mig_uuid(m, g->ci_serial[ci], m->uuid_str, sizeof m->uuid_str, bytes);
                    memcpy(m->uuid, bytes, 16);
                }
                fake_state_unlock();
                m->other_used = 0;
                m->mig_gi = (int)gi;
                m->mig_ci = (int)ci;
                found = g ? m : NULL;
            }
            if (!found) break;
            g_visible[g_visible_count++] = found;
        }
        free(list);
    }
    const char *ctx = getenv("FAKE_GPU_CONTEXT_BYTES");
    if (ctx) {
        int ok;
        uint64_t v = parse_size(ctx, &ok);
        if (ok) {
            g_context_bytes = v;
            g_context_set = 1;
        }
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

/* What a CUDA context holds on device d, as NVML reports it in the process's memory (real NVML
 * does): FAKE_GPU_CONTEXT_BYTES when given (0 included), else what a CUDA 12 context holds on
 * that architecture (Hopper/Blackwell 512 MiB, Ampere/Ada 448 MiB, Volta/Turing 320 MiB, other
 * 512 MiB), at most an eighth of the device. */
uint64_t fake_context_bytes_on(const fake_device *d) {
    fake_devices_load();
    if (g_context_set || !d) return g_context_bytes;
    static const struct { const char *token; unsigned mib; } models[] = {
        {"GH200", 512}, {"GB200", 512}, {"H100", 512}, {"H200", 512}, {"H800", 512}, {"B200", 512},
        {"A100", 448}, {"A800", 448}, {"A10", 448}, {"A30", 448}, {"A40", 448}, {"L40", 448}, {"L4", 448},
        {"V100", 320}, {"T4", 320},
    };
    unsigned mib = 512;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strstr(d->name, models[i].token)) {
            mib = models[i].mib;
            break;
        }
    uint64_t bytes = (uint64_t)mib << 20;
    return d->total / 8 < bytes ? d->total / 8 : bytes;
}

int fake_cuda_count(void) {
    fake_devices_load();
    return g_visible_count;
}

fake_device *fake_cuda_device(int ordinal) {
    fake_devices_load();
    if (ordinal < 0 || ordinal >= g_visible_count) return NULL;
    return g_visible[ordinal];
}

/* ---- cross-process state (FAKE_GPU_STATE) ---- */

typedef struct {
    uint64_t magic;
    uint64_t reserved[7];
    fake_proc slots[FAKE_STATE_SLOTS];
    fake_mig_state mig;
    fake_memlimit_table memlimits; /* NVML per-cgroup memory limits (fake_memlimits.c) */
} state_file;

#define STATE_MAGIC 0x3274617473656b66ULL /* "fkstat2" */

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

/* This process's pid as the driver knows it: the host's, as real NVML reports it, also for a
 * process in a container's PID namespace (where getpid() says 1). The fake reads it from the
 * /proc it sees (/proc/self names the pid in the PID namespace /proc was mounted for: the
 * host's in the tests' pod processes, which share the host's /proc); the real driver knows it in
 * the kernel. Cached per process (a forked child looks again). */
const char *fake_host_proc(void) {
    const char *p = getenv("FAKE_HOST_PROC");
    return p && *p && strlen(p) < 256 ? p : "/proc";
}

int fake_self_pid(void) {
    static int cached_for = -1, cached = -1;
    int me = getpid();
    if (cached_for == me) return cached;
    char buf[32], self[300];
    snprintf(self, sizeof self, "%s/self", fake_host_proc());
    ssize_t n = readlink(self, buf, sizeof buf - 1);
    int pid = me;
    if (n > 0) {
        buf[n] = '\0';
        int v = atoi(buf);
        if (v > 0) pid = v;
    }
    cached_for = me;
    cached = pid;
    return pid;
}

/* Liveness by /proc alone (no kill(pid, 0)): the pids in the state file are the host's, which
 * kill() inside a PID namespace would not name. */
static int pid_alive_uncached(int pid) {
    char path[320], buf[256];
    snprintf(path, sizeof path, "%s/%d/stat", fake_host_proc(), pid);
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

static uint32_t mig_tag(const fake_device *d) {
    return d->mig_gi < 0 ? 0 : ((uint32_t)d->mig_gi << 8 | (uint32_t)d->mig_ci) + 1;
}

uint64_t fake_state_others_on(const fake_device *d) {
    if (d->mig_gi < 0) return fake_state_others(d->index);
    if (!fake_state_enabled()) return 0;
    uint64_t sum = 0;
    int me = fake_self_pid();
    for (int s = 0; s < FAKE_STATE_SLOTS; s++) {
        fake_proc *p = &g_state->slots[s];
        int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        uint32_t tag = __atomic_load_n(&p->mig[d->index], __ATOMIC_RELAXED);
        if (pid == 0 || pid == me || tag == 0 || (tag - 1) >> 8 != (uint32_t)d->mig_gi || !pid_alive(pid))
            continue;
        sum += __atomic_load_n(&p->used[d->index], __ATOMIC_RELAXED);
    }
    return sum;
}

uint64_t fake_state_others(int phys) {
    if (!fake_state_enabled() || phys < 0 || phys >= FAKE_MAX_DEVICES) return 0;
    uint64_t sum = 0;
    int me = fake_self_pid();
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
    int me = fake_self_pid();
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
        memset(p->mig, 0, sizeof p->mig);
        for (int v = 0; v < g_visible_count; v++)
            if (g_visible[v]->mig_gi >= 0) p->mig[g_visible[v]->index] = mig_tag(g_visible[v]);
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
            copy.mig[d] = __atomic_load_n(&p->mig[d], __ATOMIC_RELAXED);
            copy.used[d] = __atomic_load_n(&p->used[d], __ATOMIC_RELAXED);
            any |= copy.used[d] != 0;
        }
        if (any) out[n++] = copy;
    }
    return n;
}

/* ---- MIG ---- */

/* Starts as bit masks (bit s: memory slot s). */
#define S_ALL 0x7fu    /* 0..6 */
#define S_EVEN4 0x55u  /* 0, 2, 4, 6 */
#define S_EVEN3 0x15u  /* 0, 2, 4 */
#define S_HALF 0x11u   /* 0, 4 */
#define S_ZERO 0x01u   /* 0 */

/* NVML_GPU_INSTANCE_PROFILE_* and the profile ids the A100 and H100 report (nvidia-smi mig -lgip):
 * 1g (19), 1g+me (20), 1g with two memory slots (15), 2g (14), 3g (9), 4g (5), 7g (0). */
#define ROW(name, index, id, compute, slots, starts, count, sms, mib) \
    {name, index, id, compute, slots, starts, count, sms, mib}

static const fake_mig_profile A100_40[] = {
    ROW("1g.5gb", 0, 19, 1, 1, S_ALL, 7, 14, 4864),
    ROW("1g.5gb+me", 7, 20, 1, 1, S_ALL, 1, 14, 4864),
    ROW("1g.10gb", 9, 15, 1, 2, S_EVEN4, 4, 14, 9856),
    ROW("2g.10gb", 1, 14, 2, 2, S_EVEN3, 3, 28, 9856),
    ROW("3g.20gb", 2, 9, 3, 4, S_HALF, 2, 42, 19968),
    ROW("4g.20gb", 3, 5, 4, 4, S_ZERO, 1, 56, 19968),
    ROW("7g.40gb", 4, 0, 7, 8, S_ZERO, 1, 98, 40192),
};
static const fake_mig_profile A100_80[] = {
    ROW("1g.10gb", 0, 19, 1, 1, S_ALL, 7, 14, 9728),
    ROW("1g.10gb+me", 7, 20, 1, 1, S_ALL, 1, 14, 9728),
    ROW("1g.20gb", 9, 15, 1, 2, S_EVEN4, 4, 14, 19968),
    ROW("2g.20gb", 1, 14, 2, 2, S_EVEN3, 3, 28, 19968),
    ROW("3g.40gb", 2, 9, 3, 4, S_HALF, 2, 42, 40192),
    ROW("4g.40gb", 3, 5, 4, 4, S_ZERO, 1, 56, 40192),
    ROW("7g.80gb", 4, 0, 7, 8, S_ZERO, 1, 98, 80896),
};
static const fake_mig_profile H100_80[] = {
    ROW("1g.10gb", 0, 19, 1, 1, S_ALL, 7, 16, 9984),
    ROW("1g.10gb+me", 7, 20, 1, 1, S_ALL, 1, 16, 9984),
    ROW("1g.20gb", 9, 15, 1, 2, S_EVEN4, 4, 26, 20096),
    ROW("2g.20gb", 1, 14, 2, 2, S_EVEN3, 3, 32, 20096),
    ROW("3g.40gb", 2, 9, 3, 4, S_HALF, 2, 60, 40448),
    ROW("4g.40gb", 3, 5, 4, 4, S_ZERO, 1, 64, 40448),
    ROW("7g.80gb", 4, 0, 7, 8, S_ZERO, 1, 132, 81152),
};
static const fake_mig_profile H100_94[] = {
    ROW("1g.12gb", 0, 19, 1, 1, S_ALL, 7, 16, 11776),
    ROW("1g.12gb+me", 7, 20, 1, 1, S_ALL, 1, 16, 11776),
    ROW("1g.24gb", 9, 15, 1, 2, S_EVEN4, 4, 26, 23808),
    ROW("2g.24gb", 1, 14, 2, 2, S_EVEN3, 3, 32, 23808),
    ROW("3g.47gb", 2, 9, 3, 4, S_HALF, 2, 60, 47872),
    ROW("4g.47gb", 3, 5, 4, 4, S_ZERO, 1, 64, 47872),
    ROW("7g.94gb", 4, 0, 7, 8, S_ZERO, 1, 132, 95744),
};
static const fake_mig_profile H200_141[] = {
    ROW("1g.18gb", 0, 19, 1, 1, S_ALL, 7, 16, 16384),
    ROW("1g.18gb+me", 7, 20, 1, 1, S_ALL, 1, 16, 16384),
    ROW("1g.35gb", 9, 15, 1, 2, S_EVEN4, 4, 26, 32768),
    ROW("2g.35gb", 1, 14, 2, 2, S_EVEN3, 3, 32, 32768),
    ROW("3g.71gb", 2, 9, 3, 4, S_HALF, 2, 60, 65536),
    ROW("4g.71gb", 3, 5, 4, 4, S_ZERO, 1, 64, 65536),
    ROW("7g.141gb", 4, 0, 7, 8, S_ZERO, 1, 132, 143360),
};
#define N_ROWS 7

const fake_mig_profile *fake_mig_profiles(const fake_device *d, int *n) {
    uint64_t gib = d->total >> 30;
    const fake_mig_profile *t = NULL;
    if (strstr(d->name, "A100")) t = gib < 60 ? A100_40 : A100_80;
    else if (strstr(d->name, "H100")) t = gib < 88 ? H100_80 : H100_94;
    else if (strstr(d->name, "H200")) t = H200_141;
    *n = t ? N_ROWS : 0;
    return t;
}

static fake_mig_state g_local_mig; /* without FAKE_GPU_STATE: this process's own */

fake_memlimit_table *fake_memlimits_get(void) {
    return fake_state_enabled() ? &g_state->memlimits : NULL;
}

fake_mig_state *fake_mig_state_get(void) {
    return fake_state_enabled() ? &g_state->mig : &g_local_mig;
}

void fake_mig_uuid(const fake_device *d, uint64_t serial, char *out, size_t len, unsigned char b[16]) {
    /* The parent's UUID bytes stirred with the machine-wide serial of the compute instance: a
     * partition created again gets a new UUID, as on a real GPU. */
    uint64_t h = 0xcbf29ce484222325ULL ^ serial;
    for (int i = 0; i < 16; i++) {
        h = (h ^ d->uuid[i]) * 0x100000001b3ULL;
        b[i] = (unsigned char)(h >> 29);
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x50);
    snprintf(out, len, "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

int fake_mig_find(const char *uuid, int *phys, unsigned *gi, unsigned *ci) {
    int found = 0;
    fake_state_lock();
    fake_mig_state *st = fake_mig_state_get();
    for (int d = 0; d < g_count && !found; d++) {
        for (int k = 0; k < FAKE_MIG_MAX_GI && !found; k++) {
            fake_gi *g = &st->gi[d][k];
            if (!g->live) continue;
            for (int c = 0; c < FAKE_MIG_MAX_CI && !found; c++) {
                if (!g->ci_live[c]) continue;
                char text[48];
                unsigned char bytes[16];
                fake_mig_uuid(&g_devices[d], g->ci_serial[c], text, sizeof text, bytes);
                if (strcmp(text, uuid) == 0) {
                    *phys = d;
                    *gi = g->id;
                    *ci = (unsigned)c;
                    found = 1;
                }
            }
        }
    }
    fake_state_unlock();
    return found;
}

int fake_mig_mode(const fake_device *d) {
    const char *dir = getenv("FAKE_GPU_MIG_MODE_DIR");
    int n = 0;
    if (!dir || !*dir || !fake_mig_profiles(d, &n)) return d->mig;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", dir, d->index);
    FILE *f = fopen(path, "r");
    if (!f) return d->mig;
    int c = fgetc(f);
    fclose(f);
    return c == '1';
}
