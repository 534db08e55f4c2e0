/* Simulated devices shared by the fake libcuda.so.1 and libnvidia-ml.so.1 (configured by env). */
#ifndef FAKE_DEVICES_H
#define FAKE_DEVICES_H

#include <stdint.h>

#define FAKE_MAX_DEVICES 16

typedef struct {
    char name[96];
    uint64_t total;        /* physical bytes */
    uint64_t other_used;   /* bytes used by processes outside this one (FAKE_GPU_USED_<i>) */
    unsigned char uuid[16];
    char uuid_str[48];     /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
    int index;             /* physical (NVML) index */
    int mig;               /* MIG mode (FAKE_GPU_MIG_<i>=1) */
    int util;              /* FAKE_GPU_UTIL_<i> (percent), -1: derived from the processes */
} fake_device;

/* Parses FAKE_GPU_DEVICES once ("NAME=SIZE;NAME=SIZE", SIZE with optional K/M/G/T/Ki/Mi/Gi/Ti).
 * Default: one "NVIDIA H100 80GB HBM3" with 81559 MiB. Returns the device count. */
int fake_devices_load(void);
fake_device *fake_device_get(int index);
uint64_t fake_context_bytes(void);
/* The CUDA view: devices listed by CUDA_VISIBLE_DEVICES (indexes or GPU-UUID prefixes, parsing
 * stops at the first entry that matches nothing, as CUDA does), in that order; all when unset.
 * NVML ignores CUDA_VISIBLE_DEVICES and sees every device. */
int fake_cuda_count(void);
fake_device *fake_cuda_device(int ordinal);


/* Cross-process state (FAKE_GPU_STATE=PATH, a file shared by every process of one simulated
 * machine): each process using the fake CUDA publishes its bytes per device in a slot, so the
 * fake NVML lists processes with their memory and utilisation, and a process's free memory is
 * what the others left, as on one real GPU. A process that exits (or is killed) stops counting,
 * as the real driver frees its memory. Without FAKE_GPU_STATE every call below is a no-op and
 * each process sees only its own allocations (the behaviour the isolation tests rely on). */
#define FAKE_STATE_SLOTS 512
typedef struct {
    int pid;
    unsigned sm_util;   /* FAKE_GPU_SM_UTIL of that process (percent) */
    uint64_t used[FAKE_MAX_DEVICES];
} fake_proc;
int fake_state_enabled(void);
void fake_state_lock(void);    /* cross-process lock for check-then-charge */
void fake_state_unlock(void);
/* Bytes live processes other than this one hold on physical device phys. */
uint64_t fake_state_others(int phys);
/* Adds delta to this process's bytes on physical device phys. */
void fake_state_add(int phys, int64_t delta);
/* Live processes (with bytes on some device) into out[0..max); returns how many. */
int fake_state_procs(fake_proc *out, int max);

#endif
