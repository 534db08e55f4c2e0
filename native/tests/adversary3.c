/*
 * Adversarial programs of issue #28 (third isolation pass), one subcommand per way around the
 * limit or across tenants. Each prints, last, what the fake driver holds for the processes it
 * ran (the driver's own count):  held0=BYTES held1=BYTES refused=N
 * tests/isolation/test_adversary3.py runs them and checks the numbers against the limit.
 *
 *   fd-reuse REGION   a child holds memory; the parent closes the library's region descriptor,
 *                     puts another file at that number, and presses on the limit (a refusal
 *                     sweeps for dead processes): the child's usage must not be erased.
 *   dlsym-newer NAME  dlsym of an exported newer ABI of a hooked call (cuMemAlloc_v3 ...), then
 *                     allocates with it.
 *   dlvsym-newer NAME the same through dlvsym.
 *   driver-path PATH  dlopen of a renamed copy of the driver by its full path (nothing named
 *                     libcuda.so.1 is loadable), then dlsym cuMemAlloc_v2 in it.
 *   dlmopen-late LIB  dlmopen of a library that does not hold the driver (it loads it later,
 *                     inside its own namespace): must be refused while limits are active.
 *   env-clear -       clearenv() before the first CUDA call, then allocates.
 *   env-rewrite -     TESSERA_GPU_MEMORY_LIMIT rewritten to 1000G (setenv, and the original
 *                     string overwritten in place) before the first CUDA call.
 *   config-repoint F  TESSERA_GPU_CONFIG pointed at the program's own file F (no limits in it:
 *                     a device line of 1000G) before the first CUDA call.
 *   ctx-heaps -       a malloc heap (cuCtxSetLimit) in each of four contexts, then cuMemAlloc.
 *   pool-sync-free -  pool allocations freed by the synchronous cuMemFree, then cuMemAlloc.
 *   alloc -           allocates up to the limit (built with ASan as adversary3_asan).
 *   preinit -         the driver is opened and filled from .preinit_array, where `environ` is
 *                     still NULL, before the library's constructor ran.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda_types.h"

#define MiB (1ULL << 20)
#define STEP (64 * MiB)
#define CAP (4096 * MiB)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static void *h;
static int refused;

static void *need(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "adversary3: %s not found\n", name);
        exit(3);
    }
    return p;
}

static void start(void *lib, int dev) {
    CUcontext ctx = NULL;
    if (((CUresult(*)(unsigned))need(lib, "cuInit"))(0) != 0) exit(4);
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain");
    if (!retain || retain(&ctx, dev) != 0) {
        refused++;
        return;
    }
    ((CUresult(*)(CUcontext))need(lib, "cuCtxSetCurrent"))(ctx);
}

static uint64_t fill(alloc_fn f) {
    CUdeviceptr p;
    uint64_t total = 0;
    if (!f) {
        refused++;
        return 0;
    }
    for (; total < CAP; total += STEP)
        if (f(&p, STEP) != CUDA_SUCCESS) {
            refused++;
            break;
        }
    return total;
}

static unsigned long long held_in(void *lib, int dev) {
    unsigned long long b = 0;
    CUresult (*held)(CUdevice, unsigned long long *) = (CUresult(*)(CUdevice, unsigned long long *))dlsym(lib, "fakeCudaHeldBytes");
    if (held) held(dev, &b);
    return b;
}

static int region_fd(const char *path) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char link[300], target[4096];
    int found = -1;
    while (d && (e = readdir(d))) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strcmp(target, path) == 0) found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

static int fd_reuse(const char *region) {
    int up[2], down[2];
    if (pipe(up) || pipe(down)) return 5;
    pid_t child = fork();
    if (child == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        start(lib, 0);
        alloc_fn f = (alloc_fn)need(lib, "cuMemAlloc_v2");
        CUdeviceptr p;
        for (int i = 0; i < 16; i++) /* 1 GiB: half of the workload's 2 GiB limit */
            if (f(&p, STEP) != CUDA_SUCCESS) _exit(8);
        unsigned long long b = held_in(lib, 0);
        if (write(up[1], &b, sizeof b) != sizeof b) _exit(6);
        char c;
        if (read(down[0], &c, 1) < 0) _exit(6); /* alive (and holding) until the parent is done */
        _exit(0);
    }
    unsigned long long child_held = 0;
    if (read(up[0], &child_held, sizeof child_held) != sizeof child_held) return 6;
    h = dlopen("libcuda.so.1", RTLD_NOW);
    start(h, 0);
    int fd = region_fd(region);
    if (fd < 0) {
        fprintf(stderr, "adversary3: the region %s is not open in this process\n", region);
        return 7;
    }
    close(fd);
    int other = open("/dev/null", O_RDWR);
    if (other != fd) dup2(other, fd);
    alloc_fn f = (alloc_fn)need(h, "cuMemAlloc_v2");
    fill(f); /* a refusal sweeps the region for dead processes */
    struct timespec pause = {0, 30 * 1000000L};
    nanosleep(&pause, NULL);
    fill(f);
    printf("held0=%llu held1=%llu refused=%d\n", held_in(h, 0) + child_held, held_in(h, 1), refused);
    fflush(stdout);
    if (write(down[1], "x", 1) != 1) return 6;
    waitpid(child, NULL, 0);
    return 0;
}

