/*
 * Compute share: every kernel launch path waits for this workload's lease on the GPU's arbiter
 * (arbiter.c) before reaching the driver (issue 30; docs/compute-share.md).
 *
 * Configuration: TESSERA_GPU_COMPUTE_CONFIG, else /etc/tessera/gpu-compute.conf, written by
 * tessera-node or the embedded runner next to the memory configuration:
 *     arbiter /run/tessera/compute/GPU-<uuid>.share     (one line per GPU of the share)
 *     workload <key>                                     (the workload's entry in the arbiter)
 * The request, limit and class live in the arbiter, where the node wrote them. No file: compute
 * is not shared (kernels pass through). A file that names an arbiter this library cannot use
 * (missing, corrupt, wrong version, no entry for the workload): every launch is refused with a
 * one-line reason, never silently ungated. More than one GPU: not enforced, said once on stderr
 * and in the arbiter entry's status (shown by tessera describe / top).
 *
 * Hot path of a launch while holding the lease: one atomic load of the lease word and deadline,
 * the capture check, a counter; every N launches an event records how far the GPU has got, which
 * bounds the work this workload keeps queued (D, so a lease cannot be overrun by queued
 * kernels). Stream capture is neither gated nor charged (the graph is charged when launched).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compute.h"
#include "state.h"

enum { CS_UNKNOWN = 0, CS_OFF = 1, CS_ON = 2, CS_FAILED = 3, CS_MULTI = 4 };

static int g_cs;
static pthread_mutex_t g_cs_mu = PTHREAD_MUTEX_INITIALIZER;   /* loading */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER; /* the slow path and the samples */
static ts_arb *g_arb;
static char g_why[768];

typedef CUresult (*ev_create_fn)(CUevent *, unsigned);
typedef CUresult (*ev_record_fn)(CUevent, CUstream);
typedef CUresult (*ev_query_fn)(CUevent);
typedef CUresult (*ev_elapsed_fn)(float *, CUevent, CUevent);
typedef CUresult (*capturing_fn)(CUstream, int *);

static ev_create_fn ev_create;
static ev_record_fn ev_record;
static ev_query_fn ev_query;
static ev_elapsed_fn ev_elapsed;

#define SAMPLES 64
static struct {
    CUevent ev;
    int64_t idx;
    int busy; /* the previous sample was still pending when this one was recorded */
} g_ring[SAMPLES];
static int g_head, g_tail;          /* ring of outstanding samples */
static CUevent g_pool[SAMPLES + 4]; /* created events */
static int g_npool;
static int64_t g_launched, g_done_idx, g_last_sample;
static CUevent g_last_done;
static int64_t g_last_done_idx = -1;
static double g_cost = 100000.0; /* ns per launch, estimated from the samples */
static int64_t g_cost_ns = 100000; /* the same, for the fast path's integer arithmetic */
#define COSTS 9
static double g_costs[COSTS];
static int g_ncost;
static uint64_t g_my_lease;       /* lease word of the lease this process last launched under */
static double g_bound = 2e6; /* queued work allowed now: D when others wait, 4 D alone */
static int64_t g_room = 1;     /* launches that bound allows at the current cost estimate */
static int64_t g_every = 1;    /* launches between progress samples (about D / 4 of work) */
static ts_arb_header *g_hdr;   /* the arbiter's header: the fast path reads it directly */
static int64_t g_lease_launch0; /* g_launched when the current lease began */

