/*
 * The shared region: one file per workload, mapped by every process of the workload, holding
 * the per-device usage totals and one slot per process with what that process holds.
 *
 * Locking (survives a process killed at any instant):
 *  - charges and releases are lock-free (atomic updates in an order that can only over-count if
 *    the process dies in the middle; see reclaim_slot); taking a slot, registering a device and
 *    reclaiming dead processes' slots happen under a robust, process-shared pthread mutex stored
 *    in the file; if its owner dies, the next locker gets EOWNERDEAD and reclaims dead slots;
 *  - each process holds an open-file-description lock (F_OFD_SETLK) on the first byte of its
 *    slot; the kernel drops it when the process dies, so "is the owner alive" is answered by
 *    F_OFD_GETLK, immune to PID reuse and PID namespaces;
 *  - creation and first initialisation of the file happen under flock().
 * Layout (version 1, native endianness; docs/isolation.md, tessera/isolation/region.py):
 *   0    magic "TSRGN\0\0\1", u32 version, u32 slots_offset, u32 max_devices, u32 max_slots,
 *        u32 slot_size, u32 n_devices, u32 slot_hwm
 *   64   robust pthread mutex (64 bytes reserved)
 *   128  devices[32] { char key[64]; u64 limit; u64 used; }   (80 bytes each)
 *   4096 slots[1024] { i32 pid; u32 in_use; u64 used[32]; }   (264 bytes each)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "isolation.h"

#define REGION_MAGIC "TSRGN\0\0\1"
#define REGION_VERSION 1u
#define REGION_DEVICES 32
#define REGION_SLOTS 1024
#define DEVICES_OFFSET 128
#define SLOTS_OFFSET 4096

typedef struct {
    char key[64];
    uint64_t limit;
    uint64_t used;
} region_device;

typedef struct {
    int32_t pid;
    uint32_t in_use;
    uint64_t used[REGION_DEVICES];
} region_slot;

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t slots_offset;
    uint32_t max_devices;
    uint32_t max_slots;
    uint32_t slot_size;
    uint32_t n_devices;
    uint32_t slot_hwm;
    uint32_t mutex_size;
    int32_t holder_pid; /* pid of the process holding the mutex (0 when free); for messages only */
    char pad0[64 - 44];
    union {
        pthread_mutex_t mutex;
        char pad1[64];
    } lock;
    region_device devices[REGION_DEVICES];
} region_header;

_Static_assert(sizeof(region_device) == 80, "device layout");
_Static_assert(sizeof(region_slot) == 264, "slot layout");
_Static_assert(__builtin_offsetof(region_header, lock) == 64, "mutex offset");
_Static_assert(__builtin_offsetof(region_header, devices) == DEVICES_OFFSET, "devices offset");
_Static_assert(sizeof(region_header) <= SLOTS_OFFSET, "header size");

#define REGION_SIZE ((size_t)SLOTS_OFFSET + (size_t)REGION_SLOTS * sizeof(region_slot))

static region_header *g_hdr;
static region_slot *g_slots;
static int g_fd = -1;        /* -1: private (anonymous) region; use region_fd() */
static ts_fd g_fdg = {.fd = -1};
static int g_my_slot = -1;
static int g_fault_stall;    /* TESSERA_ISOLATION_FAULT=stall-in-lock[=BYTES] (tests only) */
static uint64_t g_fault_size;

/* A refusal sweeps for dead processes at most this often per process: a workload pressing on its
 * limit (an allocator retrying after OOM) must not pay a liveness check per slot every time. */
#define SWEEP_INTERVAL_NS 20000000LL
static long long g_last_sweep_ns;
static int g_swept;

static int sweep_due(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (g_swept && now - g_last_sweep_ns < SWEEP_INTERVAL_NS) return 0;
    g_swept = 1;
    g_last_sweep_ns = now;
    return 1;
}

static off_t slot_offset(int i) { return (off_t)SLOTS_OFFSET + (off_t)i * (off_t)sizeof(region_slot); }

/* The region's descriptor, checked to still name the region (fdguard.c); -1: private or lost. */
static int region_fd(void) { return g_fd < 0 ? -1 : ts_fd_get(&g_fdg); }

static int slot_alive(int i, int fd) {
    if (i == g_my_slot) return 1;
    if (fd < 0) return 1; /* private region (every slot is ours), or no descriptor: never reclaim on doubt */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_offset(i), .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return 1; /* cannot tell: never reclaim on doubt */
    return fl.l_type != F_UNLCK;
}

