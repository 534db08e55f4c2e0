/*
 * CUDA arrays (textures, surfaces): the driver does not say how much memory an array takes, so
 * the charge is an estimate made before the call: width × height × depth × element size per
 * mip level, each level rounded up to 64 KiB; formats we do not know count 16 bytes per element
 * (the largest element CUDA has), so an unknown format is over-charged, never under-charged.
 * Sparse and deferred-mapping arrays have no memory until mapped and are not charged.
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "state.h"

#define ARRAY_GRANULE (64ULL << 10)

typedef CUresult (*array_create_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array3d_create_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*mipmap_create_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult (*handle_destroy_fn)(void *);
typedef CUresult (*ctx_get_device_fn)(CUdevice *);

static uint64_t element_bytes(int format, unsigned channels) {
    uint64_t b;
    switch (format) {
    case 0x01: case 0x08: b = 1; break;            /* (UN)SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: b = 2; break; /* (UN)SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: b = 4; break; /* (UN)SIGNED_INT32, FLOAT */
    default: return 16;
    }
    if (channels == 0 || channels > 4) return 16;
    return b * channels;
}

/* Estimated bytes of an array; UINT64_MAX when the dimensions overflow. */
static uint64_t ts_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned levels) {
    uint64_t elem = element_bytes(format, channels), total = 0;
    if (levels == 0) levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1, bytes;
        if (__builtin_mul_overflow(lw, lh, &bytes) || __builtin_mul_overflow(bytes, ld, &bytes) ||
            __builtin_mul_overflow(bytes, elem, &bytes) || bytes > UINT64_MAX - ARRAY_GRANULE)
            return UINT64_MAX;
        bytes = (bytes + ARRAY_GRANULE - 1) / ARRAY_GRANULE * ARRAY_GRANULE;
        if (__builtin_add_overflow(total, bytes, &total)) return UINT64_MAX;
    }
    return total;
}

/* Charges an array about to be created on the current device; *rdev < 0 when not charged. */
static CUresult charge(uint64_t bytes, int *rdev, int *ord, const char *what) {
    *rdev = -1;
    int mode = ts_mode();
    if (mode == TS_MODE_PASSTHROUGH) return CUDA_SUCCESS;
    if (!ts_real.cuCtxGetDevice) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((ctx_get_device_fn)ts_real.cuCtxGetDevice)(ord);
    if (rc != CUDA_SUCCESS) return rc;
    if (mode == TS_MODE_FAILED) {
        ts_report_refusal(what);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ts_dev *d = ts_device(*ord);
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    if (!d->limited) return CUDA_SUCCESS;
    if (d->rdev < 0 || bytes == UINT64_MAX || ts_region_reserve(d->rdev, bytes, d->limit) != 1) {
        TS_INFO("%s of about %llu bytes on device %d refused: over the limit", what, (unsigned long long)bytes, *ord);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *rdev = d->rdev;
    return CUDA_SUCCESS;
}

static void settle(CUresult rc, void *handle, uint64_t bytes, int rdev, int ord) {
    if (rdev < 0) return;
    if (rc != CUDA_SUCCESS || !handle) {
        ts_region_release(rdev, bytes);
        return;
    }
    pthread_mutex_lock(&ts_tab_mu);
    ts_table_put(&ts_arrays, (uint64_t)(uintptr_t)handle, bytes, rdev, ord, TS_KIND_OTHER);
    pthread_mutex_unlock(&ts_tab_mu);
}

CUresult ts_hook_cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    BIND_OR_FAIL();
    NEED_REAL(cuArrayCreate_v2);
    array_create_fn real = (array_create_fn)ts_real.cuArrayCreate_v2;
    if (!desc || !handle) return real(handle, desc);
    uint64_t bytes = ts_array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels, 1);
    int rdev, ord = -1;
    CUresult rc = charge(bytes, &rdev, &ord, "cuArrayCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, desc);
    settle(rc, rc == CUDA_SUCCESS ? (void *)*handle : NULL, bytes, rdev, ord);
    return rc;
}

CUresult ts_hook_cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    BIND_OR_FAIL();
    NEED_REAL(cuArray3DCreate_v2);
    array3d_create_fn real = (array3d_create_fn)ts_real.cuArray3DCreate_v2;
    if (!desc || !handle || (desc->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)))
        return real(handle, desc);
    uint64_t bytes = ts_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1);
    int rdev, ord = -1;
    CUresult rc = charge(bytes, &rdev, &ord, "cuArray3DCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, desc);
    settle(rc, rc == CUDA_SUCCESS ? (void *)*handle : NULL, bytes, rdev, ord);
    return rc;
}

