/*
 * The per-GPU compute arbiter (issue 30; docs/compute-share.md): a file created by tessera-node or
 * the embedded runner, mapped by every workload sharing that GPU. Only the workload holding the
 * lease submits kernels; the driver then has one tenant's work queued, so the time each tenant
 * gets is the time it holds the lease.
 *
 * Rule: deficit round-robin over quanta q. Every backlogged workload earns credit at its
 * entitlement (its request; spare time split equally among backlogged workloads under their
 * limit: water-filling); the holder is charged the GPU time of the work it launched under the
 * lease (launches x the per-launch cost its events measured; hooks_launch.c). At each lease end the backlogged workload with the most credit
 * gets the next lease, latency-class workloads within their request first. A limit is a token
 * bucket (rate l, burst q) that a workload must have non-negative to get a lease, even alone.
 *
 * No global lock at init, no NVML, no host PIDs. Decisions (once per lease, not per launch) are
 * made by whichever process needs one, under an OFD lock on the file (released by the kernel if
 * that process dies) plus a process-local mutex. A dead or stopped holder stops showing signs of
 * life (holder_alive and holder_busy, refreshed at every launch) and loses the lease 2 ms after
 * its queued work should have ended, or at its deadline q + grace at the latest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "compute.h"

#define DEMAND_NS 10000000LL /* a waiter refreshes its demand every 1 ms; 10 ms absorbs a loaded host */
#define IDLE_NS 2000000LL   /* a holder silent this long past its queued work gives the lease up */

struct ts_arb {
    int fd;
    uint8_t *map;
    size_t size;
    ts_arb_header *h;
    int nslots, me;
    pthread_mutex_t mu;
    int64_t q, grace, drain;
};

int64_t ts_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

uint32_t ts_crc32(const void *p, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    uint32_t c = 0xFFFFFFFFu;
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) c = table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static ts_arb_slot *slot(ts_arb *a, int i) {
    return (ts_arb_slot *)(a->map + TS_ARB_HEADER + (size_t)i * sizeof(ts_arb_slot));
}

static int header_ok(const ts_arb_header *h) { return ts_crc32(h, 40) == h->header_crc; }
static int slot_ok(const ts_arb_slot *s) { return ts_crc32(s, 80) == s->cfg_crc; }

ts_arb *ts_arb_open(const char *path, const char *key, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "arbiter %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < TS_ARB_HEADER) {
        snprintf(err, errlen, "arbiter %s: corrupt (%lld bytes, shorter than its header)", path,
                 (long long)st.st_size);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "arbiter %s: mmap: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    ts_arb_header *h = (ts_arb_header *)m;
    const char *why = NULL;
    char buf[160];
    if (h->magic != TS_ARB_MAGIC) why = "corrupt (bad magic)";
    else if (h->version != TS_ARB_VERSION) {
        snprintf(buf, sizeof buf, "wrong version %u (this library reads version %d)", h->version, TS_ARB_VERSION);
        why = buf;
    } else if (!header_ok(h)) why = "corrupt (header checksum)";
    else if (h->header_size != TS_ARB_HEADER || h->slot_size != sizeof(ts_arb_slot) || h->nslots == 0 ||
             h->nslots > TS_ARB_SLOTS || size < TS_ARB_HEADER + (size_t)h->nslots * sizeof(ts_arb_slot))
        why = "corrupt (layout)";
    else if (h->quantum_us < 5000 || h->quantum_us > 250000) why = "corrupt (quantum outside 5-250 ms)";
    if (why) {
        snprintf(err, errlen, "arbiter %s: %s", path, why);
        munmap(m, size);
        close(fd);
        return NULL;
    }
    ts_arb *a = calloc(1, sizeof *a);
    a->fd = fd;
    a->map = m;
    a->size = size;
    a->h = h;
    a->nslots = (int)h->nslots;
    a->me = -1;
    a->q = (int64_t)h->quantum_us * 1000;
    a->grace = (int64_t)(h->grace_us ? h->grace_us : 5000) * 1000;
    a->drain = (int64_t)(h->drain_us ? h->drain_us : 2000) * 1000;
    pthread_mutex_init(&a->mu, NULL);
    for (int i = 0; i < a->nslots; i++) {
        ts_arb_slot *s = slot(a, i);
        if (strncmp(s->key, key, sizeof s->key) == 0 && s->key[0]) {
            if (!slot_ok(s)) {
                snprintf(err, errlen, "arbiter %s: corrupt (checksum of workload %s's entry)", path, key);
                ts_arb *dead = a;
                munmap(m, size);
                close(fd);
                free(dead);
                return NULL;
            }
            a->me = i;
            break;
        }
    }
    if (a->me < 0) {
        snprintf(err, errlen, "arbiter %s has no entry for workload %s", path, key);
        munmap(m, size);
        close(fd);
        free(a);
        return NULL;
    }
    return a;
}