static void load(void) {
    const char *path = ts_getenv("TESSERA_GPU_COMPUTE_CONFIG"); /* as at load (envsnap.c) */
    if (!path || !*path) path = TS_DEFAULT_CONFIG_DIR "/gpu-compute.conf";
    FILE *f = fopen(path, "re");
    if (!f) {
        g_cs = CS_OFF;
        return;
    }
    char line[4096], arbiters[8][TS_PATH_LEN], key[128] = "";
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        s[strcspn(s, "\r\n")] = 0;
        if (!*s || *s == '#') continue;
        if (strncmp(s, "arbiter ", 8) == 0) {
            if (n < 8) snprintf(arbiters[n], sizeof arbiters[n], "%s", s + 8);
            n++;
        } else if (strncmp(s, "workload ", 9) == 0) {
            snprintf(key, sizeof key, "%s", s + 9);
        } else {
            bad = 1;
        }
    }
    fclose(f);
    if (bad || n == 0 || !key[0]) {
        snprintf(g_why, sizeof g_why, "compute share configuration %s is unusable (%s)", path,
                 bad ? "unknown line" : n == 0 ? "no arbiter line" : "no workload line");
        g_cs = CS_FAILED;
        return;
    }
    char err[600];
    for (int i = 0; i < n && i < 8; i++) {
        ts_arb *a = ts_arb_open(arbiters[i], key, err, sizeof err);
        if (!a) {
            snprintf(g_why, sizeof g_why, "compute share configured but %s", err);
            g_cs = CS_FAILED;
            return;
        }
        if (n > 1) ts_arb_set_status(a, TS_SLOT_MULTIGPU);
        if (i == 0) {
            g_arb = a;
            g_hdr = ts_arb_hdr(a);
        }
    }
    if (n > 1) {
        ts_log_once("compute-multi", "compute share not enforced: multi-GPU (%d GPUs; kernels run ungated)", n);
        g_cs = CS_MULTI;
        return;
    }
    if (ts_arb_mode(g_arb) == TS_ARB_OFF) {
        g_cs = CS_OFF;
        return;
    }
    ev_create = (ev_create_fn)ts_real.cuEventCreate;
    ev_record = (ev_record_fn)ts_real.cuEventRecord;
    ev_query = (ev_query_fn)ts_real.cuEventQuery;
    ev_elapsed = (ev_elapsed_fn)ts_real.cuEventElapsedTime;
    if (!ev_create || !ev_record || !ev_query || !ev_elapsed) {
        snprintf(g_why, sizeof g_why, "compute share configured but the driver lacks the event entry points");
        g_cs = CS_FAILED;
        return;
    }
    g_cs = CS_ON;
}

static int cs_state(void) {
    int s = __atomic_load_n(&g_cs, __ATOMIC_ACQUIRE);
    if (__builtin_expect(s != CS_UNKNOWN, 1)) return s;
    pthread_mutex_lock(&g_cs_mu);
    if (g_cs == CS_UNKNOWN) load();
    s = g_cs;
    pthread_mutex_unlock(&g_cs_mu);
    return s;
}

void ts_compute_after_fork(void) {
    pthread_mutex_init(&g_gate_mu, NULL);
    g_head = g_tail = 0;
    g_my_lease = 0;
}

static CUresult refuse(const char *what) {
    ts_log_once("compute", "%s refused: %s (fail closed)", what, g_why);
    return CUDA_ERROR_NOT_PERMITTED;
}

static CUevent new_event(void) {
    if (!ev_create) return NULL;
    if (g_npool > 0) return g_pool[--g_npool];
    CUevent e = NULL;
    return ev_create(&e, 0) == CUDA_SUCCESS ? e : NULL;
}
static void free_event(CUevent e) {
    if (e && g_npool < (int)(sizeof g_pool / sizeof g_pool[0])) g_pool[g_npool++] = e;
}

/* Completed samples leave the ring; their spacing updates the cost estimate. */
static void reap(void) {
    while (g_tail != g_head) {
        CUevent e = g_ring[g_tail].ev;
        if (ev_query(e) != CUDA_SUCCESS) break;
        int64_t idx = g_ring[g_tail].idx;
        /* Only an interval the GPU spent on our queue without a gap measures the cost. */
        if (g_ring[g_tail].busy && g_last_done && idx > g_last_done_idx) {
            float ms;
            if (ev_elapsed(&ms, g_last_done, e) == CUDA_SUCCESS && ms >= 0) {
                /* The median of the last measurements: one interval stretched by another
                 * tenant's queue (driver time-slicing at a hand-over) does not skew it. */
                g_costs[g_ncost++ % COSTS] = (double)ms * 1e6 / (double)(idx - g_last_done_idx);
                int n = g_ncost < COSTS ? g_ncost : COSTS;
                double v[COSTS];
                memcpy(v, g_costs, sizeof v);
                for (int i = 1; i < n; i++)
                    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                        double t = v[j];
                        v[j] = v[j - 1];
                        v[j - 1] = t;
                    }
                g_cost = v[n / 2];
                if (g_cost < 50) g_cost = 50;
                if (g_cost > (double)ts_arb_drain(g_arb)) g_cost = (double)ts_arb_drain(g_arb);
                g_cost_ns = (int64_t)g_cost;
            }
        }
        free_event(g_last_done);
        g_last_done = e;
        g_last_done_idx = idx;
        g_done_idx = idx;
        g_tail = (g_tail + 1) % SAMPLES;
    }
}

