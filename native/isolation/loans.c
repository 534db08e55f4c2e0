/*
 * Loans of dynamic GPU fractions (issue #11 item 4). Memory above a workload's request is on
 * loan: a node-wide ledger per physical GPU (one file per GPU UUID in a host directory, shared
 * by every workload on that GPU) records, per process, the workload ("share") it belongs to,
 * the workload's request, limit and priority, and what the process holds on the GPU.
 *
 *  - An allocation that takes the workload above its request succeeds only from memory no other
 *    workload on the GPU is guaranteed: sum over the others of max(charged, request) is kept back.
 *  - An allocation within the request succeeds when the GPU has the memory; when it does not
 *    (others hold loans), the process records a demand on its entry and waits (wait-ms, default
 *    10 s) while the reclaimer (tessera.node.reclaim) kills borrowing processes; then it retries.
 *
 * Locking: no lock is shared between processes (a tenant could hold it). Each process holds an
 * open-file-description lock on the first byte of its entry for as long as it lives (claimed
 * with F_OFD_SETLK, so one process only; the kernel drops it when the process dies): an entry
 * whose lock can be taken belongs to a dead process and counts for nothing. A charge is published
 * (atomic add to the process's own entry) and then checked over all live entries, withdrawn if it
 * does not fit. Totals are never stored. Byte 64 (the old ledger lock) is unused.
 *
 * Trust: any tenant can write any entry of this file. The library only uses it for loans (memory
 * above a request, never promised): a within-request allocation is held back only when the
 * driver's free memory is short too, and the reclaimer (tessera.node.reclaim) never kills on
 * what the file says alone (it checks each fact against the agent's own records).
 *
 * Layout (version 1, native endianness; read by tessera/node/ledger.py):
 *   0    magic "TSLOAN\0\1", u32 version, u32 entry_size, u32 max_entries, u32 hwm,
 *        u64 capacity (physical - headroom), u64 physical, u64 headroom
 *   64   unused (was the ledger lock)
 *   128  unused (was the reclaim records; the reclaimer keeps them in its own file now)
 *   4096 entries[256], 256 bytes each:
 *        i32 pid, u32 in_use, i32 priority, u32 wait_ms, u64 request, u64 limit, u64 charged,
 *        u64 demand, u64 demand_since_ns, u64 start_ns (CLOCK_REALTIME), char share[64],
 *        u64 demands, u64 refused
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "state.h"

#define LEDGER_MAGIC "TSLOAN\0\1"
#define LEDGER_VERSION 1u
#define LEDGER_ENTRIES 256
#define ENTRIES_OFFSET 4096
#define SHARE_LEN 64

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t entry_size;
    uint32_t max_entries;
    uint32_t hwm;
    uint64_t capacity;
    uint64_t physical;
    uint64_t headroom;
} ledger_header;

typedef struct {
    int32_t pid;
    uint32_t in_use;
    int32_t priority;
    uint32_t wait_ms;
    uint64_t request;
    uint64_t limit;
    uint64_t charged;
    uint64_t demand;
    uint64_t demand_since_ns;
    uint64_t start_ns;
    char share[SHARE_LEN];
    uint64_t demands;
    uint64_t refused;
    char pad[256 - 144];
} ledger_entry;

_Static_assert(sizeof(ledger_header) == 48, "ledger header layout");
_Static_assert(sizeof(ledger_entry) == 256, "ledger entry layout");

#define LEDGER_SIZE ((size_t)ENTRIES_OFFSET + (size_t)LEDGER_ENTRIES * sizeof(ledger_entry))

/* The `loans` line of the configuration file. */
static struct {
    int enabled;
    char dir[TS_PATH_LEN];
    char share[SHARE_LEN];
    int32_t priority;
    uint32_t wait_ms;
    uint64_t headroom;
} g_conf = {.wait_ms = 10000};

/* Per region device (rdev): this process's view of the ledger of that GPU. */
typedef struct {
    int state; /* 0: no loans accounting, 1: attached, -1: configured but unusable (fail closed) */
    int fd;
    ts_fd fdg; /* fd, checked to still name the ledger before each use (fdguard.c) */
    ledger_header *hdr;
    ledger_entry *entries;
    int entry; /* my entry, -1 before the first charge */
    int ordinal;
    uint64_t request, limit;
    uint64_t capacity; /* physical - headroom, from this process's own configuration */
    char uuid[TS_UUID_LEN];
    int reported;
} loan_dev;