/* .preinit_array: runs before every constructor, the library's included. */
static unsigned long long g_preinit_held;
static int g_preinit_refused;
static void preinit(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 2 || strcmp(argv[1], "preinit") != 0) return;
    extern char **environ;
    char **saved = environ;
    environ = NULL; /* as the C library leaves it this early */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib) {
        start(lib, 0);
        uint64_t before = refused;
        fill((alloc_fn)dlsym(lib, "cuMemAlloc_v2"));
        g_preinit_refused = (int)(refused - before);
        g_preinit_held = held_in(lib, 0);
    }
    environ = saved;
}
__attribute__((section(".preinit_array"), used)) static void (*preinit_entry)(int, char **, char **) = preinit;

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: adversary3 CLASS ARG\n");
        return 2;
    }
    const char *c = argv[1];
    if (strcmp(c, "fd-reuse") == 0) return fd_reuse(argv[2]);
    if (strcmp(c, "preinit") == 0) {
        printf("held0=%llu held1=0 refused=%d\n", g_preinit_held, g_preinit_refused + refused);
        return 0;
    }
    if (strcmp(c, "env-clear") == 0) {
        clearenv();
    } else if (strcmp(c, "env-rewrite") == 0) {
        char *v = getenv("TESSERA_GPU_MEMORY_LIMIT");
        if (v && strlen(v) >= 2) {
            memset(v, '9', strlen(v) - 1); /* the original string, in place */
            v[strlen(v) - 1] = 'G';
        }
        setenv("TESSERA_GPU_MEMORY_LIMIT", "1000G", 1);
    } else if (strcmp(c, "config-repoint") == 0) {
        setenv("TESSERA_GPU_CONFIG", argv[2], 1);
    }
    if (strncmp(c, "env-", 4) == 0 || strcmp(c, "config-repoint") == 0) {
        h = dlopen("libcuda.so.1", RTLD_NOW);
        if (!h) return 3;
        start(h, 0);
        fill((alloc_fn)need(h, "cuMemAlloc_v2"));
        printf("held0=%llu held1=%llu refused=%d\n", held_in(h, 0), held_in(h, 1), refused);
        return 0;
    }
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (strcmp(c, "driver-path") == 0) {
        /* Nothing named libcuda.so.1 can be loaded: only the copy at PATH. */
        void *copy = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!copy) {
            fprintf(stderr, "adversary3: %s\n", dlerror());
            return 3;
        }
        start(copy, 0);
        fill((alloc_fn)dlsym(copy, "cuMemAlloc_v2"));
        printf("held0=%llu held1=%llu refused=%d\n", held_in(copy, 0), held_in(copy, 1), refused);
        return 0;
    }
    if (!h) {
        fprintf(stderr, "adversary3: %s\n", dlerror());
        return 3;
    }
    if (strcmp(c, "ctx-heaps") == 0) {
        /* A 512 MiB malloc heap in the primary context and in three more contexts (each context
         * has its own), then more memory with cuMemAlloc. */
        start(h, 0);
        CUcontext primary;
        ((CUresult(*)(CUcontext *))need(h, "cuCtxGetCurrent"))(&primary);
        CUresult (*setlimit)(int, size_t) = (CUresult(*)(int, size_t))need(h, "cuCtxSetLimit");
        if (setlimit(CU_LIMIT_MALLOC_HEAP_SIZE, 512 * MiB) != 0) refused++;
        for (int i = 0; i < 3; i++) {
            CUcontext x;
            if (((CUresult(*)(CUcontext *, unsigned, CUdevice))need(h, "cuCtxCreate_v2"))(&x, 0, 0) != 0) {
                refused++;
                continue;
            }
            if (setlimit(CU_LIMIT_MALLOC_HEAP_SIZE, 512 * MiB) != 0) refused++;
        }
        ((CUresult(*)(CUcontext))need(h, "cuCtxSetCurrent"))(primary);
        fill((alloc_fn)need(h, "cuMemAlloc_v2"));
    } else if (strcmp(c, "pool-sync-free") == 0) {
        /* Stream-ordered allocations (a pool that keeps what is freed) freed through the
         * synchronous cuMemFree, then more memory with cuMemAlloc. */
        start(h, 0);
        CUmemoryPool pool;
        ((CUresult(*)(CUmemoryPool *, CUdevice))need(h, "cuDeviceGetDefaultMemPool"))(&pool, 0);
        cuuint64_t keep = UINT64_MAX;
        ((CUresult(*)(CUmemoryPool, int, void *))need(h, "cuMemPoolSetAttribute"))(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        CUstream s;
        ((CUresult(*)(CUstream *, unsigned))need(h, "cuStreamCreate"))(&s, 0);
        CUdeviceptr ptrs[64];
        int n = 0;
        for (; n < 64; n++)
            if (((CUresult(*)(CUdeviceptr *, size_t, CUstream))need(h, "cuMemAllocAsync"))(&ptrs[n], STEP, s) != 0) {
                refused++;
                break;
            }
        for (int i = 0; i < n; i++) ((CUresult(*)(CUdeviceptr))need(h, "cuMemFree_v2"))(ptrs[i]);
        fill((alloc_fn)need(h, "cuMemAlloc_v2"));
    } else if (strcmp(c, "alloc") == 0) { /* plain: as built (adversary3_asan: with AddressSanitizer) */
        start(h, 0);
        fill((alloc_fn)need(h, "cuMemAlloc_v2"));
    } else if (strcmp(c, "dlsym-newer") == 0) {
        start(h, 0);
        fill((alloc_fn)dlsym(h, argv[2]));
    } else if (strcmp(c, "dlvsym-newer") == 0) {
        start(h, 0);
        void *f = dlvsym(h, argv[2], "GLIBC_2.2.5");
        if (!f) f = dlvsym(h, argv[2], "libcuda.so.1");
        if (!f) fprintf(stderr, "adversary3: dlvsym found nothing: %s\n", dlerror());
        fill((alloc_fn)f);
    } else if (strcmp(c, "dlmopen-late") == 0) {
        start(h, 0);
        void *plugin = dlmopen(LM_ID_NEWLM, argv[2], RTLD_NOW);
        if (!plugin) {
            refused++;
        } else {
            /* The plugin loads the driver inside its namespace and allocates there. */
            uint64_t (*go)(void) = (uint64_t(*)(void))dlsym(plugin, "plugin_fill");
            if (go) go();
        }
        unsigned long long other = 0;
        if (plugin) {
            unsigned long long (*held)(void) = (unsigned long long (*)(void))dlsym(plugin, "plugin_held");
            if (held) other = held();
        }
        printf("held0=%llu held1=%llu refused=%d\n", held_in(h, 0) + other, held_in(h, 1), refused);
        return 0;
    } else {
        fprintf(stderr, "adversary3: unknown class %s\n", c);
        return 2;
    }
    printf("held0=%llu held1=%llu refused=%d\n", held_in(h, 0), held_in(h, 1), refused);
    return 0;
}