int ts_arb_mode(ts_arb *a) { return (int)a->h->mode; }
int64_t ts_arb_quantum(ts_arb *a) { return a->q; }
int64_t ts_arb_drain(ts_arb *a) { return a->drain; }
void ts_arb_set_status(ts_arb *a, uint32_t bits) { __atomic_fetch_or(&slot(a, a->me)->status, bits, __ATOMIC_RELAXED); }

static int holder_of(uint64_t lease) { return (int)(lease & 0xFFFF) - 1; }

int ts_arb_holding(ts_arb *a, int64_t now) {
    uint64_t l = __atomic_load_n(&a->h->lease, __ATOMIC_ACQUIRE);
    if (holder_of(l) != a->me) return 0;
    if (now >= __atomic_load_n(&a->h->lease_deadline, __ATOMIC_ACQUIRE)) return 0;
    uint32_t p = __atomic_load_n(&a->h->preempt, __ATOMIC_RELAXED);
    return p == 0 || (int)p - 1 == a->me;
}

ts_arb_header *ts_arb_hdr(ts_arb *a) { return a->h; }
uint64_t ts_arb_lease(ts_arb *a) { return __atomic_load_n(&a->h->lease, __ATOMIC_ACQUIRE); }
int64_t ts_arb_deadline(ts_arb *a) { return __atomic_load_n(&a->h->lease_deadline, __ATOMIC_ACQUIRE); }
int64_t ts_arb_lease_start(ts_arb *a) { return __atomic_load_n(&a->h->lease_start, __ATOMIC_ACQUIRE); }

void ts_arb_alive(ts_arb *a, int64_t now, int64_t busy_until) {
    __atomic_store_n(&a->h->holder_alive, now, __ATOMIC_RELAXED);
    __atomic_store_n(&a->h->holder_busy, busy_until, __ATOMIC_RELAXED);
}

/* The holder's last sign of life: its last launch, or the end of the work it had queued then
 * (a holder waiting for its own kernels is not idle). */
static int64_t last_alive(ts_arb *a) {
    int64_t alive = __atomic_load_n(&a->h->holder_alive, __ATOMIC_RELAXED);
    int64_t busy = __atomic_load_n(&a->h->holder_busy, __ATOMIC_RELAXED);
    return busy > alive ? busy : alive;
}

static int in_use(ts_arb *a, int i) { return slot(a, i)->key[0] != 0; }

static int backlogged(ts_arb *a, int i, int64_t now, int holder) {
    if (!in_use(a, i)) return 0;
    if (now - __atomic_load_n(&slot(a, i)->demand, __ATOMIC_RELAXED) < DEMAND_NS) return 1;
    return i == holder && now - last_alive(a) < IDLE_NS;
}

int ts_arb_others_waiting(ts_arb *a, int64_t now) { return ts_arb_others_within(a, now, DEMAND_NS); }

int ts_arb_others_within(ts_arb *a, int64_t now, int64_t window_ns) {
    for (int i = 0; i < a->nslots; i++)
        if (i != a->me && in_use(a, i) && now - __atomic_load_n(&slot(a, i)->demand, __ATOMIC_RELAXED) < window_ns)
            return 1;
    return 0;
}

static void lock(ts_arb *a) {
    pthread_mutex_lock(&a->mu);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    while (fcntl(a->fd, F_OFD_SETLKW, &fl) != 0 && errno == EINTR) {
    }
}

static void unlock(ts_arb *a) {
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    fcntl(a->fd, F_OFD_SETLK, &fl);
    pthread_mutex_unlock(&a->mu);
}

static double ppm(uint32_t v) { return v > 1000000 ? 1.0 : v / 1e6; }

