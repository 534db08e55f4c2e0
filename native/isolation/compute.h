/* Compute share (issue 30): the per-GPU arbiter file and the launch gate (internal).
 * Layout of the arbiter file, shared with tessera.compute.arbiter (Python): keep in step. */
#ifndef TESSERA_COMPUTE_H
#define TESSERA_COMPUTE_H

#include <stdint.h>

#include "tessera_launch_types.h"

#define TS_ARB_MAGIC 0x5455504D4F435354ULL /* "TSCOMPUT" little-endian */
#define TS_ARB_VERSION 1
#define TS_ARB_HEADER 256
#define TS_ARB_SLOTS 64
#define TS_ARB_BUCKETS 128     /* ring of 100 ms buckets of charged time: 1 s and 10 s windows */
#define TS_ARB_BUCKET_NS 100000000LL

enum { TS_ARB_OFF = 0, TS_ARB_FAIR = 1, TS_ARB_STRICT = 2 };
enum { TS_SLOT_MULTIGPU = 1, TS_SLOT_FALLBACK = 2 }; /* status bits, written by the library */

typedef struct {
    /* written by tessera-node (covered by header_crc) */
    uint64_t magic;          /* 0 */
    uint32_t version;        /* 8 */
    uint32_t header_size;    /* 12 */
    uint32_t slot_size;      /* 16 */
    uint32_t nslots;         /* 20 */
    uint32_t quantum_us;     /* 24 */
    uint32_t mode;           /* 28: TS_ARB_* */
    uint32_t grace_us;       /* 32 */
    uint32_t drain_us;       /* 36: D, bound on queued work */
    uint32_t header_crc;     /* 40: crc32 of bytes 0..40 */
    uint32_t pad0;           /* 44 */
    char pad1[16];           /* 48 */
    /* run time, written by the library */
    uint64_t lease;          /* 64: (holder slot + 1) | epoch << 16; 0 holder = free */
    int64_t lease_start;     /* 72 */
    int64_t lease_deadline;  /* 80 */
    uint32_t seq;            /* 88: futex word, bumped at every change of lease */
    uint32_t preempt;        /* 92: slot + 1 of a latency-class waiter within its request */
    int64_t last_accrual;    /* 96 */
    int64_t holder_alive;    /* 104: last launch (or wait for queued work) of the holder */
    int64_t handoffs;        /* 112 */
    int64_t holder_busy;     /* 120: when the holder's queued work should be done (estimate) */
    int64_t handoff_busy;    /* 128: at the last hand-over, when the previous holder's queue drains */
    char pad2[TS_ARB_HEADER - 136];
} ts_arb_header;

typedef struct {
    int64_t index; /* time / 100 ms */
    int64_t ns;
} ts_arb_bucket;

typedef struct {
    /* written by tessera-node (covered by cfg_crc) */
    char key[64];            /* 0: the workload's key; "" = free */
    uint32_t request_ppm;    /* 64 */
    uint32_t limit_ppm;      /* 68 */
    uint32_t klass;          /* 72: 0 batch, 1 latency (inference) */
    uint32_t weight;         /* 76: reserved (proportional split of spare time), 0 today */
    uint32_t cfg_crc;        /* 80: crc32 of bytes 0..80 */
    /* run time, written by the library */
    uint32_t status;         /* 84: TS_SLOT_* */
    int64_t demand;          /* 88: last time a process of this workload wanted the lease */
    int64_t credit;          /* 96: deficit round-robin credit (ns) */
    int64_t lcredit;         /* 104: limit token bucket (ns) */
    int64_t charged_total;   /* 112: GPU time charged, cumulative (ns) */
    int64_t leases;          /* 120 */
    int64_t wait_total;      /* 128: time spent waiting for the lease (ns) */
    int64_t launches;        /* 136: gated launches */
    char pad[256 - 144];
    ts_arb_bucket buckets[TS_ARB_BUCKETS]; /* 256 */
} ts_arb_slot;

_Static_assert(sizeof(ts_arb_header) == TS_ARB_HEADER, "header layout");
_Static_assert(sizeof(ts_arb_slot) == 256 + 16 * TS_ARB_BUCKETS, "slot layout");

uint32_t ts_crc32(const void *p, size_t n);

/* arbiter.c: the shared file and the decision rule. */
typedef struct ts_arb ts_arb;
/* Opens and validates the arbiter at path for workload key; NULL and err on failure. */
ts_arb *ts_arb_open(const char *path, const char *key, char *err, size_t errlen);
int ts_arb_mode(ts_arb *a);        /* TS_ARB_* */
int64_t ts_arb_quantum(ts_arb *a); /* ns */
int64_t ts_arb_drain(ts_arb *a);   /* ns */
void ts_arb_set_status(ts_arb *a, uint32_t bits);
/* Fast path: does this workload hold a lease that is still good at now? */
int ts_arb_holding(ts_arb *a, int64_t now);
uint64_t ts_arb_lease(ts_arb *a);       /* the lease word (holder and epoch) */
ts_arb_header *ts_arb_hdr(ts_arb *a);   /* the mapped header, for the launch fast path */
int64_t ts_arb_lease_start(ts_arb *a);
int64_t ts_arb_deadline(ts_arb *a);
/* Marks that the holder is alive and working (launching or waiting for its queue). */
void ts_arb_alive(ts_arb *a, int64_t now, int64_t busy_until);
/* Whether another workload is waiting. */
int ts_arb_others_waiting(ts_arb *a, int64_t now);
/* Whether another workload wanted this GPU within the last window_ns. */
int ts_arb_others_within(ts_arb *a, int64_t now, int64_t window_ns);
/* Waits until this workload holds the lease. Returns 0, or -1 when the arbiter turned unusable
 * (then err says why). */
int ts_arb_acquire(ts_arb *a, char *err, size_t errlen);
/* Ends our lease lease_word if it is still ours and hands it to the next workload by the rule
 * (ours again if so), charging work_ns: the GPU time of the work launched under the lease, as the
 * progress events measured it, or -1 for the time held (bounded by the time held plus the queue
 * bound). Returns what it charged, -1 if the lease was no longer ours. */
int64_t ts_arb_release(ts_arb *a, uint64_t lease_word, int64_t work_ns);
/* When the previous holder's queued work was estimated to end, at the hand-over to us. */
int64_t ts_arb_handoff_busy(ts_arb *a);
/* Adds a measured correction (ns, may be negative) to this workload's charge. */
void ts_arb_correct(ts_arb *a, int64_t ns);
int64_t ts_now(void);

/* hooks_launch.c */
void ts_compute_after_fork(void);

#endif
