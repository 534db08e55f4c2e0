/*
 * Adversarial programs of issue #28 class 3 (memory the driver holds that stops being charged),
 * one subcommand per path. Each prints, last, what the fake driver holds for this process (the
 * driver's own count):  held0=BYTES refused=N
 * tests/isolation/test_class3.py runs them and checks the numbers against the limit.
 *
 *   vmm-fd-import -     cuMemCreate 1 GiB (exportable as a descriptor), export it, import the
 *                       descriptor back, release the original, map the imported handle; then fill.
 *   vmm-fd-held -       the same allocation exported, the handle released, nothing mapped: the
 *                       descriptor alone keeps the memory; then fill.
 *   vmm-fabric-import - as vmm-fd-import with a fabric handle.
 *   ipc-open -          a child allocates 1 GiB and sends its IPC handle; this process opens it
 *                       (the driver keeps it alive for the opener) and fills; the child exits.
 *   pool-import -       cuMemPoolImportFromShareableHandle / cuMemPoolImportPointer (refused or
 *                       charged).
 *   hold-free SIZE F    (a helper, another tenant) allocates SIZE, waits for file F, frees all but
 *                       10 MiB of it and creates F.done; then waits for stdin to close.
 *   ctx-fill -          the primary context (measured by the library at creation), then fill.
 *   region-write PATH   class 7: writes the shared region file PATH (the device total back to 0)
 *                       before every allocation while filling; prints, then waits for stdin to
 *                       close (so the node agent can see it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda_types.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)
#define STEP (64 * MiB)
#define CAP (4096 * MiB)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static void *h;
static int refused;

static void *need(const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "adversary4: %s not found\n", name);
        exit(3);
    }
    return p;
}

static void start(void) {
    CUcontext ctx = NULL;
    if (((CUresult(*)(unsigned))need("cuInit"))(0) != 0) exit(4);
    if (((CUresult(*)(CUcontext *, CUdevice))need("cuDevicePrimaryCtxRetain"))(&ctx, 0) != 0) {
        refused++;
        return;
    }
    ((CUresult(*)(CUcontext))need("cuCtxSetCurrent"))(ctx);
}

static void fill(void) {
    alloc_fn f = (alloc_fn)need("cuMemAlloc_v2");
    CUdeviceptr p;
    for (uint64_t total = 0; total < CAP; total += STEP)
        if (f(&p, STEP) != CUDA_SUCCESS) {
            refused++;
            break;
        }
}

static unsigned long long held(void) {
    unsigned long long b = 0;
    CUresult (*fn)(CUdevice, unsigned long long *) = (CUresult(*)(CUdevice, unsigned long long *))dlsym(h, "fakeCudaHeldBytes");
    if (fn) fn(0, &b);
    return b;
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
typedef CUresult (*import_fn)(CUmemGenericAllocationHandle *, void *, int);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);

/* how: 0 = import the descriptor back and map it; 1 = keep only the descriptor; 2 = fabric. */
static void vmm_shared(int how) {
    start();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    int type = how == 2 ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.requestedHandleTypes = type;
    CUmemGenericAllocationHandle a, b;
    if (((create_fn)need("cuMemCreate"))(&a, GiB, &prop, 0) != CUDA_SUCCESS) {
        refused++;
        return;
    }
    int fd = -1;
    CUmemFabricHandle fab;
    void *out = how == 2 ? (void *)&fab : (void *)&fd;
    if (((export_fn)need("cuMemExportToShareableHandle"))(out, a, type, 0) != CUDA_SUCCESS) {
        refused++;
        return;
    }
    if (how == 1) {
        ((release_fn)need("cuMemRelease"))(a); /* only the descriptor holds it now */
        return;
    }
    void *os = how == 2 ? (void *)&fab : (void *)(intptr_t)fd;
    if (((import_fn)need("cuMemImportFromShareableHandle"))(&b, os, type) != CUDA_SUCCESS) {
        refused++;
        return;
    }
    ((release_fn)need("cuMemRelease"))(a);
    if (fd >= 0) close(fd);
    CUdeviceptr va;
    if (((reserve_fn)need("cuMemAddressReserve"))(&va, GiB, 0, 0, 0) != CUDA_SUCCESS ||
        ((map_fn)need("cuMemMap"))(va, GiB, 0, b, 0) != CUDA_SUCCESS)
        refused++;
    ((release_fn)need("cuMemRelease"))(b); /* mapped: still held */
}