/*
 * Charges are lock-free (issue #28: no lock convoy between threads or processes). A charge adds
 * to the device total first (a compare-and-swap against the limit) and then to the process's
 * slot; a release takes from the slot first and then from the total. So at every instant a
 * process's slot is at most what it contributed to the total, and reclaiming a dead process's
 * slot (subtracting what the slot says) can only leave the total too high, never too low: a
 * process killed between its two updates over-counts (fails closed) until every process of the
 * workload is gone, when the next one to attach finds nobody alive and starts the totals afresh.
 * Sweeps run under the lock (one sweeper at a time); the slot is released before its bytes are
 * subtracted, so a sweeper killed in between also only over-counts.
 */
static void reclaim_slot(region_slot *s) {
    uint64_t used[REGION_DEVICES];
    for (int d = 0; d < REGION_DEVICES; d++) used[d] = __atomic_load_n(&s->used[d], __ATOMIC_ACQUIRE);
    TS_DEBUG("reclaiming the slot of dead process %d", s->pid);
    memset(s, 0, sizeof *s);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int d = 0; d < REGION_DEVICES; d++) {
        if (!used[d]) continue;
        uint64_t cur = __atomic_load_n(&g_hdr->devices[d].used, __ATOMIC_RELAXED);
        uint64_t next;
        do next = cur - (used[d] < cur ? used[d] : cur);
        while (!__atomic_compare_exchange_n(&g_hdr->devices[d].used, &cur, next, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED));
    }
}

/* Reclaims the slots of dead processes (caller holds the lock). */
static void sweep(int unused) {
    (void)unused;
    uint32_t hwm = g_hdr->slot_hwm > REGION_SLOTS ? REGION_SLOTS : g_hdr->slot_hwm;
    int fd = region_fd();
    for (uint32_t i = 0; i < hwm; i++) {
        region_slot *s = &g_slots[i];
        if (!s->in_use || slot_alive((int)i, fd)) continue;
        reclaim_slot(s);
    }
}

/*
 * The lock is held for microseconds. A holder that is stopped (SIGSTOP, a debugger, a frozen
 * cgroup) keeps it without dying, so EOWNERDEAD never comes: every wait is bounded
 * (TESSERA_ISOLATION_LOCK_TIMEOUT_MS, default 5000 ms); on timeout the caller refuses the
 * allocation with a message naming the holder. After one timeout, later waits are short (100 ms)
 * until the lock is taken again, so a workload is not slowed to one allocation per timeout.
 */
static long g_lock_timeout_ms = -1;
static int g_lock_stuck;

static long lock_timeout_ms(void) {
    if (g_lock_timeout_ms < 0) {
        const char *v = ts_getenv("TESSERA_ISOLATION_LOCK_TIMEOUT_MS");
        long t = 5000;
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end == '\0' && x > 0 && x <= 3600000) t = x;
        }
        g_lock_timeout_ms = t;
    }
    return g_lock_stuck ? (g_lock_timeout_ms < 100 ? g_lock_timeout_ms : 100) : g_lock_timeout_ms;
}

static int32_t g_pid; /* getpid() is a system call: cached, reset after fork */

static int32_t my_pid(void) {
    if (!g_pid) g_pid = (int32_t)getpid();
    return g_pid;
}

static int locked(int rc, long ms) {
    if (rc == EOWNERDEAD) {
        ts_log(TS_LOG_WARN, "a process died holding the shared region lock; recovering");
        sweep(1);
        pthread_mutex_consistent(&g_hdr->lock.mutex);
        rc = 0;
    }
    if (rc == ETIMEDOUT) {
        int holder = __atomic_load_n(&g_hdr->holder_pid, __ATOMIC_RELAXED);
        if (!g_lock_stuck || ts_log_level >= TS_LOG_DEBUG)
            ts_log(TS_LOG_ERROR, "the shared region lock has been held for more than %ld ms by process %d "
                   "(stopped?); processes of the workload that have not charged anything yet are refused until it is released (allocations of the others go on)", ms, holder);
        g_lock_stuck = 1;
        return -1;
    }
    if (rc != 0) {
        ts_log(TS_LOG_ERROR, "cannot lock the shared region: %s", strerror(rc));
        return -1;
    }
    if (g_lock_stuck) {
        ts_log(TS_LOG_ERROR, "the shared region lock is free again; allocations are charged as before");
        g_lock_stuck = 0;
    }
    __atomic_store_n(&g_hdr->holder_pid, my_pid(), __ATOMIC_RELAXED);
    return 0;
}

