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

#endif