/* Our lease ended (deadline or preemption): charge it and hand it on. The charge is the GPU
 * time of the work launched under the lease (launches times the per-launch cost the progress
 * events measured), not the wall time: time the GPU spent on the previous holder's queue, or idle
 * while this process was not scheduled, is not ours; our queue draining into the next lease is.
 * A lease taken over because we went silent is charged by the taker (wall time). */
static void end_lease(uint64_t word) {
    reap();
    int64_t n = g_launched - g_lease_launch0;
    /* A lease held without a single launch is charged in full (-1: the time held), so a
     * workload cannot keep being preferred for leases it does not use. */
    int64_t work = n > 0 ? (int64_t)((double)n * g_cost) : -1;
    /* No interval measured yet: the per-launch cost is only its default, so charge the time
     * held instead (wall time, bounded by the arbiter) rather than launches x a guess. */
    if (g_ncost == 0) work = -1;
    /* Another process of this workload ended the lease (it charged its own launches): ours
     * are added, so the processes of one workload share one budget. */
    if (ts_arb_release(g_arb, word, work) < 0 && n > 0) ts_arb_correct(g_arb, work);
}

/* Records a progress sample after the launches so far (caller holds g_gate_mu). */
static void sample(CUstream s) {
    int64_t n = __atomic_load_n(&g_launched, __ATOMIC_RELAXED);
    if ((g_head + 1) % SAMPLES != g_tail) {
        int prev = (g_head + SAMPLES - 1) % SAMPLES;
        int busy = g_head != g_tail && ev_query(g_ring[prev].ev) != CUDA_SUCCESS;
        CUevent e = new_event();
        if (e && ev_record(e, s) == CUDA_SUCCESS) {
            g_ring[g_head].ev = e;
            g_ring[g_head].idx = n;
            g_ring[g_head].busy = busy;
            g_head = (g_head + 1) % SAMPLES;
        } else {
            free_event(e);
        }
    }
    g_last_sample = n;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

static CUresult gate_slow(CUstream s, const char *what, int st, int *counted);

/* Before a launch on stream s. Returns CUDA_SUCCESS to go on, or an error to return. Inlined
 * into each hook: only the fast path (holding the lease, room under the bound) is here; the
 * rest (lease hand-over, waits, failures) is gate_slow, out of line, so the fast path pays no
 * prologue for the slow path's buffers (docs/benchmarks.md, compute share overhead). */
static inline __attribute__((always_inline)) CUresult gate(CUstream s, const char *what, int *counted) {
    *counted = 0;
    int st = __atomic_load_n(&g_cs, __ATOMIC_ACQUIRE);
    if (__builtin_expect(st == CS_OFF || st == CS_MULTI, 1)) return CUDA_SUCCESS;
    if (__builtin_expect(st != CS_ON, 0)) return gate_slow(s, what, st, counted);
    if (ts_real.cuStreamIsCapturing) {
        int cap = 0;
        if (((capturing_fn)ts_real.cuStreamIsCapturing)(s, &cap) == CUDA_SUCCESS && cap) return CUDA_SUCCESS;
    }
    *counted = 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* ts_now(), inlined */
    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    /* Fast path: our lease (same epoch), before its deadline, nobody latency-class asking for
     * it, and room for one more launch under the bound on queued work. */
    int64_t queued = g_launched - g_done_idx;
    if (__builtin_expect(__atomic_load_n(&g_hdr->lease, __ATOMIC_ACQUIRE) == g_my_lease && g_my_lease &&
                             now < __atomic_load_n(&g_hdr->lease_deadline, __ATOMIC_ACQUIRE) &&
                             __atomic_load_n(&g_hdr->preempt, __ATOMIC_RELAXED) == 0 && queued < g_room &&
                             g_launched - g_last_sample < 2 * g_every,
                         1)) {
        __atomic_store_n(&g_hdr->holder_alive, now, __ATOMIC_RELAXED);
        __atomic_store_n(&g_hdr->holder_busy, now + (queued + 1) * g_cost_ns, __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    return gate_slow(s, what, -1, counted);
}

/* The slow path: st is the state gate() found when it was not CS_ON, or -1 when it was (the
 * capture check is done and the launch counted). */
static __attribute__((noinline, cold)) CUresult gate_slow(CUstream s, const char *what, int st, int *counted) {
    if (st != -1) {
        st = cs_state(); /* loads the configuration on first use */
        if (st == CS_OFF || st == CS_MULTI) return CUDA_SUCCESS;
        if (st == CS_FAILED) return refuse(what);
        return gate(s, what, counted); /* CS_ON now: the gate proper */
    }
    int64_t now;
    pthread_mutex_lock(&g_gate_mu);
    for (;;) {
        now = ts_now();
        uint64_t cur = ts_arb_lease(g_arb);
        int hold = ts_arb_holding(g_arb, now);
        if (g_my_lease && (!hold || cur != g_my_lease)) {
            end_lease(g_my_lease);
            g_my_lease = 0;
            continue;
        }
        if (!hold) {
            char err[256];
            if (ts_arb_acquire(g_arb, err, sizeof err) != 0) {
                snprintf(g_why, sizeof g_why, "%s", err);
                __atomic_store_n(&g_cs, CS_FAILED, __ATOMIC_RELEASE);
                pthread_mutex_unlock(&g_gate_mu);
                return refuse(what);
            }
            continue;
        }
        if (!g_my_lease) {
            g_my_lease = cur;
            g_lease_launch0 = g_launched;
        }
        /* Bound the work kept queued: D when others wait, 4 D when alone. */
        reap();
        int others = ts_arb_others_waiting(g_arb, now);
        double out = (double)(g_launched - g_done_idx) * g_cost;
        double bound = (double)ts_arb_drain(g_arb) * (others ? 1 : 4);
        g_bound = bound;
        g_room = (int64_t)(bound / g_cost);
        if (g_room < 1) g_room = 1;
        /* Progress samples a quarter of the bound apart (D / 4 while others wait, D alone), but
         * never more than half the queue observed now: two consecutive samples must both be
         * queued at once for their interval to measure the per-launch cost (a program keeping
         * few launches in flight would otherwise never be measured; with no queue at all no
         * spacing helps, and end_lease charges the time held). Each sample is an event record
         * and query in the driver: the arbiter's part of the per-launch cost (docs/benchmarks.md). */
        int64_t depth = g_launched - g_done_idx;
        /* Wide spacing only when no other workload wanted this GPU for a whole second: a
         * contended GPU samples at D / 4 exactly as before, even in the moments its waiters'
         * demand marks are stale on a loaded host. */
        int alone = !others && !ts_arb_others_within(g_arb, now, 1000000000LL);
        g_every = (int64_t)((alone ? bound : (double)ts_arb_drain(g_arb)) / 4 / g_cost);
        if (depth >= 4 && g_every > depth / 2) g_every = depth / 2;
        if (g_every < 1) g_every = 1;
        if (g_every > (alone ? SAMPLES * 4 : 64)) g_every = alone ? SAMPLES * 4 : 64;
        int ring_full = (g_head + 1) % SAMPLES == g_tail;
        if ((out < bound || g_launched - g_done_idx < 2) && !ring_full) break;
        /* Launches after the last sample are invisible to reap(): sample them now, or a
         * finished queue would look outstanding forever. */
        if (g_last_sample != g_launched) sample(s);
        ts_arb_alive(g_arb, now, now + (int64_t)out);
        int64_t nap = (int64_t)(out - bound);
        if (nap < 20000) nap = 20000;
        if (nap > 200000) nap = 200000;
        sleep_ns(nap);
    }
    now = ts_now();
    ts_arb_alive(g_arb, now, now + (int64_t)((double)(g_launched + 1 - g_done_idx) * g_cost));
    pthread_mutex_unlock(&g_gate_mu);
    return CUDA_SUCCESS;
}

/* After a launch that went to the driver: every N launches (each graph), an event samples progress. */
static __attribute__((noinline)) void sample_locked(CUstream s) {
    pthread_mutex_lock(&g_gate_mu);
    sample(s);
    pthread_mutex_unlock(&g_gate_mu);
}
static inline __attribute__((always_inline)) void after(CUstream s, int counted, int graph, CUresult rc) {
    if (!counted || rc != CUDA_SUCCESS) return;
    int64_t n = __atomic_add_fetch(&g_launched, 1, __ATOMIC_RELAXED);
    if (!graph && n - g_last_sample < g_every) return;
    sample_locked(s);
}

/* ---- the hooks ---- */
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig_ *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

#define LAUNCH_HOOK(name)                                                                                      \
    CUresult ts_hook_##name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                            unsigned bz, unsigned sh, CUstream s, void **p, void **x) {                        \
        BIND_OR_FAIL();                                                                                        \
        NEED_REAL(name);                                                                                       \
        int counted;                                                                                           \
        CUresult rc = gate(s, #name, &counted);                                                                \
        if (rc != CUDA_SUCCESS) return rc;                                                                     \
        rc = ((launch_fn)ts_real.name)(f, gx, gy, gz, bx, by, bz, sh, s, p, x);                                \
        after(s, counted, 0, rc);                                                                              \
        return rc;                                                                                             \
    }                                                                                                          \
    TS_ALIAS(name)
LAUNCH_HOOK(cuLaunchKernel)
LAUNCH_HOOK(cuLaunchKernel_ptsz)

#define LAUNCH_EX_HOOK(name)                                                                                   \
    CUresult ts_hook_##name(const CUlaunchConfig_ *c, CUfunction f, void **p, void **x) {                      \
        BIND_OR_FAIL();                                                                                        \
        NEED_REAL(name);                                                                                       \
        int counted;                                                                                           \
        CUresult rc = gate(c ? c->hStream : NULL, #name, &counted);                                            \
        if (rc != CUDA_SUCCESS) return rc;                                                                     \
        rc = ((launch_ex_fn)ts_real.name)(c, f, p, x);                                                         \
        after(c ? c->hStream : NULL, counted, 0, rc);                                                          \
        return rc;                                                                                             \
    }                                                                                                          \
    TS_ALIAS(name)
LAUNCH_EX_HOOK(cuLaunchKernelEx)
LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz)

#define COOP_HOOK(name)                                                                                        \
    CUresult ts_hook_##name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                            unsigned bz, unsigned sh, CUstream s, void **p) {                                  \
        BIND_OR_FAIL();                                                                                        \
        NEED_REAL(name);                                                                                       \
        int counted;                                                                                           \
        CUresult rc = gate(s, #name, &counted);                                                                \
        if (rc != CUDA_SUCCESS) return rc;                                                                     \
        rc = ((coop_fn)ts_real.name)(f, gx, gy, gz, bx, by, bz, sh, s, p);                                     \
        after(s, counted, 0, rc);                                                                              \
        return rc;                                                                                             \
    }                                                                                                          \
    TS_ALIAS(name)
COOP_HOOK(cuLaunchCooperativeKernel)
COOP_HOOK(cuLaunchCooperativeKernel_ptsz)

#define GRAPH_HOOK(name)                                                                                       \
    CUresult ts_hook_##name(CUgraphExec e, CUstream s) {                                                       \
        BIND_OR_FAIL();                                                                                        \
        NEED_REAL(name);                                                                                       \
        int counted;                                                                                           \
        CUresult rc = gate(s, #name, &counted);                                                                \
        if (rc != CUDA_SUCCESS) return rc;                                                                     \
        rc = ((graph_fn)ts_real.name)(e, s);                                                                   \
        after(s, counted, 1, rc);                                                                              \
        return rc;                                                                                             \
    }                                                                                                          \
    TS_ALIAS(name)
GRAPH_HOOK(cuGraphLaunch)
GRAPH_HOOK(cuGraphLaunch_ptsz)
