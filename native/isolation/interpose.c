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
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);
static dlsym_fn g_real_dlsym;
static dlvsym_fn g_real_dlvsym;
static dlopen_fn g_real_dlopen;
static dlmopen_fn g_real_dlmopen;

/*
 * The C library's own dl* functions. This library exports dlsym, dlvsym, dlopen and dlmopen, so
 * any call to those names from here would reach our own; the C library's are found in its
 * dynamic symbol table (GNU hash), walking the loader's list of loaded objects (_r_debug).
 *
 * Coexistence (issue #28 class 6): another interposer preloaded before this library (a sanitizer
 * runtime, VirtualGL, a profiler) may call our dlsym while it initialises, before its own
 * interceptors of strcmp, dl_iterate_phdr and the like can forward anywhere. So nothing on the
 * path of dlsym for a name we do not handle calls an interposable function: string compares are
 * our own (ts_streq), and the C library is found through _r_debug, not dl_iterate_phdr (an
 * interceptor of which resolving itself through dlsym recursed without end).
 */
/* The same path runs while a sanitizer runtime initialises (before its shadow memory exists), so
 * in the library's own sanitizer build (the fuzzer's) it is not instrumented. */
#if defined(__SANITIZE_ADDRESS__)
#define TS_EARLY __attribute__((no_sanitize_address, no_sanitize_undefined))
#else
#define TS_EARLY
#endif

TS_EARLY static int ts_streq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

TS_EARLY static int is_libc_path(const char *p) {
    /* "/libc.so" anywhere in the path */
    for (; p && *p; p++)
        if (p[0] == '/' && p[1] == 'l' && p[2] == 'i' && p[3] == 'b' && p[4] == 'c' && p[5] == '.' &&
            p[6] == 's' && p[7] == 'o')
            return 1;
    return 0;
}

TS_EARLY static uint32_t gnu_hash(const char *s) {
    uint32_t h = 5381;
    for (; *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

TS_EARLY static void *lookup_in(ElfW(Addr) base, const ElfW(Dyn) *dyn, const char *name) {
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        ElfW(Addr) v = dyn->d_un.d_ptr;
        if (v < base) v += base; /* not relocated in place on every architecture */
        if (dyn->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)v;
        else if (dyn->d_tag == DT_STRTAB) strtab = (const char *)v;
        else if (dyn->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)v;
    }
    if (!symtab || !strtab || !gnu) return NULL;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
    const uint32_t *buckets = gnu + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name);
    if (nbuckets == 0) return NULL;
    uint32_t i = buckets[h % nbuckets];
    if (i < symoffset) return NULL;
    for (;; i++) {
        uint32_t h2 = chain[i - symoffset];
        const ElfW(Sym) *sym = &symtab[i];
        if ((h | 1) == (h2 | 1) && sym->st_shndx != SHN_UNDEF && ts_streq(strtab + sym->st_name, name))
            return (void *)(base + sym->st_value);
        if (h2 & 1) break;
    }
    return NULL;
}

extern struct r_debug _r_debug;

TS_EARLY static void *libc_sym(const char *name) {
    for (struct link_map *l = _r_debug.r_map; l; l = l->l_next)
        if (is_libc_path(l->l_name) && l->l_ld) return lookup_in(l->l_addr, l->l_ld, name);
    return NULL;
}