static int region_lock(void) {
    /* Fast path, uncontended: no clock read (some VM clock sources make it a system call). */
    int rc = pthread_mutex_trylock(&g_hdr->lock.mutex);
    if (rc != EBUSY) return locked(rc, 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    long ms = lock_timeout_ms();
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    do rc = pthread_mutex_timedlock(&g_hdr->lock.mutex, &deadline);
    while (rc == EINTR);
    return locked(rc, ms);
}

static void region_unlock(void) {
    __atomic_store_n(&g_hdr->holder_pid, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_hdr->lock.mutex);
}

static void init_header(region_header *h) {
    memset(h, 0, SLOTS_OFFSET);
    h->version = REGION_VERSION;
    h->slots_offset = SLOTS_OFFSET;
    h->max_devices = REGION_DEVICES;
    h->max_slots = REGION_SLOTS;
    h->slot_size = sizeof(region_slot);
    h->mutex_size = sizeof(pthread_mutex_t);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock.mutex, &a);
    pthread_mutexattr_destroy(&a);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(h->magic, REGION_MAGIC, 8);
}

static int check_header(const region_header *h, char *err, size_t errlen, const char *path) {
    if (h->version != REGION_VERSION || h->slots_offset != SLOTS_OFFSET || h->max_devices != REGION_DEVICES ||
        h->max_slots != REGION_SLOTS || h->slot_size != sizeof(region_slot) ||
        h->mutex_size != sizeof(pthread_mutex_t)) {
        snprintf(err, errlen, "shared region %s has an incompatible layout (version %u)", path, h->version);
        return -1;
    }
    return 0;
}

