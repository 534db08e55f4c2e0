/*
 * Adversarial programs of issue #28, third pass: memory the driver holds outside the allocation
 * calls (module globals, managed memory migrating, graphics interop) and pools shared between
 * processes. One subcommand per path; each prints, last, what the fake driver holds for this
 * process on devices 0 and 1 (its own count) and the result of the call under test:
 *     held0=BYTES held1=BYTES refused=N rc=CODE
 * tests/isolation/test_driver_held.py runs them against a 2 GiB limit.
 *
 *   module-data | module-ex | module-fatbin | module-file | library-data | library-file
 *                  load an image with 1 GiB of __device__ variables (cuModuleLoadData, ...DataEx,
 *                  cuModuleLoadFatBinary, cuModuleLoad of a file, cuLibraryLoadData,
 *                  cuLibraryLoadFromFile), then fill device 0.
 *   library-lazy   cuLibraryLoadData before any context, then a context, cuLibraryGetModule (the
 *                  library is loaded into the context there), then fill.
 *   module-gpa     cuModuleLoadData found through cuGetProcAddress, then fill.
 *   module-big     an image with 3 GiB of variables (more than the limit): rc says what happened.
 *   module-unload  1 GiB loaded and unloaded, then fill (the charge must come back).
 *   prefetch | prefetch-ptsz | prefetch-v2 | prefetch-gpa
 *                  1 GiB of managed memory on device 0 prefetched to device 1, then fill device 1.
 *   prefetch-home  the same prefetched to device 0 (its own), and to the host: allowed.
 *   pool-hold      (a helper, another process) exports an exportable pool as a descriptor,
 *                  prints "fd=N pid=P" and waits for stdin to close.
 *   pool-import P  imports the pool descriptor at path P (/proc/PID/fd/N) and an exported pointer
 *                  into it: rc of the import, import_pointer of cuMemPoolImportPointer.
 *   green          16 green contexts on device 0 (cuGreenCtxCreate), then fill.
 *   advise         cuMemAdvise(SET_PREFERRED_LOCATION, device 1) of managed memory of device 0.
 *   gl             a GL buffer of 1 GiB (fakeGlBufferCreate: the GL driver's memory), registered
 *                  with cuGraphicsGLRegisterBuffer, mapped, its pointer taken: rc of the register.
 *   pool-export    a pool created exportable, 64 MiB from it, exported as a descriptor, imported
 *                  back (cuMemPoolImportFromShareableHandle), the pointer exported and imported:
 *                  rc = the first call that failed (0: all went through).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "tessera_cuda_types.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)
#define STEP (64 * MiB)
#define CAP (4096 * MiB)

typedef void *CUmodule;
typedef void *CUlibrary;
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static void *h;
static int refused;
static CUcontext ctxs[2];

static void *need(const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "adversary5: %s not found\n", name);
        exit(3);
    }
    return p;
}

static void on(int dev) {
    if (!ctxs[dev] && ((CUresult(*)(CUcontext *, CUdevice))need("cuDevicePrimaryCtxRetain"))(&ctxs[dev], dev) != 0) {
        fprintf(stderr, "adversary5: no context on device %d\n", dev);
        exit(4);
    }
    ((CUresult(*)(CUcontext))need("cuCtxSetCurrent"))(ctxs[dev]);
}

static void fill(int dev) {
    on(dev);
    alloc_fn f = (alloc_fn)need("cuMemAlloc_v2");
    CUdeviceptr p;
    for (uint64_t total = 0; total < CAP; total += STEP)
        if (f(&p, STEP) != CUDA_SUCCESS) {
            refused++;
            break;
        }
}

static unsigned long long held(int dev) {
    unsigned long long b = 0;
    ((CUresult(*)(CUdevice, unsigned long long *))need("fakeCudaHeldBytes"))(dev, &b);
    return b;
}

static const char *image(unsigned long long bytes) {
    static char buf[64];
    snprintf(buf, sizeof buf, "FAKECUBIN globals=%llu", bytes);
    return buf;
}

static const char *image_file(unsigned long long bytes) {
    static char path[] = "/tmp/adversary5-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, image(bytes), strlen(image(bytes))) < 0) exit(5);
    close(fd);
    return path;
}

typedef CUresult (*load_fn)(CUmodule *, const void *);
typedef CUresult (*libload_fn)(CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned);
typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*prefetch2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t);

static CUdeviceptr managed_on_0(void) {
    on(0);
    CUdeviceptr p = 0;
    if (((CUresult(*)(CUdeviceptr *, size_t, unsigned))need("cuMemAllocManaged"))(&p, GiB, 1) != 0) exit(6);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *cls = argv[1];
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 3;
    if (((CUresult(*)(unsigned))need("cuInit"))(0) != 0) return 4;
    CUresult rc = 0;
    CUmodule m = NULL;
    CUlibrary lib = NULL;
    if (strcmp(cls, "library-lazy") == 0) {
        rc = ((libload_fn)need("cuLibraryLoadData"))(&lib, image(GiB), NULL, NULL, 0, NULL, NULL, 0);
        on(0);
        if (rc == 0) rc = ((CUresult(*)(CUmodule *, CUlibrary))need("cuLibraryGetModule"))(&m, lib);
        fill(0);
    } else if (strncmp(cls, "module-", 7) == 0 || strncmp(cls, "library-", 8) == 0) {
        on(0);
        if (strcmp(cls, "module-data") == 0 || strcmp(cls, "module-unload") == 0)
            rc = ((load_fn)need("cuModuleLoadData"))(&m, image(GiB));
        else if (strcmp(cls, "module-big") == 0)
            rc = ((load_fn)need("cuModuleLoadData"))(&m, image(3 * GiB));
        else if (strcmp(cls, "module-ex") == 0)
            rc = ((CUresult(*)(CUmodule *, const void *, unsigned, void *, void **))need("cuModuleLoadDataEx"))(
                &m, image(GiB), 0, NULL, NULL);
        else if (strcmp(cls, "module-fatbin") == 0)
            rc = ((load_fn)need("cuModuleLoadFatBinary"))(&m, image(GiB));
        else if (strcmp(cls, "module-file") == 0)
            rc = ((CUresult(*)(CUmodule *, const char *))need("cuModuleLoad"))(&m, image_file(GiB));
        else if (strcmp(cls, "module-gpa") == 0) {
            void *fn = NULL;
            ((gpa_fn)need("cuGetProcAddress"))("cuModuleLoadData", &fn, 12000, 0);
            rc = fn ? ((load_fn)fn)(&m, image(GiB)) : 500;
        } else if (strcmp(cls, "library-data") == 0)
            rc = ((libload_fn)need("cuLibraryLoadData"))(&lib, image(GiB), NULL, NULL, 0, NULL, NULL, 0);
        else if (strcmp(cls, "library-file") == 0)
            rc = ((CUresult(*)(CUlibrary *, const char *, void *, void **, unsigned, void *, void **, unsigned))need(
                "cuLibraryLoadFromFile"))(&lib, image_file(GiB), NULL, NULL, 0, NULL, NULL, 0);
        else
            return 2;
        if (strcmp(cls, "module-unload") == 0 && rc == 0) rc = ((CUresult(*)(CUmodule))need("cuModuleUnload"))(m);
        if (rc != 0) refused++;
        fill(0);
    } else if (strcmp(cls, "green") == 0) {
        on(0);
        int desc = 1; /* the SM partition (opaque to the fake) */
        for (int i = 0; i < 16; i++) {
            void *g = NULL;
            CUresult r = ((CUresult(*)(void **, void *, CUdevice, unsigned))need("cuGreenCtxCreate"))(&g, &desc, 0, 1);
            if (r != 0) {
                rc = r;
                refused++;
                break;
            }
        }
        fill(0);
    } else if (strcmp(cls, "prefetch-home") == 0) {
        CUdeviceptr p = managed_on_0();
        rc = ((prefetch_fn)need("cuMemPrefetchAsync"))(p, GiB, 0, NULL);
        if (rc == 0) rc = ((prefetch_fn)need("cuMemPrefetchAsync"))(p, GiB, -1, NULL);
    } else if (strcmp(cls, "pool-hold") == 0 || strcmp(cls, "pool-import") == 0) {
        on(0);
        CUmemoryPool pool = NULL;
        if (cls[5] == 'h') {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = 1;
            props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            int fd = -1;
            if (((CUresult(*)(CUmemoryPool *, const CUmemPoolProps *))need("cuMemPoolCreate"))(&pool, &props) != 0 ||
                ((CUresult(*)(void *, CUmemoryPool, int, unsigned long long))need("cuMemPoolExportToShareableHandle"))(
                    &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != 0)
                return 7;
            printf("fd=%d pid=%d\n", fd, (int)getpid());
            fflush(stdout);
            char c;
            while (read(0, &c, 1) > 0) {
            }
            return 0;
        }
        int fd = argc > 2 ? open(argv[2], O_RDONLY) : -1;
        if (fd < 0) return 8;
        rc = ((CUresult(*)(CUmemoryPool *, void *, int, unsigned long long))need("cuMemPoolImportFromShareableHandle"))(
            &pool, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        unsigned char data[64] = {1};
        CUdeviceptr q = 0;
        CUresult imp = ((CUresult(*)(CUdeviceptr *, CUmemoryPool, void *))need("cuMemPoolImportPointer"))(&q, pool, data);
        printf("import_pointer=%d\n", imp);
    } else if (strncmp(cls, "prefetch", 8) == 0) {
        CUdeviceptr p = managed_on_0();
        on(1);
        CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
        if (strcmp(cls, "prefetch") == 0) rc = ((prefetch_fn)need("cuMemPrefetchAsync"))(p, GiB, 1, NULL);
        else if (strcmp(cls, "prefetch-ptsz") == 0) rc = ((prefetch_fn)need("cuMemPrefetchAsync_ptsz"))(p, GiB, 1, NULL);
        else if (strcmp(cls, "prefetch-v2") == 0) rc = ((prefetch2_fn)need("cuMemPrefetchAsync_v2"))(p, GiB, loc, 0, NULL);
        else if (strcmp(cls, "prefetch-gpa") == 0) {
            void *fn = NULL;
            ((gpa_fn)need("cuGetProcAddress"))("cuMemPrefetchAsync", &fn, 12020, 0);
            rc = fn ? ((prefetch2_fn)fn)(p, GiB, loc, 0, NULL) : 500;
        } else
            return 2;
        if (rc != 0) refused++;
        fill(1);
    } else if (strcmp(cls, "advise") == 0) {
        CUdeviceptr p = managed_on_0();
        rc = ((CUresult(*)(CUdeviceptr, size_t, int, CUdevice))need("cuMemAdvise"))(p, GiB, 3, 1);
    } else if (strcmp(cls, "gl") == 0) {
        on(0);
        unsigned buf = 0;
        void *res = NULL;
        if (((CUresult(*)(size_t, unsigned *))need("fakeGlBufferCreate"))(GiB, &buf) != 0) return 6;
        rc = ((CUresult(*)(void **, unsigned, unsigned))need("cuGraphicsGLRegisterBuffer"))(&res, buf, 0);
        if (rc == 0) {
            CUdeviceptr p = 0;
            size_t size = 0;
            rc = ((CUresult(*)(unsigned, void **, CUstream))need("cuGraphicsMapResources"))(1, &res, NULL);
            if (rc == 0)
                rc = ((CUresult(*)(CUdeviceptr *, size_t *, void *))need("cuGraphicsResourceGetMappedPointer_v2"))(
                    &p, &size, res);
        }
    } else if (strcmp(cls, "pool-export") == 0) {
        on(0);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = 1;
        props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CUmemoryPool pool = NULL, imported = NULL;
        CUdeviceptr p = 0, q = 0;
        int fd = -1;
        unsigned char data[64];
        if ((rc = ((CUresult(*)(CUmemoryPool *, const CUmemPoolProps *))need("cuMemPoolCreate"))(&pool, &props)) == 0 &&
            (rc = ((CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))need("cuMemAllocFromPoolAsync"))(
                 &p, STEP, pool, NULL)) == 0 &&
            (rc = ((CUresult(*)(void *, CUmemoryPool, int, unsigned long long))need("cuMemPoolExportToShareableHandle"))(
                 &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == 0 &&
            (rc = ((CUresult(*)(CUmemoryPool *, void *, int, unsigned long long))need(
                 "cuMemPoolImportFromShareableHandle"))(&imported, (void *)(intptr_t)fd,
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == 0 &&
            (rc = ((CUresult(*)(void *, CUdeviceptr))need("cuMemPoolExportPointer"))(data, p)) == 0 &&
            (rc = ((CUresult(*)(CUdeviceptr *, CUmemoryPool, void *))need("cuMemPoolImportPointer"))(&q, imported,
                                                                                                    data)) == 0 &&
            q != p)
            rc = 999;
        /* Each sharing call alone too, as a program that skips the others would make it. */
        CUresult imp = ((CUresult(*)(CUdeviceptr *, CUmemoryPool, void *))need("cuMemPoolImportPointer"))(
            &q, imported ? imported : pool, data);
        printf("import_pointer=%d\n", imp);
    } else {
        return 2;
    }
    printf("held0=%llu held1=%llu refused=%d rc=%d\n", held(0), held(1), refused, rc);
    return 0;
}