static int ipc_open(void) {
    int up[2], down[2];
    if (pipe(up) || pipe(down)) return 5;
    pid_t child = fork();
    if (child == 0) {
        h = dlopen("libcuda.so.1", RTLD_NOW);
        start();
        CUdeviceptr p;
        CUipcMemHandle ih;
        if (((alloc_fn)need("cuMemAlloc_v2"))(&p, GiB) != CUDA_SUCCESS) _exit(8);
        if (((CUresult(*)(CUipcMemHandle *, CUdeviceptr))need("cuIpcGetMemHandle"))(&ih, p) != CUDA_SUCCESS) _exit(9);
        if (write(up[1], &ih, sizeof ih) != sizeof ih) _exit(6);
        char c;
        if (read(down[0], &c, 1) < 0) _exit(6);
        _exit(0); /* the exporter goes; the opener's mapping keeps the memory */
    }
    CUipcMemHandle ih;
    if (read(up[0], &ih, sizeof ih) != sizeof ih) return 6;
    h = dlopen("libcuda.so.1", RTLD_NOW);
    start();
    CUdeviceptr p;
    CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned) =
        (CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned))need("cuIpcOpenMemHandle_v2");
    if (open_fn(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) refused++;
    if (write(down[1], "x", 1) != 1) return 6;
    waitpid(child, NULL, 0);
    fill();
    return 0;
}

static int hold_free(uint64_t size, const char *flag) {
    h = dlopen("libcuda.so.1", RTLD_NOW);
    start();
    CUdeviceptr big, small;
    if (((alloc_fn)need("cuMemAlloc_v2"))(&big, size - 10 * MiB) != CUDA_SUCCESS ||
        ((alloc_fn)need("cuMemAlloc_v2"))(&small, 10 * MiB) != CUDA_SUCCESS)
        return 8;
    printf("holding\n");
    fflush(stdout);
    struct stat st;
    for (int i = 0; i < 6000 && stat(flag, &st) != 0; i++) usleep(5000);
    ((CUresult(*)(CUdeviceptr))need("cuMemFree_v2"))(big); /* another tenant frees, mid-creation */
    char done[4096];
    snprintf(done, sizeof done, "%s.done", flag);
    int fd = open(done, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

static int region_write(const char *path) {
    h = dlopen("libcuda.so.1", RTLD_NOW);
    start();
    int fd = open(path, O_RDWR);
    if (fd < 0) return 5;
    unsigned char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 5;
    alloc_fn f = (alloc_fn)need("cuMemAlloc_v2");
    CUdeviceptr p;
    for (uint64_t total = 0; total < CAP; total += STEP) {
        __atomic_store_n((uint64_t *)(m + 128 + 72), 0, __ATOMIC_SEQ_CST); /* devices[0].used */
        if (f(&p, STEP) != CUDA_SUCCESS) {
            refused++;
            break;
        }
    }
    printf("held0=%llu refused=%d\n", held(), refused);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *c = argv[1];
    if (strcmp(c, "hold-free") == 0) return argc < 4 ? 2 : hold_free(strtoull(argv[2], NULL, 10), argv[3]);
    if (strcmp(c, "region-write") == 0) return argc < 3 ? 2 : region_write(argv[2]);
    if (strcmp(c, "ipc-open") == 0) {
        int rc = ipc_open();
        if (rc) return rc;
    } else {
        h = dlopen("libcuda.so.1", RTLD_NOW);
        if (!h) return 2;
        if (strcmp(c, "vmm-fd-import") == 0) vmm_shared(0);
        else if (strcmp(c, "vmm-fd-held") == 0) vmm_shared(1);
        else if (strcmp(c, "vmm-fabric-import") == 0) vmm_shared(2);
        else if (strcmp(c, "ctx-fill") == 0) start();
        else {
            fprintf(stderr, "adversary4: unknown class %s\n", c);
            return 2;
        }
        fill();
    }
    printf("held0=%llu refused=%d\n", held(), refused);
    return 0;
}
