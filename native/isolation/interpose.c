/*
 * How calls reach the hooks, and how the hooks reach the driver.
 *
 *  - Programs linked against libcuda bind to our exported functions (we are preloaded).
 *  - Programs and runtimes that dlopen the driver and look up entry points go through our
 *    dlsym, which substitutes a hook only for the exact names in the table below, and only when
 *    the lookup resolved to the driver's own function (or to ours).
 *  - CUDA 11.3+ runtimes fetch entry points with cuGetProcAddress[_v2]; our wrapper asks the
 *    driver (same symbol, version and flags) and swaps the returned pointer for the hook of the
 *    same ABI, recognised by address, or by name and version when the driver hands out an
 *    address that differs from its exported symbol.
 * Real entry points are looked up with the real dlsym in the driver's own handle (found by
 * soname, so a driver the program loaded by path is the one we use), never through our dlsym.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn resolve_real_dlsym(void) {
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    dlsym_fn f = NULL;
    for (int i = 0; versions[i] && !f; i++) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!f) {
        ts_log(TS_LOG_ERROR, "cannot find the C library's dlsym; driver lookups will fail");
        return NULL;
    }
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

void *ts_real_dlsym(void *handle, const char *name) {
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (!f) f = resolve_real_dlsym();
    return f ? f(handle, name) : NULL;
}

ts_real_table ts_real;

/* The exported names we interpose (and nothing else), with the library each comes from. */
static ts_hook g_hooks[] = {
#define X(name) {#name, (void *)ts_hook_##name, &ts_real.name, TS_LIB_CUDA},
    TS_CUDA_HOOKS(X)
#undef X
#define X(name) {#name, (void *)ts_hook_##name, &ts_real.name, TS_LIB_NVML},
    TS_NVML_HOOKS(X)
#undef X
};
#define N_HOOKS (sizeof g_hooks / sizeof g_hooks[0])

static const ts_hook *hook_by_name(const char *name) {
    if (name[0] != 'c' && name[0] != 'n') return NULL;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (strcmp(g_hooks[i].name, name) == 0) return &g_hooks[i];
    return NULL;
}

static pthread_mutex_t g_bind_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_bound[2];

static void *open_driver(const char *soname) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    return h;
}

/* Around fork (state.c): a child must not inherit the bind mutex locked by another thread. */
void ts_bind_lock(void) { pthread_mutex_lock(&g_bind_mu); }
void ts_bind_unlock(void) { pthread_mutex_unlock(&g_bind_mu); }
void ts_bind_reinit(void) { pthread_mutex_init(&g_bind_mu, NULL); }

static __thread int t_binding; /* this thread is inside ts_bind (a driver constructor may dlsym) */

int ts_bind(int lib) {
    if (__atomic_load_n(&g_bound[lib], __ATOMIC_ACQUIRE)) return 0;
    if (t_binding) return -1;
    t_binding = 1;
    pthread_mutex_lock(&g_bind_mu);
    if (!g_bound[lib]) {
        const char *soname = lib == TS_LIB_CUDA ? "libcuda.so.1" : "libnvidia-ml.so.1";
        void *h = open_driver(soname);
        if (!h) {
            pthread_mutex_unlock(&g_bind_mu);
            t_binding = 0;
            TS_DEBUG("cannot load %s: %s", soname, dlerror());
            return -1;
        }
        for (size_t i = 0; i < N_HOOKS; i++)
            if (g_hooks[i].lib == lib) *g_hooks[i].real = ts_real_dlsym(h, g_hooks[i].name);
        if (lib == TS_LIB_CUDA) {
#define X(name) ts_real.name = ts_real_dlsym(h, #name);
            TS_CUDA_HELPERS(X)
#undef X
        } else {
#define X(name) ts_real.name = ts_real_dlsym(h, #name);
            TS_NVML_HELPERS(X)
#undef X
        }
        __atomic_store_n(&g_bound[lib], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_bind_mu);
    t_binding = 0;
    return 0;
}

__attribute__((noinline)) static void *dlsym_hooked(void *handle, const char *name, const ts_hook *hk) {
    void *p = ts_real_dlsym(handle, name);
    if (p == NULL || p == hk->hook) return p;
    if (ts_bind(hk->lib) != 0) return p;
    if (p == *hk->real) {
        TS_DEBUG("dlsym(%s): intercepted", name);
        return hk->hook;
    }
    ts_log(TS_LOG_WARN, "dlsym(%s) resolved outside the driver library; not intercepted", name);
    return p;
}

/*
 * Every name we do not handle goes to the real dlsym as a tail call, so the C library sees the
 * original caller's return address and RTLD_NEXT / RTLD_DEFAULT keep their meaning for it.
 */
TS_EXPORT void *dlsym(void *handle, const char *name) {
    const char *n = name;
    __asm__("" : "+r"(n)); /* <dlfcn.h> says name is never NULL; a caller may still pass NULL */
    const ts_hook *hk = n ? hook_by_name(n) : NULL;
    if (__builtin_expect(hk != NULL, 0)) return dlsym_hooked(handle, name, hk);
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (__builtin_expect(f == NULL, 0)) f = resolve_real_dlsym();
    return f(handle, name);
}

/* ---- cuGetProcAddress ---- */

typedef struct {
    const char *base;
    const char *variant; /* exported symbol with this ABI */
    int since;           /* first CUDA version of that ABI */
    int ptsz;
} ts_variant;

/* Only the bases we hook; versions from cuda.h (the _vN mapping of each API). */
static const ts_variant g_variants[] = {
    {"cuMemAlloc", "cuMemAlloc_v2", 3020, 0},
    {"cuMemAllocPitch", "cuMemAllocPitch_v2", 3020, 0},
    {"cuMemFree", "cuMemFree_v2", 3020, 0},
    {"cuMemGetInfo", "cuMemGetInfo_v2", 3020, 0},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020, 0},
    {"cuMemAllocManaged", "cuMemAllocManaged", 6000, 0},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, 0},
    {"cuMemAllocAsync", "cuMemAllocAsync_ptsz", 11020, 1},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, 0},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 11020, 1},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, 0},
    {"cuMemFreeAsync", "cuMemFreeAsync_ptsz", 11020, 1},
    {"cuMemPoolCreate", "cuMemPoolCreate", 11020, 0},
    {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, 0},
    {"cuMemCreate", "cuMemCreate", 10020, 0},
    {"cuMemRelease", "cuMemRelease", 10020, 0},
    {"cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 11000, 0},
    {"cuMemMap", "cuMemMap", 10020, 0},
    {"cuMemUnmap", "cuMemUnmap", 10020, 0},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, 0},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 7000, 0},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000, 0},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, 0},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000, 0},
    {"cuCtxCreate", "cuCtxCreate_v2", 3020, 0},
    {"cuCtxCreate", "cuCtxCreate_v3", 11040, 0},
    {"cuCtxCreate", "cuCtxCreate_v4", 12050, 0},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000, 0},
    {"cuArrayCreate", "cuArrayCreate_v2", 3020, 0},
    {"cuArray3DCreate", "cuArray3DCreate_v2", 3020, 0},
    {"cuArrayDestroy", "cuArrayDestroy", 2000, 0},
    {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 5000, 0},
    {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 5000, 0},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, 0},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000, 0},
};