static loan_dev g_dev[TS_MAX_DEVICES];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- the `loans` configuration line ---- */

static int whole(const char *v, uint64_t *out) {
    if (!*v) return 0;
    for (const char *p = v; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    errno = 0;
    unsigned long long n = strtoull(v, NULL, 10);
    if (errno) return 0;
    *out = n;
    return 1;
}

int ts_loans_configure(char *rest, char *err, size_t errlen) {
    if (g_conf.enabled) {
        snprintf(err, errlen, "loans is given twice");
        return 0;
    }
    int have_dir = 0, have_share = 0;
    char *save = NULL;
    for (char *tok = strtok_r(rest, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            snprintf(err, errlen, "loans: '%s' must be key=value", tok);
            return 0;
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        uint64_t n;
        if (strcmp(k, "dir") == 0) {
            if (v[0] != '/' || strlen(v) >= sizeof g_conf.dir - 80) {
                snprintf(err, errlen, "loans: dir must be an absolute path (got '%s')", v);
                return 0;
            }
            snprintf(g_conf.dir, sizeof g_conf.dir, "%s", v);
            have_dir = 1;
        } else if (strcmp(k, "share") == 0) {
            size_t len = strlen(v);
            int ok = len > 0 && len < SHARE_LEN;
            for (const char *p = v; ok && *p; p++)
                ok = isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.';
            if (!ok) {
                snprintf(err, errlen, "loans: share must be 1 to %d letters, digits, '-', '_' or '.' (got '%s')",
                         SHARE_LEN - 1, v);
                return 0;
            }
            snprintf(g_conf.share, sizeof g_conf.share, "%s", v);
            have_share = 1;
        } else if (strcmp(k, "priority") == 0) {
            int neg = v[0] == '-';
            if (!whole(v + neg, &n) || n > 1000000000ULL) {
                snprintf(err, errlen, "loans: priority must be a whole number (got '%s')", v);
                return 0;
            }
            g_conf.priority = neg ? -(int32_t)n : (int32_t)n;
        } else if (strcmp(k, "wait-ms") == 0) {
            if (!whole(v, &n) || n > 3600000ULL) {
                snprintf(err, errlen, "loans: wait-ms must be 0 to 3600000 milliseconds (got '%s')", v);
                return 0;
            }
            g_conf.wait_ms = (uint32_t)n;
        } else if (strcmp(k, "headroom") == 0) {
            if (!whole(v, &n)) {
                snprintf(err, errlen, "loans: headroom must be a whole number of bytes (got '%s')", v);
                return 0;
            }
            g_conf.headroom = n;
        } else {
            snprintf(err, errlen, "loans: unknown field '%s'", k);
            return 0;
        }
    }
    if (!have_dir || !have_share) {
        snprintf(err, errlen, "loans needs dir= and share=");
        return 0;
    }
    g_conf.enabled = 1;
    return 1;
}

/* ---- the ledger file ---- */

static int byte_lock(int fd, off_t at, int type, int wait) {
    struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    int rc;
    do rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    while (rc != 0 && errno == EINTR);
    return rc;
}

static off_t entry_offset(int i) { return (off_t)ENTRIES_OFFSET + (off_t)i * (off_t)sizeof(ledger_entry); }

/* Bounded like the region lock (region.c): a stopped holder must not freeze the allocation. */
/* The ledger's descriptor, checked to still name the ledger; -1: lost. */
static int lfd(loan_dev *ld) { return ld->fd < 0 ? -1 : ts_fd_get(&ld->fdg); }

static int entry_alive(loan_dev *ld, int i) {
    if (i == ld->entry) return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = entry_offset(i), .l_len = 1};
    int fd = lfd(ld);
    if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return 1; /* cannot tell: never free on doubt */
    return fl.l_type != F_UNLCK;
}

static void mark_broken(loan_dev *ld, const char *why) {
    ld->state = -1;
    ts_log(TS_LOG_ERROR, "loans ledger for GPU %s: %s; every GPU memory allocation on it will be refused "
           "(fail closed)", ld->uuid[0] ? ld->uuid : "(uuid unknown)", why);
}

typedef CUresult (*total_mem_fn)(size_t *, CUdevice);

void ts_loans_device(int rdev, int ordinal, const char *uuid, uint64_t request, uint64_t limit) {
    if (!g_conf.enabled || rdev < 0 || rdev >= TS_MAX_DEVICES) return;
    loan_dev *ld = &g_dev[rdev];
    if (ld->state != 0) return;
    memset(ld, 0, sizeof *ld);
    ld->fd = -1;
    ld->entry = -1;
    ld->ordinal = ordinal;
    ld->request = request;
    ld->limit = limit;
    snprintf(ld->uuid, sizeof ld->uuid, "%s", uuid ? uuid : "");
    char why[TS_PATH_LEN + 128];
    if (!ld->uuid[0] || strchr(ld->uuid, '/')) {
        mark_broken(ld, "the GPU has no UUID to key the node-wide ledger by");
        return;
    }
    size_t phys = 0;
    if (!ts_real.cuDeviceTotalMem_v2 ||
        ((total_mem_fn)ts_real.cuDeviceTotalMem_v2)(&phys, ordinal) != CUDA_SUCCESS || phys == 0) {
        mark_broken(ld, "the driver does not report the GPU's memory");
        return;
    }
    char path[TS_PATH_LEN + 80];
    snprintf(path, sizeof path, "%s/%s.ledger", g_conf.dir, ld->uuid);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open %s: %s", path, strerror(errno));
        mark_broken(ld, why);
        return;
    }
    /* No lock here (nothing another tenant can hold decides whether this process attaches):
     * sizing and initialising are idempotent, every process writes the same values. */
    struct stat st;
    if (fstat(fd, &st) != 0 || (st.st_size < (off_t)LEDGER_SIZE && ftruncate(fd, (off_t)LEDGER_SIZE) != 0)) {
        snprintf(why, sizeof why, "cannot size %s: %s", path, strerror(errno));
        goto fail;
    }
    if (st.st_uid == geteuid()) fchmod(fd, 0666); /* every workload on the GPU writes it */
    void *m = mmap(NULL, LEDGER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(why, sizeof why, "cannot map %s: %s", path, strerror(errno));
        goto fail;
    }
    ledger_header *h = m;
    if (memcmp(h->magic, LEDGER_MAGIC, 8) != 0) {
        int blank = 1;
        for (int i = 0; i < 8 && blank; i++) blank = h->magic[i] == 0;
        if (!blank) {
            munmap(m, LEDGER_SIZE);
            snprintf(why, sizeof why, "%s is not a tessera loans ledger", path);
            goto fail;
        }
        h->version = LEDGER_VERSION;
        h->entry_size = sizeof(ledger_entry);
        h->max_entries = LEDGER_ENTRIES;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(h->magic, LEDGER_MAGIC, 8);
    } else if (h->version != LEDGER_VERSION || h->entry_size != sizeof(ledger_entry) ||
               h->max_entries != LEDGER_ENTRIES) {
        munmap(m, LEDGER_SIZE);
        snprintf(why, sizeof why, "%s has an incompatible layout (version %u)", path, h->version);
        goto fail;
    }
    /* For readers only: this process decides with its own capacity, never the header's (any
     * tenant can write the header). */
    h->physical = phys;
    h->headroom = g_conf.headroom;
    h->capacity = g_conf.headroom < phys ? phys - g_conf.headroom : 0;
    ld->capacity = g_conf.headroom < phys ? phys - g_conf.headroom : 0;
    ld->hdr = h;
    ld->entries = (ledger_entry *)((char *)m + ENTRIES_OFFSET);
    ld->fd = fd;
    ts_fd_remember(&ld->fdg, fd, path);
    ld->state = 1;
    TS_DEBUG("loans ledger %s: capacity %llu bytes (%llu - headroom %llu), share %s, request %llu, limit %llu",
             path, (unsigned long long)ld->capacity, (unsigned long long)phys,
             (unsigned long long)g_conf.headroom, g_conf.share, (unsigned long long)request,
             (unsigned long long)limit);
    return;
fail:
    close(fd);
    ld->fd = -1;
    mark_broken(ld, why);
}