/* Credits earned since the last accrual (caller holds the lock). */
static void accrue(ts_arb *a, int64_t now, int holder) {
    int64_t dt = now - a->h->last_accrual;
    a->h->last_accrual = now;
    if (dt <= 0) return;
    if (dt > 1000000000LL) dt = 1000000000LL;
    int n = a->nslots;
    double e[TS_ARB_SLOTS] = {0}, lim[TS_ARB_SLOTS] = {0};
    int b[TS_ARB_SLOTS] = {0};
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!in_use(a, i)) continue;
        ts_arb_slot *s = slot(a, i);
        lim[i] = ppm(s->limit_ppm);
        double r = ppm(s->request_ppm);
        if (r > lim[i]) r = lim[i];
        b[i] = backlogged(a, i, now, holder);
        if (b[i]) {
            e[i] = r;
            sum += r;
        }
    }
    if (sum > 1.0)
        for (int i = 0; i < n; i++) e[i] /= sum;
    /* Water-filling: spare time equally among backlogged workloads under their limit. */
    double spare = sum < 1.0 ? 1.0 - sum : 0.0;
    for (int round = 0; round < n && spare > 1e-9; round++) {
        int open = 0;
        for (int i = 0; i < n; i++)
            if (b[i] && e[i] < lim[i] - 1e-12) open++;
        if (!open) break;
        double each = spare / open, given = 0;
        for (int i = 0; i < n; i++)
            if (b[i] && e[i] < lim[i] - 1e-12) {
                double add = lim[i] - e[i] < each ? lim[i] - e[i] : each;
                e[i] += add;
                given += add;
            }
        spare -= given;
    }
    int64_t cap = 4 * a->q, debt = -1000000000LL;
    for (int i = 0; i < n; i++) {
        if (!in_use(a, i)) continue;
        ts_arb_slot *s = slot(a, i);
        int64_t c = s->credit;
        if (b[i]) c += (int64_t)(e[i] * (double)dt);
        else c = c > 0 ? 0 : (c + dt < 0 ? c + dt : 0); /* no banking while idle; debts fade */
        s->credit = c > cap ? cap : (c < debt ? debt : c);
        int64_t lc = s->lcredit + (int64_t)(lim[i] * (double)dt);
        s->lcredit = lc > a->q ? a->q : lc;
    }
}

static void charge_locked(ts_arb *a, int i, int64_t ns, int64_t now) {
    if (i < 0 || i >= a->nslots) return;
    ts_arb_slot *s = slot(a, i);
    s->credit -= ns;
    s->lcredit -= ns;
    if (s->lcredit < -1000000000LL) s->lcredit = -1000000000LL;
    s->charged_total += ns;
    int64_t idx = now / TS_ARB_BUCKET_NS;
    ts_arb_bucket *bk = &s->buckets[idx % TS_ARB_BUCKETS];
    if (bk->index != idx) {
        bk->ns = 0;
        bk->index = idx;
    }
    bk->ns += ns;
}

void ts_arb_correct(ts_arb *a, int64_t ns) {
    if (ns == 0) return;
    lock(a);
    charge_locked(a, a->me, ns, ts_now());
    unlock(a);
}

/* The next holder (caller holds the lock and has accrued); -1: nobody may run now, and *wake
 * says when someone limited may. */
static int decide(ts_arb *a, int64_t now, int last, int64_t *wake) {
    int best = -1, best_pri = -1;
    int64_t best_credit = 0;
    *wake = a->q;
    for (int k = 1; k <= a->nslots; k++) {
        int i = (last + k + a->nslots) % a->nslots;
        if (!backlogged(a, i, now, -1)) continue;
        ts_arb_slot *s = slot(a, i);
        if (s->lcredit < 0 && s->limit_ppm < 1000000) {
            double l = ppm(s->limit_ppm);
            int64_t until = l > 0 ? (int64_t)((double)-s->lcredit / l) : a->q;
            if (until < *wake) *wake = until;
            continue;
        }
        int pri = s->klass == 1 && s->credit >= 0;
        if (pri > best_pri || (pri == best_pri && s->credit > best_credit)) {
            best = i;
            best_pri = pri;
            best_credit = s->credit;
        }
    }
    return best;
}