CUresult ts_hook_cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                        unsigned int levels) {
    BIND_OR_FAIL();
    NEED_REAL(cuMipmappedArrayCreate);
    mipmap_create_fn real = (mipmap_create_fn)ts_real.cuMipmappedArrayCreate;
    if (!desc || !handle || (desc->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)))
        return real(handle, desc, levels);
    uint64_t bytes =
        ts_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, levels);
    int rdev, ord = -1;
    CUresult rc = charge(bytes, &rdev, &ord, "cuMipmappedArrayCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, desc, levels);
    settle(rc, rc == CUDA_SUCCESS ? (void *)*handle : NULL, bytes, rdev, ord);
    return rc;
}

static CUresult destroy(handle_destroy_fn real, void *handle) {
    ts_record r;
    pthread_mutex_lock(&ts_tab_mu);
    int found = ts_table_take(&ts_arrays, (uint64_t)(uintptr_t)handle, &r);
    pthread_mutex_unlock(&ts_tab_mu);
    CUresult rc = real(handle);
    if (!found) return rc;
    if (rc == CUDA_SUCCESS) {
        ts_region_release(r.rdev, r.size);
    } else {
        pthread_mutex_lock(&ts_tab_mu);
        ts_table_put_record(&ts_arrays, &r);
        pthread_mutex_unlock(&ts_tab_mu);
    }
    return rc;
}

CUresult ts_hook_cuArrayDestroy(CUarray handle) {
    BIND_OR_FAIL();
    NEED_REAL(cuArrayDestroy);
    return destroy((handle_destroy_fn)ts_real.cuArrayDestroy, handle);
}

CUresult ts_hook_cuMipmappedArrayDestroy(CUmipmappedArray handle) {
    BIND_OR_FAIL();
    NEED_REAL(cuMipmappedArrayDestroy);
    return destroy((handle_destroy_fn)ts_real.cuMipmappedArrayDestroy, handle);
}

/* The pre-CUDA-3.2 ABI: 32-bit sizes in the descriptors, same estimate. */
CUresult ts_hook_cuArrayCreate(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    BIND_OR_FAIL();
    NEED_REAL(cuArrayCreate);
    CUresult (*real)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *) =
        (CUresult(*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *))ts_real.cuArrayCreate;
    if (!desc || !handle) return real(handle, desc);
    uint64_t bytes = ts_array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels, 1);
    int rdev, ord = -1;
    CUresult rc = charge(bytes, &rdev, &ord, "cuArrayCreate (unversioned)");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, desc);
    settle(rc, rc == CUDA_SUCCESS ? (void *)*handle : NULL, bytes, rdev, ord);
    return rc;
}

CUresult ts_hook_cuArray3DCreate(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    BIND_OR_FAIL();
    NEED_REAL(cuArray3DCreate);
    CUresult (*real)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *) =
        (CUresult(*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *))ts_real.cuArray3DCreate;
    if (!desc || !handle || (desc->Flags & (TS_CUDA_ARRAY3D_SPARSE | TS_CUDA_ARRAY3D_DEFERRED_MAPPING)))
        return real(handle, desc);
    uint64_t bytes = ts_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1);
    int rdev, ord = -1;
    CUresult rc = charge(bytes, &rdev, &ord, "cuArray3DCreate (unversioned)");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(handle, desc);
    settle(rc, rc == CUDA_SUCCESS ? (void *)*handle : NULL, bytes, rdev, ord);
    return rc;
}

TS_ALIAS(cuArrayCreate)
TS_ALIAS(cuArray3DCreate)
TS_ALIAS(cuArrayCreate_v2)
TS_ALIAS(cuArray3DCreate_v2)
TS_ALIAS(cuMipmappedArrayCreate)
TS_ALIAS(cuArrayDestroy)
TS_ALIAS(cuMipmappedArrayDestroy)