int ts_region_attach(const char *path, char *err, size_t errlen) {
    const char *fault = ts_getenv("TESSERA_ISOLATION_FAULT");
    /* stall-in-lock: at the first charge; stall-in-lock=BYTES: at a charge of exactly BYTES */
    g_fault_stall = fault && strncmp(fault, "stall-in-lock", 13) == 0 && (fault[13] == '\0' || fault[13] == '=');
    g_fault_size = g_fault_stall && fault[13] == '=' ? strtoull(fault + 14, NULL, 10) : 0;
    if (path[0] == '\0') {
        void *m = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            snprintf(err, errlen, "cannot map a private usage region: %s", strerror(errno));
            return -1;
        }
        g_hdr = m;
        g_slots = (region_slot *)((char *)m + SLOTS_OFFSET);
        g_fd = -1;
        init_header(g_hdr);
        return 0;
    }
    /* Created here: group-shareable (processes of one pod may run as several UIDs of one
     * group), never world-writable, whatever the umask. */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
    if (fd >= 0) fchmod(fd, 0660);
    else if (errno == EEXIST) fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open shared region %s: %s", path, strerror(errno));
        return -1;
    }
    int locked = -1;
    for (long waited = 0; waited <= lock_timeout_ms(); waited += 10) {
        locked = flock(fd, LOCK_EX | LOCK_NB);
        if (locked == 0 || (errno != EWOULDBLOCK && errno != EINTR)) break;
        struct timespec ten = {0, 10000000L};
        nanosleep(&ten, NULL);
    }
    if (locked != 0) {
        snprintf(err, errlen, "cannot lock shared region %s: %s", path,
                 errno == EWOULDBLOCK ? "another process holds it (stopped?)" : strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (st.st_size < (off_t)REGION_SIZE && ftruncate(fd, (off_t)REGION_SIZE) != 0)) {
        snprintf(err, errlen, "cannot size shared region %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map shared region %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    region_header *h = m;
    int rc = 0;
    if (memcmp(h->magic, REGION_MAGIC, 8) != 0) {
        int blank = 1;
        for (size_t i = 0; i < 8 && blank; i++) blank = h->magic[i] == 0;
        if (blank) init_header(h);
        else {
            snprintf(err, errlen, "%s is not a tessera shared region (unknown magic)", path);
            rc = -1;
        }
    } else {
        rc = check_header(h, err, errlen, path);
    }
    flock(fd, LOCK_UN);
    if (rc != 0) {
        munmap(m, REGION_SIZE);
        close(fd);
        return -1;
    }
    g_hdr = h;
    g_slots = (region_slot *)((char *)m + SLOTS_OFFSET);
    g_fd = fd;
    ts_fd_remember(&g_fdg, fd, path);
    return 0;
}

void ts_region_detach_after_fork(void) {
    /* The child shares the parent's open file description, and with it the slot lock: drop the
     * descriptor so the slot stays the parent's, and attach afresh when needed. */
    if (g_hdr) munmap(g_hdr, REGION_SIZE);
    if (g_fd >= 0 && ts_fd_get(&g_fdg) >= 0) close(g_fdg.fd);
    g_fdg.fd = -1;
    g_hdr = NULL;
    g_slots = NULL;
    g_fd = -1;
    g_my_slot = -1;
    g_swept = 0;
    g_pid = 0;
}

/* Nobody else of the workload is alive (and this process has charged nothing yet: charges need a
 * slot): whatever the totals say is left over by processes killed mid-update; start afresh. */
static void heal_if_alone(int mine, int fd) {
    if (fd < 0) return;
    uint32_t hwm = g_hdr->slot_hwm > REGION_SLOTS ? REGION_SLOTS : g_hdr->slot_hwm;
    for (uint32_t i = 0; i < hwm; i++)
        if ((int)i != mine && g_slots[i].in_use && slot_alive((int)i, fd)) return;
    for (uint32_t i = 0; i < hwm; i++) /* the dead ones' slots go with what they counted */
        if ((int)i != mine && g_slots[i].in_use) memset(&g_slots[i], 0, sizeof g_slots[i]);
    for (int d = 0; d < REGION_DEVICES; d++) __atomic_store_n(&g_hdr->devices[d].used, 0, __ATOMIC_RELEASE);
}

static int take_slot_locked(void) {
    int fd = region_fd();
    if (g_fd >= 0 && fd < 0) return -1; /* the region's descriptor is gone: no slot lock to take */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < REGION_SLOTS; i++) {
            region_slot *s = &g_slots[i];
            if (s->in_use) continue;
            if (fd >= 0) {
                struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_offset(i), .l_len = 1};
                if (fcntl(fd, F_OFD_SETLK, &fl) != 0) continue;
            }
            memset(s, 0, sizeof *s);
            s->pid = (int32_t)getpid();
            s->in_use = 1;
            heal_if_alone(i, fd);
            if ((uint32_t)i + 1 > g_hdr->slot_hwm) g_hdr->slot_hwm = (uint32_t)i + 1;
            g_my_slot = i;
            TS_DEBUG("took slot %d of the shared region", i);
            return 0;
        }
        sweep(0);
    }
    ts_log(TS_LOG_ERROR, "the shared region has no free process slot (%d processes)", REGION_SLOTS);
    return -1;
}

int ts_region_find_device(const char *key) {
    if (!g_hdr) return -1;
    uint32_t n = __atomic_load_n(&g_hdr->n_devices, __ATOMIC_ACQUIRE);
    if (n > REGION_DEVICES) n = REGION_DEVICES;
    for (uint32_t i = 0; i < n; i++)
        if (strncmp(g_hdr->devices[i].key, key, sizeof g_hdr->devices[i].key) == 0) return (int)i;
    return -1;
}

/*
 * The device's limit in the region is the first writer's (issue #28 class 5): a process that
 * registers a device keeps the limit found there, and the caller enforces the smaller of its own
 * and the region's. Only a writer that finds no live process of the workload attached (the
 * workload restarted, perhaps with a new limit) replaces it.
 */
int ts_region_device(const char *key, uint64_t limit) {
    if (!g_hdr) return -1;
    if (region_lock() != 0) return -2; /* try again on the next call */
    int idx = ts_region_find_device(key);
    if (idx < 0 && g_hdr->n_devices < REGION_DEVICES) {
        idx = (int)g_hdr->n_devices;
        snprintf(g_hdr->devices[idx].key, sizeof g_hdr->devices[idx].key, "%s", key);
        g_hdr->devices[idx].limit = limit;
        __atomic_store_n(&g_hdr->n_devices, g_hdr->n_devices + 1, __ATOMIC_RELEASE);
    } else if (idx >= 0 && g_hdr->devices[idx].limit != limit) {
        sweep(0);
        int others = 0;
        uint32_t hwm = g_hdr->slot_hwm > REGION_SLOTS ? REGION_SLOTS : g_hdr->slot_hwm;
        for (uint32_t i = 0; i < hwm && !others; i++) others = g_slots[i].in_use && (int)i != g_my_slot;
        if (!others) g_hdr->devices[idx].limit = limit;
    }
    region_unlock();
    if (idx < 0) ts_log(TS_LOG_ERROR, "the shared region has no room for device %s", key);
    return idx;
}

