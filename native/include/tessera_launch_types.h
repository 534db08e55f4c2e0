/* The slice of the CUDA driver API used for kernel launches, events and graph launches: shared by
 * the compute-share gate (libtessera-cuda.so) and the fake driver's timing model. Layouts follow
 * cuda.h (CUDA 12.x). */
#ifndef TESSERA_LAUNCH_TYPES_H
#define TESSERA_LAUNCH_TYPES_H

#include "tessera_cuda_types.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;

enum { CUDA_ERROR_NOT_READY_ = 600, CUDA_ERROR_LAUNCH_FAILED_ = 719 };
enum { CU_EVENT_DEFAULT_ = 0, CU_EVENT_DISABLE_TIMING_ = 2 };

typedef struct {
    int id;
    char pad[60];
} CUlaunchAttribute_;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute_ *attrs;
    unsigned int numAttrs;
} CUlaunchConfig_;

#endif