static void *substitute(const char *symbol, void *p, int cudaVersion, cuuint64_t flags) {
    for (size_t i = 0; i < N_HOOKS; i++)
        if (g_hooks[i].lib == TS_LIB_CUDA && *g_hooks[i].real == p) return g_hooks[i].hook;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (g_hooks[i].hook == p) return p;
    Dl_info info;
    if (dladdr(p, &info) && info.dli_sname && info.dli_saddr == p) {
        /* An exported function we did not resolve (a newer ABI of a hooked call, or another
         * library's): calling a hook of a different ABI would be worse than not hooking it. */
        for (size_t i = 0; i < sizeof g_variants / sizeof g_variants[0]; i++) {
            if (strcmp(g_variants[i].base, symbol) != 0) continue;
            ts_log(TS_LOG_ERROR, "cuGetProcAddress(%s, %d) gave %s, an ABI this library does not know: "
                   "memory obtained through it is not limited (update tessera)", symbol, cudaVersion,
                   info.dli_sname);
            break;
        }
        return p;
    }
    /* Not an exported address: decide by name, version and flags, as the driver does. */
    const ts_variant *best = NULL;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (size_t i = 0; i < sizeof g_variants / sizeof g_variants[0]; i++) {
        const ts_variant *v = &g_variants[i];
        if (strcmp(v->base, symbol) != 0 || v->since > cudaVersion || v->ptsz > want_ptsz) continue;
        if (!best || v->since > best->since || (v->ptsz && !best->ptsz)) best = v;
    }
    if (best) {
        const ts_hook *hk = hook_by_name(best->variant);
        if (hk) {
            /* A driver that does not export this variant under its name: the address it gave
             * is the real entry point of that ABI. */
            void *expected = NULL;
            __atomic_compare_exchange_n(hk->real, &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            TS_DEBUG("cuGetProcAddress(%s, %d, %llu): driver address differs from %s; intercepted by name",
                     symbol, cudaVersion, (unsigned long long)flags, best->variant);
            return hk->hook;
        }
    }
    if (hook_by_name(symbol) == NULL)
        for (size_t i = 0; i < sizeof g_variants / sizeof g_variants[0]; i++)
            if (strcmp(g_variants[i].base, symbol) == 0) {
                TS_DEBUG("cuGetProcAddress(%s, %d): an ABI older than the hooked ones; passed through", symbol,
                         cudaVersion);
                break;
            }
    return p;
}

typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

CUresult ts_hook_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (ts_bind(TS_LIB_CUDA) != 0 || !ts_real.cuGetProcAddress) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa_v1_fn)ts_real.cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = substitute(symbol, *pfn, cudaVersion, flags);
    return rc;
}

CUresult ts_hook_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult *status) {
    if (ts_bind(TS_LIB_CUDA) != 0 || !ts_real.cuGetProcAddress_v2) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa_v2_fn)ts_real.cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = substitute(symbol, *pfn, cudaVersion, flags);
    return rc;
}

TS_ALIAS(cuGetProcAddress)
TS_ALIAS(cuGetProcAddress_v2)