static void futex_wake(uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }
static void futex_wait(uint32_t *w, uint32_t val, int64_t ns) {
    if (ns < 20000) ns = 20000;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void grant(ts_arb *a, int i, int64_t now, int prev) {
    ts_arb_header *h = a->h;
    uint64_t epoch = (h->lease >> 16) + 1;
    h->handoff_busy = prev >= 0 && prev != i ? last_alive(a) : 0;
    h->lease_start = now;
    __atomic_store_n(&h->lease_deadline, now + a->q, __ATOMIC_RELEASE);
    __atomic_store_n(&h->holder_alive, now, __ATOMIC_RELAXED);
    __atomic_store_n(&h->holder_busy, now, __ATOMIC_RELAXED);
    if ((int)h->preempt - 1 == i) __atomic_store_n(&h->preempt, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->lease, (uint64_t)(i + 1) | epoch << 16, __ATOMIC_RELEASE);
    slot(a, i)->leases++;
    if (prev != i) h->handoffs++;
    __atomic_fetch_add(&h->seq, 1, __ATOMIC_ACQ_REL);
    futex_wake(&h->seq);
}

/* Why the current lease may be ended by this process now (0: it may not). */
static int may_take(ts_arb *a, uint64_t lease, int64_t now) {
    int holder = holder_of(lease);
    if (holder < 0 || holder >= a->nslots) return 1;
    if (holder == a->me) return 1; /* our own lease ended (deadline or preemption) */
    if (now >= __atomic_load_n(&a->h->lease_deadline, __ATOMIC_ACQUIRE) + a->grace) return 1;
    if (now - last_alive(a) > IDLE_NS) return 1;
    uint32_t p = __atomic_load_n(&a->h->preempt, __ATOMIC_RELAXED);
    if (p && (int)p - 1 == a->me && now >= __atomic_load_n(&a->h->lease_deadline, __ATOMIC_ACQUIRE)) return 1;
    return 0;
}

int ts_arb_acquire(ts_arb *a, char *err, size_t errlen) {
    ts_arb_slot *me = slot(a, a->me);
    int64_t start = ts_now();
    for (;;) {
        int64_t now = ts_now();
        __atomic_store_n(&me->demand, now, __ATOMIC_RELAXED);
        if (ts_arb_holding(a, now)) break;
        uint32_t seq = __atomic_load_n(&a->h->seq, __ATOMIC_ACQUIRE);
        uint64_t lease = __atomic_load_n(&a->h->lease, __ATOMIC_ACQUIRE);
        int64_t wait = 1000000LL;
        if (may_take(a, lease, now)) {
            lock(a);
            if (!header_ok(a->h) || !slot_ok(me)) {
                unlock(a);
                snprintf(err, errlen, "arbiter corrupt at run time (checksum)");
                return -1;
            }
            now = ts_now();
            lease = a->h->lease;
            int holder = holder_of(lease);
            int granted = -1;
            if (may_take(a, lease, now) && !ts_arb_holding(a, now)) {
                accrue(a, now, holder);
                if (holder >= 0 && holder < a->nslots) {
                    /* The lease ends without its holder's account (ours, expired, is
                     * charged in ts_arb_release): a holder that went silent (dead, stopped, not
                     * scheduled, or done) is charged the whole time it kept the lease, so a
                     * workload granted leases it does not use stops being preferred. */
                    int64_t used = now - a->h->lease_start;
                    if (used > 0) charge_locked(a, holder, used, now);
                    __atomic_store_n(&a->h->lease, (lease & ~0xFFFFULL), __ATOMIC_RELEASE);
                }
                int64_t wake;
                int next = decide(a, now, holder < 0 ? a->me : holder, &wake);
                if (next >= 0) {
                    grant(a, next, now, holder);
                    granted = next;
                } else {
                    wait = wake;
                }
            } else if (holder >= 0 && holder != a->me) {
                wait = a->h->lease_deadline + a->grace - now;
            }
            unlock(a);
            if (granted == a->me) break;
        } else {
            /* Someone else holds it: a latency-class workload within its request asks for it. */
            if (me->klass == 1 && me->credit >= 0) {
                uint32_t zero = 0;
                __atomic_compare_exchange_n(&a->h->preempt, &zero, (uint32_t)(a->me + 1), 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED);
            }
            int64_t d = __atomic_load_n(&a->h->lease_deadline, __ATOMIC_ACQUIRE) + a->grace - now;
            if (d < wait) wait = d;
        }
        if (wait > 1000000LL) wait = 1000000LL; /* refresh the demand every 1 ms */
        futex_wait(&a->h->seq, seq, wait);
    }
    int64_t waited = ts_now() - start;
    __atomic_fetch_add(&me->wait_total, waited, __ATOMIC_RELAXED);
    return 0;
}

int64_t ts_arb_handoff_busy(ts_arb *a) { return __atomic_load_n(&a->h->handoff_busy, __ATOMIC_ACQUIRE); }

int64_t ts_arb_release(ts_arb *a, uint64_t lease_word, int64_t work_ns) {
    /* The end of our own lease (deadline, preemption): charge the time since it began and hand
     * the lease to the next workload by the rule (possibly ours again, at once). */
    int64_t charged = -1;
    lock(a);
    int64_t now = ts_now();
    uint64_t lease = a->h->lease;
    if (lease == lease_word && holder_of(lease) == a->me) {
        __atomic_store_n(&slot(a, a->me)->demand, now, __ATOMIC_RELAXED);
        accrue(a, now, a->me);
        int64_t held = now - a->h->lease_start;
        charged = work_ns < 0 ? held : work_ns;
        if (charged > held + 4 * a->drain) charged = held + 4 * a->drain;
        charge_locked(a, a->me, charged, now);
        __atomic_store_n(&a->h->lease, lease & ~0xFFFFULL, __ATOMIC_RELEASE);
        int64_t wake;
        int next = decide(a, now, a->me, &wake);
        if (next >= 0) grant(a, next, now, a->me);
        else {
            __atomic_fetch_add(&a->h->seq, 1, __ATOMIC_ACQ_REL);
            futex_wake(&a->h->seq);
        }
    }
    unlock(a);
    return charged;
}
