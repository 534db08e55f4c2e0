/* Open-addressing hash tables from a pointer or handle to what it was charged (caller locks). */
#include <stdlib.h>
#include <string.h>

#include "isolation.h"

#define EMPTY 0ULL
#define TOMBSTONE UINT64_MAX

static size_t slot_of(uint64_t key, size_t cap) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static int grow(ts_table *t) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    if (t->cap && t->count * 4 < t->cap) cap = t->cap; /* mostly tombstones: rehash in place size */
    ts_record *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < t->cap; i++) {
        ts_record *r = &t->slots[i];
        if (r->key == EMPTY || r->key == TOMBSTONE) continue;
        size_t j = slot_of(r->key, cap);
        while (slots[j].key != EMPTY) j = (j + 1) & (cap - 1);
        slots[j] = *r;
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    t->tombstones = 0;
    return 0;
}

/* Inserts (or replaces: the driver reused an address we still hold) a whole record, one probe. */
int ts_table_put_record(ts_table *t, const ts_record *r) {
    uint64_t key = r->key;
    if (key == EMPTY || key == TOMBSTONE) return -1;
    if ((t->count + t->tombstones + 1) * 10 > t->cap * 7 && grow(t) != 0) return -1;
    size_t j = slot_of(key, t->cap);
    size_t reuse = (size_t)-1;
    while (t->slots[j].key != EMPTY) {
        if (t->slots[j].key == key) {
            t->slots[j] = *r;
            return 0;
        }
        if (t->slots[j].key == TOMBSTONE && reuse == (size_t)-1) reuse = j;
        j = (j + 1) & (t->cap - 1);
    }
    if (reuse != (size_t)-1) {
        j = reuse;
        t->tombstones--;
    }
    t->slots[j] = *r;
    t->count++;
    return 0;
}

int ts_table_put(ts_table *t, uint64_t key, uint64_t size, int rdev, int ordinal, int kind) {
    ts_record r = {key, size, rdev, ordinal, kind, 0, 0};
    return ts_table_put_record(t, &r);
}

/* Frees slot j. When the next slot is empty no probe runs through j, so it (and the tombstones
 * just before it) become empty again: alloc/free churn leaves no tombstones to probe past. */
static void remove_at(ts_table *t, size_t j) {
    size_t mask = t->cap - 1;
    t->count--;
    if (t->slots[(j + 1) & mask].key != EMPTY) {
        t->slots[j].key = TOMBSTONE;
        t->tombstones++;
        return;
    }
    t->slots[j].key = EMPTY;
    for (size_t k = (j - 1) & mask; t->slots[k].key == TOMBSTONE && k != j; k = (k - 1) & mask) {
        t->slots[k].key = EMPTY;
        t->tombstones--;
    }
}

int ts_table_take(ts_table *t, uint64_t key, ts_record *out) {
    if (t->count == 0 || key == EMPTY || key == TOMBSTONE) return 0;
    size_t j = slot_of(key, t->cap);
    while (t->slots[j].key != EMPTY) {
        if (t->slots[j].key == key) {
            *out = t->slots[j];
            remove_at(t, j);
            return 1;
        }
        j = (j + 1) & (t->cap - 1);
    }
    return 0;
}

void ts_table_clear(ts_table *t) {
    free(t->slots);
    memset(t, 0, sizeof *t);
}

void ts_table_drop_ordinal(ts_table *t, int ordinal, int kind, uint64_t sums[TS_MAX_DEVICES]) {
    for (size_t i = 0; i < t->cap; i++) {
        ts_record *r = &t->slots[i];
        if (r->key == EMPTY || r->key == TOMBSTONE || r->ordinal != ordinal || r->kind != kind) continue;
        if (r->rdev >= 0 && r->rdev < TS_MAX_DEVICES) sums[r->rdev] += r->size;
        r->key = TOMBSTONE;
        t->count--;
        t->tombstones++;
    }
}

ts_record *ts_table_find(ts_table *t, uint64_t key) {
    if (t->count == 0 || key == EMPTY || key == TOMBSTONE) return NULL;
    size_t j = slot_of(key, t->cap);
    while (t->slots[j].key != EMPTY) {
        if (t->slots[j].key == key) return &t->slots[j];
        j = (j + 1) & (t->cap - 1);
    }
    return NULL;
}

int ts_table_take_range(ts_table *t, uint64_t lo, uint64_t hi, ts_record *out) {
    for (size_t i = 0; i < t->cap && t->count > 0; i++) {
        ts_record *r = &t->slots[i];
        if (r->key == EMPTY || r->key == TOMBSTONE || r->key < lo || r->key >= hi) continue;
        *out = *r;
        r->key = TOMBSTONE;
        t->count--;
        t->tombstones++;
        return 1;
    }
    return 0;
}
