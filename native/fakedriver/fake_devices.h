/* Simulated devices shared by the fake libcuda.so.1 and libnvidia-ml.so.1 (configured by env). */
#ifndef FAKE_DEVICES_H
#define FAKE_DEVICES_H

#include <stddef.h>
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
    int mig_gi, mig_ci;    /* a MIG device of the CUDA view (CUDA_VISIBLE_DEVICES=MIG-...): its GPU
                            * and compute instance on physical device `index`; -1 for a whole GPU */
} fake_device;

/* Parses FAKE_GPU_DEVICES once ("NAME=SIZE;NAME=SIZE", SIZE with optional K/M/G/T/Ki/Mi/Gi/Ti).
 * Default: one "NVIDIA H100 80GB HBM3" with 81559 MiB. Returns the device count. */
int fake_devices_load(void);
fake_device *fake_device_get(int index);
uint64_t fake_context_bytes(void);
/* Bytes a CUDA context holds on device d (FAKE_GPU_CONTEXT_BYTES, else the model's default). */
uint64_t fake_context_bytes_on(const fake_device *d);
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
    uint32_t mig[FAKE_MAX_DEVICES]; /* the MIG device it runs on: (gi << 8 | ci) + 1; 0: whole GPU */
} fake_proc;
int fake_state_enabled(void);
void fake_state_lock(void);    /* cross-process lock for check-then-charge */
void fake_state_unlock(void);
/* Bytes live processes other than this one hold on physical device phys. */
uint64_t fake_state_others(int phys);
/* Bytes live processes other than this one hold on what device d of the CUDA view covers: the
 * whole GPU, or for a MIG device its GPU instance (the memory its compute instances share). */
uint64_t fake_state_others_on(const fake_device *d);
/* Adds delta to this process's bytes on physical device phys. */
void fake_state_add(int phys, int64_t delta);
/* Live processes (with bytes on some device) into out[0..max); returns how many. */
int fake_state_procs(fake_proc *out, int max);

/* ---- MIG (Multi-Instance GPU) ----
 * A device whose product is MIG-capable (A100, H100, H200) and whose FAKE_GPU_MIG_<i> is 1 is in
 * MIG mode; the fake never changes the mode (an operator's choice, as on a real node). GPU and
 * compute instances live in the cross-process state (FAKE_GPU_STATE), so the instances one
 * process creates are what another process sees; without it they live in the process. The
 * geometry is NVIDIA's (MIG user guide, "Supported MIG Profiles", and the placements
 * `nvidia-smi mig -lgipp` lists), the same table tessera.core.mig holds. */
#define FAKE_MIG_SLOTS 8      /* memory slots; placements are in these units */
#define FAKE_MIG_COMPUTE 7    /* compute slices */
#define FAKE_MIG_MAX_GI 8
#define FAKE_MIG_MAX_CI 8
#define FAKE_MIG_IDS 16       /* GPU instance ids are 1..15 */

typedef struct {
    const char *name;     /* "1g.5gb", as NVML names it after "MIG " */
    unsigned index;       /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned id;          /* the profile id NVML reports and creation takes */
    unsigned compute;     /* compute slices */
    unsigned slots;       /* memory slots covered (the placement size) */
    unsigned starts;      /* bit s set: may start at memory slot s */
    unsigned max_count;   /* instances of this profile one GPU holds at most */
    unsigned sms;         /* multiprocessors */
    unsigned long long memory_mib;
} fake_mig_profile;

typedef struct {
    uint32_t live, id, profile, start;      /* profile: index into the model's table */
    uint32_t ci_live[FAKE_MIG_MAX_CI];      /* compute instance ids are the array index */
    uint32_t ci_slices[FAKE_MIG_MAX_CI], ci_start[FAKE_MIG_MAX_CI];
    uint64_t ci_serial[FAKE_MIG_MAX_CI];    /* from the machine-wide counter: the MIG UUID */
} fake_gi;

typedef struct {
    uint64_t serial;
    fake_gi gi[FAKE_MAX_DEVICES][FAKE_MIG_MAX_GI];
} fake_mig_state;

/* The device's MIG profile table (NULL, *n = 0 when the product has no MIG). */
const fake_mig_profile *fake_mig_profiles(const fake_device *d, int *n);
/* Whether the device is in MIG mode now: FAKE_GPU_MIG_<i> at load, or, with
 * FAKE_GPU_MIG_MODE_DIR, the file DIR/<i> ("1" on, anything else off) read at each call where
 * it exists: an operator switching MIG mode (nvidia-smi -mig 1 and a reset) while processes run. */
int fake_mig_mode(const fake_device *d);
/* The shared MIG state; call between fake_state_lock and fake_state_unlock. */
fake_mig_state *fake_mig_state_get(void);
/* "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of a compute instance (serial), and its bytes. */
void fake_mig_uuid(const fake_device *d, uint64_t serial, char *out, size_t len, unsigned char bytes[16]);
/* The physical device, GI and CI of a MIG UUID that exists now; 0 when none. */
int fake_mig_find(const char *uuid, int *phys, unsigned *gi, unsigned *ci);
/* ---- NVML per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1, driver branch r615+) ----
 * A limit names a cgroup by its sysfs path ("/sys/fs/cgroup/memory/kubepods/.../pod<uid>" on
 * cgroup v1, "/sys/fs/cgroup/kubepods.slice/..." on v2) and binds every process in that cgroup
 * or below it: their device memory together (allocations and contexts, as NVML counts a
 * process's memory) may not pass hardLimit on that GPU. Kept in FAKE_GPU_STATE, so the agent
 * that sets a limit and the processes it binds see the same table. A limit whose cgroup no
 * longer exists is gone, as the driver clears it when the cgroup is removed. */
#define FAKE_MEMLIMIT_SLOTS 64
#define FAKE_MEMLIMIT_MIN_BRANCH 615
typedef struct {
    uint32_t live, phys;
    uint64_t soft, hard;
    char cgroup[232];
} fake_memlimit;
typedef struct { fake_memlimit e[FAKE_MEMLIMIT_SLOTS]; } fake_memlimit_table;
/* The table in the shared state; NULL without FAKE_GPU_STATE. Between lock and unlock. */
fake_memlimit_table *fake_memlimits_get(void);
/* The driver branch FAKE_NVML_DRIVER_VERSION names (its major number; default 570). */
int fake_driver_branch(void);
/* NVML_SUCCESS or the NVML error of setting (soft 0 and hard UINT64_MAX: clearing) a limit. */
int fake_memlimit_set(int phys, const char *cgroup, uint64_t soft, uint64_t hard);
/* The limit set for exactly that cgroup (0 / UINT64_MAX when none) and what it uses now. */
int fake_memlimit_get(int phys, const char *cgroup, uint64_t *soft, uint64_t *hard, uint64_t *used);
/* Bytes this process may still allocate on physical device phys under every limit of its
 * cgroup and its ancestors (UINT64_MAX when none); call under fake_state_lock. */
uint64_t fake_memlimit_room(int phys);

/* Where the host's /proc is: FAKE_HOST_PROC (a container given the host's /proc there, the test
 * world's stand-in for the kernel driver, which knows every process by its host pid), else
 * /proc. Pids in the shared state and in NVML's answers are the host's either way. */
const char *fake_host_proc(void);
/* This process's pid as the driver knows it (the host's, also inside a PID namespace). */
int fake_self_pid(void);

#endif
