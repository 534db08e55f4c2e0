/* Process state shared by the hooks (internal). Lock order: init mutex, ts_tab_mu, region. */
#ifndef TESSERA_STATE_H
#define TESSERA_STATE_H

#include "interpose.h"

typedef struct {
    int ready;
    int limited;
    uint64_t limit;
    int rdev; /* region device index; -1 (limited) refuses everything */
    char uuid[TS_UUID_LEN];
} ts_dev;

extern ts_config ts_cfg;
extern pthread_mutex_t ts_tab_mu;
extern ts_table ts_ptrs, ts_handles, ts_maps, ts_ctxs, ts_pools, ts_arrays;
extern int ts_primary_refs[TS_MAX_DEVICES];
extern int ts_custom_ctxs[TS_MAX_DEVICES];

/* Loads configuration and attaches the region on first use; returns TS_MODE_*. */
int ts_mode(void);
/* The state of a CUDA device ordinal (resolved on first use), or NULL when out of range. */
ts_dev *ts_device(int ordinal);
void ts_report_refusal(const char *what);
void ts_format_uuid(const unsigned char *u, char *out, size_t len);

#endif