uint64_t ts_region_limit(int rdev) {
    if (!g_hdr || rdev < 0 || rdev >= REGION_DEVICES) return 0;
    return __atomic_load_n(&g_hdr->devices[rdev].limit, __ATOMIC_ACQUIRE);
}

static int attach_slot(void) {
    if (__atomic_load_n(&g_my_slot, __ATOMIC_ACQUIRE) >= 0) return 0;
    if (region_lock() != 0) return -1;
    int rc = g_my_slot >= 0 ? 0 : take_slot_locked();
    region_unlock();
    return rc;
}

/* The test fault: the charge of the given size is made under the lock, which is then held forever
 * with the total raised and the slot not (a half-made charge). */
static void fault_stall(region_device *d, uint64_t size) {
    if (region_lock() != 0) return;
    __atomic_fetch_add(&d->used, size, __ATOMIC_ACQ_REL);
    ssize_t w = write(STDERR_FILENO, "tessera-fault: stalled in lock\n", 31);
    (void)w;
    for (;;) pause();
}

static int region_reserve(int rdev, uint64_t size, uint64_t limit) {
    if (attach_slot() != 0) return -1;
    region_device *d = &g_hdr->devices[rdev];
    if (size > limit) return 0;
    if (g_fault_stall && (g_fault_size == 0 || g_fault_size == size)) fault_stall(d, size);
    uint64_t cur = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
    for (int swept = 0;;) {
        if (cur > limit - size) {
            /* Over the limit: dead processes may still be counted (at most one sweep per interval). */
            if (swept || !sweep_due() || region_lock() != 0) return 0;
            sweep(0);
            region_unlock();
            swept = 1;
            cur = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
            continue;
        }
        if (__atomic_compare_exchange_n(&d->used, &cur, cur + size, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) break;
    }
    __atomic_fetch_add(&g_slots[g_my_slot].used[rdev], size, __ATOMIC_RELEASE);
    return 1;
}

int ts_region_reserve(int rdev, uint64_t size, uint64_t limit) {
    if (!g_hdr || rdev < 0 || rdev >= REGION_DEVICES) return -1;
    /* Loans (loans.c) first: it may wait for a reclaim, so no region lock is held meanwhile. */
    int loan = ts_loans_reserve(rdev, size);
    if (loan != 1) return loan;
    int ok = region_reserve(rdev, size, limit);
    if (ok != 1) ts_loans_release(rdev, size);
    return ok;
}

void ts_region_release(int rdev, uint64_t size) {
    if (!g_hdr || rdev < 0 || rdev >= REGION_DEVICES || g_my_slot < 0) return;
    region_slot *s = &g_slots[g_my_slot];
    uint64_t cur = __atomic_load_n(&s->used[rdev], __ATOMIC_RELAXED), mine;
    do mine = size < cur ? size : cur;
    while (!__atomic_compare_exchange_n(&s->used[rdev], &cur, cur - mine, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    region_device *d = &g_hdr->devices[rdev];
    uint64_t tot = __atomic_load_n(&d->used, __ATOMIC_RELAXED), sub;
    do sub = mine < tot ? mine : tot;
    while (!__atomic_compare_exchange_n(&d->used, &tot, tot - sub, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    ts_loans_release(rdev, mine);
}

uint64_t ts_region_used(int rdev) {
    if (!g_hdr || rdev < 0 || rdev >= REGION_DEVICES) return 0;
    /* Sweeps for the dead when the lock is free; never waits for it (a stopped holder). */
    int rc = pthread_mutex_trylock(&g_hdr->lock.mutex);
    if (rc != EBUSY && locked(rc, 0) == 0) {
        sweep(0);
        region_unlock();
    }
    return __atomic_load_n(&g_hdr->devices[rdev].used, __ATOMIC_ACQUIRE);
}

uint64_t ts_region_mine(int rdev) {
    if (!g_hdr || rdev < 0 || rdev >= REGION_DEVICES || g_my_slot < 0) return 0;
    return __atomic_load_n(&g_slots[g_my_slot].used[rdev], __ATOMIC_ACQUIRE);
}
