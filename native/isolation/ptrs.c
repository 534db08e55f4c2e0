/*
 * The table of charged device pointers (cuMemAlloc and friends), sharded by address: each shard
 * has its own lock, so threads allocating and freeing at once do not queue on one lock (issue #28:
 * no lock convoy at 2 threads). Lock order: ts_tab_mu before a shard's lock.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "isolation.h"

#define SHARDS 16

/* A shard's lock is held for a hash-table operation (tens of nanoseconds): a test-and-set lock
 * (one atomic to take, a plain store to give back) that yields the CPU if the holder was
 * descheduled. */
typedef struct {
    int mu;
    ts_table t;
} __attribute__((aligned(64))) shard;

static shard g_shards[SHARDS];

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void lock(int *mu) {
    for (int spins = 0; __atomic_exchange_n(mu, 1, __ATOMIC_ACQUIRE); spins++) {
        while (__atomic_load_n(mu, __ATOMIC_RELAXED)) {
            if (++spins > 64) {
                sched_yield();
                spins = 0;
            } else {
                cpu_relax();
            }
        }
    }
}

static void unlock(int *mu) { __atomic_store_n(mu, 0, __ATOMIC_RELEASE); }

static shard *shard_of(uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    return &g_shards[h >> 60];
}

int ts_ptrs_put(const ts_record *r) {
    shard *s = shard_of(r->key);
    lock(&s->mu);
    int rc = ts_table_put_record(&s->t, r);
    unlock(&s->mu);
    return rc;
}

int ts_ptrs_take(uint64_t key, ts_record *out) {
    shard *s = shard_of(key);
    lock(&s->mu);
    int found = ts_table_take(&s->t, key, out);
    unlock(&s->mu);
    return found;
}

int ts_ptrs_find(uint64_t key, ts_record *out) {
    shard *s = shard_of(key);
    lock(&s->mu);
    ts_record *r = ts_table_find(&s->t, key);
    if (r) *out = *r;
    unlock(&s->mu);
    return r != NULL;
}

void ts_ptrs_drop_ordinal(int ordinal, int kind, uint64_t sums[TS_MAX_DEVICES]) {
    for (int i = 0; i < SHARDS; i++) {
        lock(&g_shards[i].mu);
        ts_table_drop_ordinal(&g_shards[i].t, ordinal, kind, sums);
        unlock(&g_shards[i].mu);
    }
}

void ts_ptrs_fork_prepare(void) {
    for (int i = 0; i < SHARDS; i++) lock(&g_shards[i].mu);
}

void ts_ptrs_fork_parent(void) {
    for (int i = SHARDS - 1; i >= 0; i--) unlock(&g_shards[i].mu);
}

void ts_ptrs_fork_child(void) {
    for (int i = 0; i < SHARDS; i++) {
        g_shards[i].mu = 0;
        ts_table_clear(&g_shards[i].t);
    }
}