/*
 * No lock is shared between processes (issue #28 class 4): a lock any tenant can take is a lock
 * a tenant can hold, and every other tenant's allocation on the GPU would then wait and fail.
 * Instead:
 *  - an entry is claimed with its own OFD lock (the kernel gives it to one process only);
 *  - a charge is published first (an atomic add to this process's entry), then the decision is
 *    made over all live entries, which include it; if it does not fit, it is withdrawn. Two
 *    processes racing for the last bytes both see each other's charge: at worst both withdraw
 *    and retry, never both keep it.
 * Within this process, g_mu serialises the threads (one entry per process and GPU).
 */

static void hwm_at_least(ledger_header *h, uint32_t n) {
    uint32_t cur = __atomic_load_n(&h->hwm, __ATOMIC_ACQUIRE);
    while (cur < n && !__atomic_compare_exchange_n(&h->hwm, &cur, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

/* Takes an entry for this process (g_mu held). */
static int take_entry(loan_dev *ld) {
    int fd = lfd(ld);
    for (int i = 0; fd >= 0 && i < LEDGER_ENTRIES; i++) {
        ledger_entry *e = &ld->entries[i];
        if (__atomic_load_n(&e->in_use, __ATOMIC_ACQUIRE) && entry_alive(ld, i)) continue;
        if (byte_lock(fd, entry_offset(i), F_WRLCK, 0) != 0) continue; /* a live process has it */
        __atomic_store_n(&e->in_use, 0, __ATOMIC_RELEASE);
        memset(e, 0, sizeof *e);
        e->pid = (int32_t)getpid();
        e->priority = g_conf.priority;
        e->wait_ms = g_conf.wait_ms;
        e->request = ld->request;
        e->limit = ld->limit;
        e->start_ns = now_ns(CLOCK_REALTIME);
        snprintf(e->share, sizeof e->share, "%s", g_conf.share);
        __atomic_store_n(&e->in_use, 1, __ATOMIC_RELEASE);
        hwm_at_least(ld->hdr, (uint32_t)i + 1);
        ld->entry = i;
        return 0;
    }
    ts_log(TS_LOG_ERROR, "the loans ledger of %s has no free entry (%d processes)", ld->uuid, LEDGER_ENTRIES);
    return -1;
}

enum { FITS = 1, LOAN_REFUSED = 0, SHORT = 2 };

/* Decides over the live entries, this process's already holding what it asks for (published).
 * check_alive: skip entries whose process is dead (an F_OFD_GETLK each). Dead entries are never
 * cleared here (a process may be claiming one right now); take_entry reuses them. */
typedef CUresult (*mem_info_fn)(size_t *, size_t *);

/* Bytes the driver says the device holds beside `mine` (this workload's charge); UINT64_MAX when
 * it cannot say (the claims then stand: a loan is refused rather than granted on doubt). */
static uint64_t driver_used_by_others(uint64_t mine) {
    size_t free_b = 0, total_b = 0;
    if (!ts_real.cuMemGetInfo_v2 || ((mem_info_fn)ts_real.cuMemGetInfo_v2)(&free_b, &total_b) != CUDA_SUCCESS ||
        free_b > total_b)
        return UINT64_MAX;
    uint64_t used = total_b - free_b;
    return used > mine ? used - mine : 0;
}

static int decide(loan_dev *ld, int check_alive, uint64_t size, uint64_t *free_now) {
    uint32_t hwm = __atomic_load_n(&ld->hdr->hwm, __ATOMIC_ACQUIRE);
    if (hwm > LEDGER_ENTRIES) hwm = LEDGER_ENTRIES;
    /* Per share: charged and request (entries of one share agree on the request). */
    struct { const char *share; uint64_t charged, request; } shares[LEDGER_ENTRIES];
    int n = 0;
    uint64_t used = 0, mine = 0;
    for (uint32_t i = 0; i < hwm; i++) {
        ledger_entry *e = &ld->entries[i];
        if (!__atomic_load_n(&e->in_use, __ATOMIC_ACQUIRE)) continue;
        if (check_alive && !entry_alive(ld, (int)i)) continue;
        uint64_t c = __atomic_load_n(&e->charged, __ATOMIC_SEQ_CST);
        used = used + c < used ? UINT64_MAX : used + c;
        if ((int)i == ld->entry || strncmp(e->share, g_conf.share, SHARE_LEN) == 0) {
            mine = mine + c < mine ? UINT64_MAX : mine + c;
            continue;
        }
        int k = 0;
        while (k < n && strncmp(shares[k].share, e->share, SHARE_LEN) != 0) k++;
        if (k == n) {
            shares[n].share = e->share;
            shares[n].charged = 0;
            shares[n].request = e->request;
            n++;
        }
        shares[k].charged = shares[k].charged + c < shares[k].charged ? UINT64_MAX : shares[k].charged + c;
    }
    /* What the others keep back: their requests, plus their loans (charged above the request). */
    uint64_t requests = 0, loans = 0;
    for (int k = 0; k < n; k++) {
        uint64_t r = shares[k].request, l = shares[k].charged > r ? shares[k].charged - r : 0;
        requests = requests + r < requests ? UINT64_MAX : requests + r;
        loans = loans + l < loans ? UINT64_MAX : loans + l;
    }
    uint64_t cap = ld->capacity;
    *free_now = used < cap ? cap - used : 0;
    if (mine <= ld->request) return used <= cap ? FITS : SHORT;
    /* Above the request: only from memory no other workload is guaranteed. Every entry is written
     * by its own tenant, so what the others claim is bounded by what is true (issue #28): their
     * loans by what the driver says the device holds beside this workload's charge, their
     * requests by what this workload's own request leaves of the capacity. */
    uint64_t others_real = driver_used_by_others(mine > size ? mine - size : 0);
    if (loans > others_real) loans = others_real;
    uint64_t room = cap > ld->request ? cap - ld->request : 0;
    if (requests > room) requests = room;
    uint64_t reserved_others = requests + loans < requests ? UINT64_MAX : requests + loans;
    return reserved_others <= cap && mine <= cap - reserved_others ? FITS : LOAN_REFUSED;
}

static void publish(loan_dev *ld, uint64_t size) { __atomic_add_fetch(&ld->entries[ld->entry].charged, size, __ATOMIC_SEQ_CST); }

static void withdraw(loan_dev *ld, uint64_t size) {
    ledger_entry *e = &ld->entries[ld->entry];
    uint64_t cur = __atomic_load_n(&e->charged, __ATOMIC_ACQUIRE);
    uint64_t next;
    do next = size < cur ? cur - size : 0;
    while (!__atomic_compare_exchange_n(&e->charged, &cur, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
}

/* Publishes size, decides, withdraws unless it fits (g_mu held). Racing processes can make both
 * withdraw: a refusal is tried again twice after a short random pause. */
static int try_charge(loan_dev *ld, uint64_t size, uint64_t *free_now) {
    int r = LOAN_REFUSED;
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt) {
            struct timespec pause = {0, (long)(20000 + (now_ns(CLOCK_MONOTONIC) % 200000))};
            nanosleep(&pause, NULL);
        }
        publish(ld, size);
        r = decide(ld, 0, size, free_now);
        if (r != FITS) r = decide(ld, 1, size, free_now); /* the dead hold nothing */
        if (r == FITS) return r;
        withdraw(ld, size);
    }
    return r;
}

/* The deadline of this thread's last reservation that waited for a reclaim (0: it did not). */
static __thread uint64_t t_reclaim_deadline;

int ts_loans_retry_driver(int rdev) {
    if (rdev < 0 || rdev >= TS_MAX_DEVICES || g_dev[rdev].state != 1 || t_reclaim_deadline == 0)
        return 0;
    if (now_ns(CLOCK_MONOTONIC) >= t_reclaim_deadline) {
        t_reclaim_deadline = 0;
        return 0;
    }
    struct timespec pause = {0, 5000000}; /* 5 ms */
    nanosleep(&pause, NULL);
    return 1;
}

/* The ledger says the GPU is short; does the driver agree? A ledger entry is written by its own
 * process (any tenant can write any entry), so a within-request allocation is held back only
 * when the driver's free memory (beside the headroom) is short too. */
static int driver_short(loan_dev *ld, uint64_t size) {
    if (!ts_real.cuMemGetInfo_v2) return 1;
    size_t free_b = 0, total_b = 0;
    if (((mem_info_fn)ts_real.cuMemGetInfo_v2)(&free_b, &total_b) != CUDA_SUCCESS) return 1;
    uint64_t usable = free_b > g_conf.headroom ? free_b - g_conf.headroom : 0;
    return usable < size;
}

int ts_loans_reserve(int rdev, uint64_t size) {
    if (rdev < 0 || rdev >= TS_MAX_DEVICES) return 1;
    loan_dev *ld = &g_dev[rdev];
    if (ld->state == 0) return 1; /* no loans on this device (ts_loans_retry_driver never reads the deadline) */
    t_reclaim_deadline = 0;
    if (ld->state < 0) return 0;
    uint64_t deadline = 0;
    int waited = 0;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        if (ld->entry < 0 && take_entry(ld) != 0) {
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
        ledger_entry *e = &ld->entries[ld->entry];
        uint64_t free_now = 0;
        int r = try_charge(ld, size, &free_now);
        if (r == SHORT && !driver_short(ld, size)) {
            publish(ld, size); /* within the request and the driver has it: the ledger was wrong */
            r = FITS;
        }
        if (r == FITS) {
            e->demand = 0;
            e->demand_since_ns = 0;
            pthread_mutex_unlock(&g_mu);
            if (waited) t_reclaim_deadline = deadline;
            if (waited)
                TS_INFO("allocation of %llu bytes on GPU %s served after the reclaim of loaned memory",
                        (unsigned long long)size, ld->uuid);
            return 1;
        }
        if (r == LOAN_REFUSED) {
            e->refused++;
            pthread_mutex_unlock(&g_mu);
            TS_INFO("allocation of %llu bytes on GPU %s refused: above the request (%llu bytes) only memory no "
                    "other workload is guaranteed can be lent, and none is left",
                    (unsigned long long)size, ld->uuid, (unsigned long long)ld->request);
            return 0;
        }
        /* Within the request, but the GPU is short because others hold loans: ask and wait. */
        uint64_t now = now_ns(CLOCK_MONOTONIC);
        if (!waited) {
            deadline = now + (uint64_t)g_conf.wait_ms * 1000000ULL;
            waited = 1;
            e->demands++;
            TS_INFO("allocation of %llu bytes on GPU %s is within the request but %llu bytes are free: "
                    "waiting up to %u ms for loans to be reclaimed", (unsigned long long)size, ld->uuid,
                    (unsigned long long)free_now, g_conf.wait_ms);
        }
        if (now >= deadline) {
            e->demand = 0;
            e->demand_since_ns = 0;
            pthread_mutex_unlock(&g_mu);
            ts_log(TS_LOG_ERROR, "allocation of %llu bytes on GPU %s (within the workload's request of %llu "
                   "bytes) refused: the memory on loan to other workloads was not reclaimed within %u ms",
                   (unsigned long long)size, ld->uuid, (unsigned long long)ld->request, g_conf.wait_ms);
            return 0;
        }
        if (e->demand == 0) e->demand_since_ns = now_ns(CLOCK_REALTIME);
        e->demand = size;
        pthread_mutex_unlock(&g_mu);
        struct timespec pause = {0, 2000000}; /* 2 ms */
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&g_mu);
    }
}

void ts_loans_release(int rdev, uint64_t size) {
    if (rdev < 0 || rdev >= TS_MAX_DEVICES) return;
    loan_dev *ld = &g_dev[rdev];
    if (ld->state != 1 || ld->entry < 0 || size == 0) return;
    withdraw(ld, size);
}

void ts_loans_detach_after_fork(void) {
    /* The child shares the parent's open file descriptions and with them the entry locks: drop
     * them so the entries stay the parent's; the child takes its own on first use. */
    pthread_mutex_init(&g_mu, NULL);
    for (int i = 0; i < TS_MAX_DEVICES; i++) {
        loan_dev *ld = &g_dev[i];
        if (ld->hdr) munmap(ld->hdr, LEDGER_SIZE);
        if (ld->fd >= 0 && ld->state != 0 && lfd(ld) >= 0) close(ld->fdg.fd);
        memset(ld, 0, sizeof *ld);
    }
}
