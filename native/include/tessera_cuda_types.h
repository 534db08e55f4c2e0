/*
 * The small subset of CUDA driver and NVML types that the isolation library, the fake driver
 * and the test programs share. Layouts follow cuda.h / nvml.h (x86_64 and aarch64 Linux); only
 * the members we read are named, the rest is padding of the documented size.
 */
#ifndef TESSERA_CUDA_TYPES_H
#define TESSERA_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
};

/* Memory pool attributes (CUmemPool_attribute) used here. */
enum {
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};

/* Context limits (CUlimit). */
enum {
    CU_LIMIT_STACK_SIZE = 0,
    CU_LIMIT_PRINTF_FIFO_SIZE = 1,
    CU_LIMIT_MALLOC_HEAP_SIZE = 2,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 3,
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4,
};

enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 };

enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
};

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;

/* The pre-CUDA-3.2 ABI: 32-bit sizes and device pointers. */
typedef unsigned int CUdeviceptr_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};

typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
};

typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* CUmemAllocationHandleType: what a VMM allocation may be exported as (cuMemExportToShareableHandle). */
enum { CU_MEM_HANDLE_TYPE_NONE = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1, CU_MEM_HANDLE_TYPE_FABRIC = 8 };
typedef struct { unsigned char data[64]; } CUmemFabricHandle;
typedef struct { char reserved[64]; } CUipcMemHandle;
enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 };

typedef struct {
    int allocType;   /* CUmemAllocationType */
    int handleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
    char bytes[16];
} CUuuid;

typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;

typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

#define TS_CUDA_ARRAY3D_SPARSE 0x40
#define TS_CUDA_ARRAY3D_DEFERRED_MAPPING 0x80

/* NVML */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define TESSERA_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

#endif