TS_EARLY static dlsym_fn resolve_real_dlsym(void) {
    dlsym_fn f = (dlsym_fn)libc_sym("dlsym");
    if (!f) {
        ts_log(TS_LOG_ERROR, "cannot find the C library's dlsym; driver lookups will fail");
        return NULL;
    }
    __atomic_store_n(&g_real_dlvsym, (dlvsym_fn)libc_sym("dlvsym"), __ATOMIC_RELEASE);
    __atomic_store_n(&g_real_dlopen, (dlopen_fn)libc_sym("dlopen"), __ATOMIC_RELEASE);
    __atomic_store_n(&g_real_dlmopen, (dlmopen_fn)libc_sym("dlmopen"), __ATOMIC_RELEASE);
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

TS_EARLY void *ts_real_dlsym(void *handle, const char *name) {
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

TS_EARLY static const ts_hook *hook_by_name(const char *name) {
    if (name[0] != 'c' && name[0] != 'n') return NULL;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (ts_streq(g_hooks[i].name, name)) return &g_hooks[i];
    return NULL;
}

static int hooked_base(const char *symbol);

/* The base of an entry point's name: trailing ABI suffixes (_v2, _v3, ..., _ptsz, _ptds) taken
 * off, as many as there are. Returns 0 when nothing was taken off. */
static int abi_base(const char *name, char *base, size_t len) {
    size_t n = strlen(name);
    if (n >= len) return 0;
    memcpy(base, name, n + 1);
    int stripped = 0;
    for (;;) {
        char *u = strrchr(base, '_');
        if (!u || u == base) break;
        const char *t = u + 1;
        int ok = strcmp(t, "ptsz") == 0 || strcmp(t, "ptds") == 0;
        if (!ok && t[0] == 'v' && t[1]) {
            ok = 1;
            for (const char *q = t + 1; *q && ok; q++) ok = *q >= '0' && *q <= '9';
        }
        if (!ok) break;
        *u = '\0';
        stripped = 1;
    }
    return stripped;
}

/* A name that is an ABI variant of a hooked call this library has no hook for (cuMemAlloc_v3,
 * cuMemAllocManaged_ptsz, nvmlDeviceGetMemoryInfo_v3...): calling it would reach the driver
 * unhooked. */
TS_EARLY static int unknown_abi_of_hooked(const char *name) {
    /* Only cu* and nvml* go further (no interposable call before: see ts_streq). */
    if (name[0] == 'c' && name[1] != 'u') return 0;
    if (name[0] == 'n' && (name[1] != 'v' || name[2] != 'm' || name[3] != 'l')) return 0;
    if (name[0] != 'c' && name[0] != 'n') return 0;
    char base[128];
    if (!abi_base(name, base, sizeof base)) return 0;
    if (hook_by_name(name)) return 0;
    return hooked_base(base) || strcmp(base, "nvmlDeviceGetMemoryInfo") == 0;
}

/* dlsym/dlvsym of such a name: refused while limits are active (NULL, one line). */
__attribute__((noinline)) static void *refuse_unknown_abi(const char *how, const char *name, void *p) {
    if (!p || ts_mode() == TS_MODE_PASSTHROUGH) return p;
    char key[160];
    snprintf(key, sizeof key, "abi:%s", name);
    ts_log_once(key, "%s(%s) refused: an ABI of a limited call this library has no hook for, so its memory "
                "could not be limited (fail closed; update tessera)", how, name);
    return NULL;
}

static pthread_mutex_t g_bind_mu = PTHREAD_MUTEX_INITIALIZER;
int ts_bound[2]; /* read inline by BIND_OR_FAIL (state.h) */
#define g_bound ts_bound

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

/* What a lookup of a hooked name resolved to (p) becomes. */
static void *hooked_result(const char *name, void *p, const ts_hook *hk, const char *how) {
    if (p == NULL || p == hk->hook) return p;
    if (ts_bind(hk->lib) != 0) {
        /* Inside the binding itself (a driver constructor looking itself up): its own business. */
        if (t_binding) return p;
        /* No driver by its soname (a renamed copy, or one without DT_SONAME, loaded by path):
         * the hook would have nothing to call, and the address is an unhooked driver. */
        if (ts_mode() == TS_MODE_PASSTHROUGH) return p;
        char key[96];
        snprintf(key, sizeof key, "unbound:%s", name);
        ts_log_once(key, "%s(%s) refused: no %s can be loaded by its soname to bind the limits to (a renamed "
                    "driver loaded by path?); fail closed", how, name,
                    hk->lib == TS_LIB_CUDA ? "libcuda.so.1" : "libnvidia-ml.so.1");
        return NULL;
    }
    if (p == *hk->real) {
        TS_DEBUG("%s(%s): intercepted", how, name);
        return hk->hook;
    }
    /* Another copy of the driver (loaded by another path, in another namespace, or a library
     * exporting a driver name): calling it would bypass the limits. */
    if (ts_mode() == TS_MODE_PASSTHROUGH) return p;
    Dl_info info;
    const char *file = dladdr(p, &info) && info.dli_fname ? info.dli_fname : "an unknown object";
    char key[96];
    snprintf(key, sizeof key, "lookup:%s", name);
    ts_log_once(key, "%s(%s) resolved to %s, not the driver this library is bound to; refused (fail closed)",
                how, name, file);
    return NULL;
}

__attribute__((noinline)) static void *dlsym_hooked(void *handle, const char *name, const ts_hook *hk) {
    return hooked_result(name, ts_real_dlsym(handle, name), hk, "dlsym");
}

/* The dynamic-loading functions themselves: looking them up (dlsym(libc, "dlsym")) gives ours,
 * so a program cannot reach the C library's dlsym and look the driver up around the hooks. */
/* Defined under hidden names and exported by alias: inside this library the address of an
 * exported function is the first definition in the process (a sanitizer's or another
 * interposer's dlopen, preloaded earlier); handing that back for dlsym(RTLD_NEXT, "dlopen") made
 * such an interposer call itself without end. The hidden names always mean ours. */
void *ts_dlvsym(void *handle, const char *name, const char *version);
void *ts_dlopen(const char *file, int mode);
void *ts_dlmopen(Lmid_t lmid, const char *file, int mode);
void *ts_dlsym(void *handle, const char *name);

/* glibc before 2.34 also exports its loader as GLIBC_PRIVATE __libc_dlsym, __libc_dlvsym and
 * __libc_dlopen_mode: looked up by name they would find the driver around the hooks, so a lookup
 * that resolves them gets the library's own (never on glibc 2.34+, where they are not exported). */
static void *ts_libc_dlsym(void *map, const char *name) { return ts_dlsym(map, name); }
static void *ts_libc_dlvsym(void *map, const char *name, const char *version) { return ts_dlvsym(map, name, version); }
static void *ts_libc_dlopen_mode(const char *name, int mode) { return ts_dlopen(name, mode); }

TS_EARLY static void *dl_self(const char *n) {
    if (n[0] == '_' && n[1] == '_' && n[2] == 'l' && n[3] == 'i' && n[4] == 'b' && n[5] == 'c' && n[6] == '_') {
        if (ts_streq(n, "__libc_dlsym")) return (void *)ts_libc_dlsym;
        if (ts_streq(n, "__libc_dlvsym")) return (void *)ts_libc_dlvsym;
        if (ts_streq(n, "__libc_dlopen_mode")) return (void *)ts_libc_dlopen_mode;
        return NULL;
    }
    if (n[0] != 'd' || n[1] != 'l') return NULL;
    if (ts_streq(n, "dlsym")) return (void *)ts_dlsym;
    if (ts_streq(n, "dlvsym")) return (void *)ts_dlvsym;
    if (ts_streq(n, "dlopen")) return (void *)ts_dlopen;
    if (ts_streq(n, "dlmopen")) return (void *)ts_dlmopen;
    return NULL;
}

/*
 * Every name we do not handle goes to the real dlsym as a tail call, so the C library sees the
 * original caller's return address and RTLD_NEXT / RTLD_DEFAULT keep their meaning for it.
 */
TS_EARLY void *ts_dlsym(void *handle, const char *name) {
    const char *n = name;
    __asm__("" : "+r"(n)); /* <dlfcn.h> says name is never NULL; a caller may still pass NULL */
    const ts_hook *hk = n ? hook_by_name(n) : NULL;
    if (__builtin_expect(hk != NULL, 0)) return dlsym_hooked(handle, name, hk);
    if (__builtin_expect(n && ((n[0] == 'd' && n[1] == 'l') || n[0] == '_'), 0) && dl_self(n) &&
        ts_real_dlsym(handle, name))
        return dl_self(n);
    if (__builtin_expect(n && (n[0] == 'c' || n[0] == 'n'), 0) && unknown_abi_of_hooked(n))
        return refuse_unknown_abi("dlsym", n, ts_real_dlsym(handle, n));
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (__builtin_expect(f == NULL, 0)) f = resolve_real_dlsym();
    return f(handle, name);
}

TS_EARLY static dlvsym_fn real_dlvsym(void) {
    if (!__atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE)) resolve_real_dlsym();
    return __atomic_load_n(&g_real_dlvsym, __ATOMIC_ACQUIRE);
}

/* dlvsym: the same substitution as dlsym (the driver's names are unversioned, so any version
 * finds them). */
TS_EARLY void *ts_dlvsym(void *handle, const char *name, const char *version) {
    dlvsym_fn f = real_dlvsym();
    if (!f) return NULL;
    const char *n = name;
    __asm__("" : "+r"(n));
    if (n) {
        const ts_hook *hk = hook_by_name(name);
        if (hk) return hooked_result(name, f(handle, name, version), hk, "dlvsym");
        void *self = dl_self(name);
        if (self && f(handle, name, version)) return self;
        if (unknown_abi_of_hooked(name)) return refuse_unknown_abi("dlvsym", name, f(handle, name, version));
    }
    return f(handle, name, version);
}

static void refuse_deepbind(const char *file) {
    ts_log_once("deepbind", "dlopen(%s, RTLD_DEEPBIND): RTLD_DEEPBIND dropped, so the library's driver calls "
                "go through the GPU memory limits (a library bound deep would call the driver directly)",
                file ? file : "NULL");
}

/*
 * dlopen: with limits active, RTLD_DEEPBIND is dropped (a library bound deep resolves its driver
 * calls inside its own dependencies, before this preloaded library). The call to the C library
 * is a tail call, so it sees the original caller (its RUNPATH and namespace are used).
 */
void *ts_dlopen(const char *file, int mode) {
    if (__builtin_expect((mode & RTLD_DEEPBIND) != 0, 0) && ts_mode() != TS_MODE_PASSTHROUGH) {
        refuse_deepbind(file);
        mode &= ~RTLD_DEEPBIND;
    }
    dlopen_fn f = __atomic_load_n(&g_real_dlopen, __ATOMIC_ACQUIRE);
    if (__builtin_expect(f == NULL, 0)) {
        resolve_real_dlsym();
        f = __atomic_load_n(&g_real_dlopen, __ATOMIC_ACQUIRE);
        if (!f) return NULL;
    }
    return f(file, mode);
}

/*
 * dlmopen: preloaded libraries exist in the base namespace only, so anything loaded into another
 * link-map namespace calls the driver unhooked, now or later (a plugin that dlopens libcuda
 * inside its namespace after it was loaded goes through that namespace's own C library, which
 * this library never sees). With limits active, every dlmopen into another namespace is refused
 * before anything is loaded (NULL; dlerror says why), logged once.
 */
void *ts_dlmopen(Lmid_t lmid, const char *file, int mode) {
    dlmopen_fn f = __atomic_load_n(&g_real_dlmopen, __ATOMIC_ACQUIRE);
    if (!f) {
        resolve_real_dlsym();
        f = __atomic_load_n(&g_real_dlmopen, __ATOMIC_ACQUIRE);
        if (!f) return NULL;
    }
    if (lmid == LM_ID_BASE || ts_mode() == TS_MODE_PASSTHROUGH) {
        if ((mode & RTLD_DEEPBIND) && lmid == LM_ID_BASE && ts_mode() != TS_MODE_PASSTHROUGH) {
            refuse_deepbind(file);
            mode &= ~RTLD_DEEPBIND;
        }
        return f(lmid, file, mode);
    }
    ts_log_once("dlmopen", "dlmopen(%s) into another link-map namespace refused: code there reaches the CUDA "
                "driver without the GPU memory limits (fail closed)", file ? file : "NULL");
    /* Leave a dlerror() that says so. */
    dlopen_fn o = __atomic_load_n(&g_real_dlopen, __ATOMIC_ACQUIRE);
    if (o) o("/tessera-isolation: refused: another link-map namespace is not limited", RTLD_NOW | RTLD_NOLOAD);
    return NULL;
}

TS_EXPORT extern __typeof(ts_dlsym) dlsym __attribute__((alias("ts_dlsym")));
TS_EXPORT extern __typeof(ts_dlvsym) dlvsym __attribute__((alias("ts_dlvsym")));
TS_EXPORT extern __typeof(ts_dlopen) dlopen __attribute__((alias("ts_dlopen")));
TS_EXPORT extern __typeof(ts_dlmopen) dlmopen __attribute__((alias("ts_dlmopen")));

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
    {"cuMemAlloc", "cuMemAlloc", 2000, 0},
    {"cuMemAllocPitch", "cuMemAllocPitch", 2000, 0},
    {"cuMemFree", "cuMemFree", 2000, 0},
    {"cuMemGetInfo", "cuMemGetInfo", 2000, 0},
    {"cuDeviceTotalMem", "cuDeviceTotalMem", 2000, 0},
    {"cuCtxCreate", "cuCtxCreate", 2000, 0},
    {"cuCtxDestroy", "cuCtxDestroy", 2000, 0},
    {"cuArrayCreate", "cuArrayCreate", 2000, 0},
    {"cuArray3DCreate", "cuArray3DCreate", 2000, 0},
    {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, 0},
    {"cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode", 11040, 0},
    {"cuGraphAddNode", "cuGraphAddNode", 12020, 0},
    {"cuGraphAddNode", "cuGraphAddNode_v2", 12030, 0},
    {"cuCtxSetLimit", "cuCtxSetLimit", 3010, 0},
    {"cuMemExportToShareableHandle", "cuMemExportToShareableHandle", 10020, 0},
    {"cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", 10020, 0},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 4010, 0},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", 11000, 0},
    {"cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010, 0},
    {"cuMemPoolExportToShareableHandle", "cuMemPoolExportToShareableHandle", 11020, 0},
    {"cuMemPoolImportFromShareableHandle", "cuMemPoolImportFromShareableHandle", 11020, 0},
    {"cuMemPoolImportPointer", "cuMemPoolImportPointer", 11020, 0},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, 0},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000, 0},
    TS_LAUNCH_VARIANTS
    TS_HELD_VARIANTS
};

typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

static int hooked_base(const char *symbol) {
    char base[128];
    if (abi_base(symbol, base, sizeof base)) symbol = base; /* cuGetProcAddress("cuMemAlloc_v3") */
    for (size_t i = 0; i < sizeof g_variants / sizeof g_variants[0]; i++)
        if (strcmp(g_variants[i].base, symbol) == 0) return 1;
    return 0;
}

/* An entry point of a hooked call in an ABI this library does not know: refused (an error the
 * CUDA runtime handles, as for a driver too old to have it), never the unhooked symbol or a hook
 * of another ABI. NULL = refuse. */
static void *refuse_abi(const char *symbol, int cudaVersion, const char *seen) {
    if (ts_mode() == TS_MODE_PASSTHROUGH) return (void *)1;
    char key[96];
    snprintf(key, sizeof key, "gpa:%s:%d", symbol, cudaVersion);
    ts_log_once(key, "cuGetProcAddress(%s, %d) refused: the driver gave %s, an ABI this library does not know, "
                "whose memory it could not limit (update tessera)", symbol, cudaVersion, seen);
    return NULL;
}

static void *substitute(const char *symbol, void *p, int cudaVersion, cuuint64_t flags) {
    for (size_t i = 0; i < N_HOOKS; i++)
        if (g_hooks[i].lib == TS_LIB_CUDA && *g_hooks[i].real == p) return g_hooks[i].hook;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (g_hooks[i].hook == p) return p;
    Dl_info info;
    if (dladdr(p, &info) && info.dli_sname && info.dli_saddr == p) {
        /* An exported function we did not resolve: a newer ABI of a hooked call is refused;
         * another library's function is passed through. */
        if (hooked_base(symbol)) return refuse_abi(symbol, cudaVersion, info.dli_sname) ? p : NULL;
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
            /* Is p that ABI, or a newer one the driver has and we do not know? Ask the driver for
             * the version that introduced our ABI: the same address means the same ABI. */
            if (best->since < cudaVersion && ts_real.cuGetProcAddress) {
                void *q = NULL;
                if (((gpa_v1_fn)ts_real.cuGetProcAddress)(symbol, &q, best->since, flags) != CUDA_SUCCESS || q != p)
                    return refuse_abi(symbol, cudaVersion, "a newer, non-exported entry point") ? p : NULL;
            }
            void *expected = NULL;
            __atomic_compare_exchange_n(hk->real, &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            TS_DEBUG("cuGetProcAddress(%s, %d, %llu): driver address differs from %s; intercepted by name",
                     symbol, cudaVersion, (unsigned long long)flags, best->variant);
            return hk->hook;
        }
    }
    if (hooked_base(symbol)) return refuse_abi(symbol, cudaVersion, "an entry point of unknown ABI") ? p : NULL;
    return p;
}

/* Applies substitute to a successful lookup; a refusal reads as "version not sufficient". */
static CUresult finish_lookup(CUresult rc, const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                              CUdriverProcAddressQueryResult *status) {
    if (rc != CUDA_SUCCESS || !symbol || !pfn || !*pfn) return rc;
    void *q = substitute(symbol, *pfn, cudaVersion, flags);
    if (q) {
        *pfn = q;
        return rc;
    }
    *pfn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
}

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

CUresult ts_hook_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (ts_bind(TS_LIB_CUDA) != 0 || !ts_real.cuGetProcAddress) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa_v1_fn)ts_real.cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    return finish_lookup(rc, symbol, pfn, cudaVersion, flags, NULL);
}

CUresult ts_hook_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult *status) {
    if (ts_bind(TS_LIB_CUDA) != 0 || !ts_real.cuGetProcAddress_v2) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa_v2_fn)ts_real.cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, status);
    return finish_lookup(rc, symbol, pfn, cudaVersion, flags, status);
}

TS_ALIAS(cuGetProcAddress)
TS_ALIAS(cuGetProcAddress_v2)
