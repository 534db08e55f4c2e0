/*
 * The fake GPU's timing model: kernels take time, one context runs at a time, and the device
 * round-robins between the contexts that have work queued, as the driver's time-slicing does.
 *
 * The device of each physical GPU is a file shared by every process of the simulated machine
 * (FAKE_GPU_SIM_DIR/gpu<i>.sim; without FAKE_GPU_SIM_DIR a private mapping, so one process still
 * sees timing). The model is evaluated lazily and exactly: the file holds, per context (one per
 * process and device, as with primary contexts), the nanoseconds of kernel work queued and
 * executed, which context runs and since when; any call that touches the device first advances
 * the schedule to the present, under the file's robust mutex. Nothing spins and nothing depends
 * on when host threads wake up, so the ground truth (executed ns per process) is exact in
 * simulated device time, which is real time.
 *
 *   - one running context; it keeps the device while it has work, until its slice
 *     (FAKE_GPU_TIMESLICE_US, default 2000) ends while another context has work queued;
 *   - the next context with work is chosen round-robin; switching to another context costs
 *     FAKE_GPU_SWITCH_US (default 25) of device time in which nothing runs;
 *   - a kernel switched out pauses and resumes where it stopped (compute preemption);
 *   - a context with nothing queued yields at once;
 *   - the work of a process that exits or dies is dropped (its context is destroyed).
 * Kernel length: FAKE_CUDA_KERNEL_TIME=grid makes gridDimX the length in units of
 * FAKE_CUDA_GRID_UNIT_NS (default 1000, so microseconds); otherwise FAKE_CUDA_KERNEL_US
 * (default 10). Kernels on one context run in order (one queue per context: streams of one
 * context are not modelled as concurrent). Events complete when the work queued before them has
 * run, at the simulated instant it ran. Work launched into a capturing stream is not run: it
 * becomes the graph's, and each cuGraphLaunch queues it again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_devices.h"
#include "fake_timing.h"
#include "fake_extra.h"
#include "tessera_launch_types.h"

#define EXPORT __attribute__((visibility("default")))
#ifdef FAKE_HIDE_PTSZ
#define PTSZ_EXPORT static
#else
#define PTSZ_EXPORT EXPORT
#endif

#define SIM_MAGIC 0x314D5354u /* "TSM1" */
#define SIM_VERSION 1
#define SIM_CTXS 64
#define SIM_SEGS 256

typedef struct {
    int64_t t0, t1; /* when it ran (CLOCK_MONOTONIC ns) */
    int64_t e0, e1; /* the context's executed counter before and after */
} sim_seg;

/* Layout read by tessera.testing (fake_gpu_sim.py): keep in step. */
typedef struct {
    int32_t pid;       /* 0: free */
    int32_t state;     /* 1: live, 2: exited (counters kept for readers) */
    int64_t submitted; /* ns of kernel work queued, cumulative */
    int64_t executed;  /* ns of it executed: the ground truth */
    int64_t launches;  /* kernel and graph launches queued */
    int64_t dropped;   /* ns dropped when the process ended */
    uint32_t seg_head, seg_n;
    sim_seg segs[SIM_SEGS];
} sim_ctx;

typedef struct {
    uint32_t magic, version;          /* 0 */
    uint32_t nctx, ctx_size;          /* 8 */
    int64_t timeslice_ns, switch_ns;  /* 16 */
    int64_t now_ns;                   /* 32: the schedule is evaluated up to here */
    int32_t running, last;            /* 40: context running (-1 idle), last one that ran */
    int64_t slice_start;              /* 48 */
    int64_t busy_ns, switch_total_ns; /* 56 */
    int64_t switches;                 /* 72 */
    char pad0[128 - 80];
    union {
        pthread_mutex_t mu;
        char mupad[64];
    };                                /* 128 */
    sim_ctx ctx[SIM_CTXS];            /* 192 */
} sim_file;

_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits");

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t env_i64(const char *name, int64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long long x = strtoll(v, &end, 10);
    return (*end == 0 && x >= 0) ? x : dflt;
}

/* ---- per-process state ---- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static sim_file *g_sim[FAKE_MAX_DEVICES];
static int g_slot[FAKE_MAX_DEVICES];
static int g_slot_pid[FAKE_MAX_DEVICES];
static int g_grid_mode;
static int64_t g_grid_unit = 1000, g_kernel_ns = 10000;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    const char *m = getenv("FAKE_CUDA_KERNEL_TIME");
    g_grid_mode = m && strcmp(m, "grid") == 0;
    g_grid_unit = env_i64("FAKE_CUDA_GRID_UNIT_NS", 1000);
    g_kernel_ns = env_i64("FAKE_CUDA_KERNEL_US", 10) * 1000;
}

static void sim_init(sim_file *s) {
    memset(s, 0, sizeof *s);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->mu, &a);
    pthread_mutexattr_destroy(&a);
    s->version = SIM_VERSION;
    s->nctx = SIM_CTXS;
    s->ctx_size = sizeof(sim_ctx);
    s->timeslice_ns = env_i64("FAKE_GPU_TIMESLICE_US", 2000) * 1000;
    if (s->timeslice_ns < 1000) s->timeslice_ns = 1000;
    s->switch_ns = env_i64("FAKE_GPU_SWITCH_US", 25) * 1000;
    s->running = -1;
    s->last = -1;
    s->now_ns = now_ns();
    __atomic_store_n(&s->magic, SIM_MAGIC, __ATOMIC_RELEASE);
}

static sim_file *sim_open(int phys) {
    const char *dir = getenv("FAKE_GPU_SIM_DIR");
    void *m;
    if (!dir || !*dir) {
        m = mmap(NULL, sizeof(sim_file), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
        sim_init(m);
        return m;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/gpu%d.sim", dir, phys);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fake driver: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    flock(fd, LOCK_EX);
    struct stat st;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < sizeof(sim_file) && ftruncate(fd, sizeof(sim_file)) != 0)) {
        flock(fd, LOCK_UN);
        close(fd);
        return NULL;
    }
    m = mmap(NULL, sizeof(sim_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED && ((sim_file *)m)->magic != SIM_MAGIC) sim_init(m);
    flock(fd, LOCK_UN);
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

static void sim_lock(sim_file *s) {
    if (pthread_mutex_lock(&s->mu) == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}
static void sim_unlock(sim_file *s) { pthread_mutex_unlock(&s->mu); }

static int alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

static void drop(sim_file *s, int i) {
    sim_ctx *c = &s->ctx[i];
    c->dropped += c->submitted - c->executed;
    c->submitted = c->executed;
    c->state = 2;
    if (s->running == i) s->running = -1;
}

static int pending(sim_file *s, int i) { return s->ctx[i].state == 1 && s->ctx[i].submitted > s->ctx[i].executed; }

static int other_pending(sim_file *s, int r) {
    for (int i = 0; i < SIM_CTXS; i++)
        if (i != r && pending(s, i)) return 1;
    return 0;
}

/* The next context with work after `after`, round-robin; the work of dead processes is dropped. */
static int next_pending(sim_file *s, int after) {
    for (int k = 1; k <= SIM_CTXS; k++) {
        int i = ((after < 0 ? -1 : after) + k) % SIM_CTXS;
        if (!pending(s, i)) continue;
        if (!alive(s->ctx[i].pid)) {
            drop(s, i);
            continue;
        }
        return i;
    }
    return -1;
}

static void add_seg(sim_ctx *c, int64_t t0, int64_t t1, int64_t e0) {
    if (c->seg_n > 0) {
        sim_seg *p = &c->segs[(c->seg_head + SIM_SEGS - 1) % SIM_SEGS];
        if (p->t1 == t0 && p->e1 == e0) {
            p->t1 = t1;
            p->e1 = e0 + (t1 - t0);
            return;
        }
    }
    c->segs[c->seg_head] = (sim_seg){t0, t1, e0, e0 + (t1 - t0)};
    c->seg_head = (c->seg_head + 1) % SIM_SEGS;
    if (c->seg_n < SIM_SEGS) c->seg_n++;
}

/* Evaluates the schedule up to T (caller holds the lock). */
static void advance(sim_file *s, int64_t T) {
    int64_t t = s->now_ns;
    int guard = 0;
    while (t < T && guard++ < 100000) {
        int r = s->running;
        if (r >= 0 && !pending(s, r)) r = s->running = -1;
        if (r >= 0 && t >= s->slice_start + s->timeslice_ns && other_pending(s, r)) r = s->running = -1;
        if (r < 0) {
            int n = next_pending(s, s->last);
            if (n < 0) break;
            s->running = r = n;
            if (n != s->last && s->last >= 0) {
                s->slice_start = t + s->switch_ns;
                s->switches++;
            } else {
                s->slice_start = t;
            }
            s->last = n;
        }
        if (t < s->slice_start) {
            int64_t until = s->slice_start < T ? s->slice_start : T;
            s->switch_total_ns += until - t;
            t = until;
            if (t >= T) break;
        }
        sim_ctx *c = &s->ctx[r];
        int64_t end = T;
        if (t + (c->submitted - c->executed) < end) end = t + (c->submitted - c->executed);
        int64_t slice_end = s->slice_start + s->timeslice_ns;
        if (slice_end < end && other_pending(s, r)) end = slice_end > t ? slice_end : t;
        if (end > t) {
            add_seg(c, t, end, c->executed);
            c->executed += end - t;
            s->busy_ns += end - t;
            t = end;
        }
    }
    if (T > s->now_ns) s->now_ns = T;
}

/* When context i's executed counter reached x (-1: no longer known). */
static int64_t time_of(sim_ctx *c, int64_t x) {
    for (uint32_t k = 0; k < c->seg_n; k++) {
        sim_seg *g = &c->segs[(c->seg_head + SIM_SEGS - 1 - k) % SIM_SEGS];
        if (x > g->e0 && x <= g->e1) return g->t0 + (x - g->e0);
        if (x > g->e1) return -1;
    }
    return -1;
}

/* This process's device file and context slot for a CUDA ordinal (locks nothing on return). */
static sim_file *dev_sim(int dev, int *slot) {
    pthread_once(&g_once, read_env);
    fake_device *d = fake_cuda_device(dev);
    if (!d) return NULL;
    int phys = d->index;
    if (phys < 0 || phys >= FAKE_MAX_DEVICES) return NULL;
    int pid = getpid();
    pthread_mutex_lock(&g_mu);
    if (g_sim[phys] && g_slot_pid[phys] == pid) {
        *slot = g_slot[phys];
        sim_file *s = g_sim[phys];
        pthread_mutex_unlock(&g_mu);
        return s;
    }
    if (g_sim[phys] && g_slot_pid[phys] != pid && !getenv("FAKE_GPU_SIM_DIR")) {
        /* A forked child of a process with a private device: its own device. */
        g_sim[phys] = NULL;
    }
    if (!g_sim[phys]) g_sim[phys] = sim_open(phys);
    sim_file *s = g_sim[phys];
    if (!s) {
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    sim_lock(s);
    advance(s, now_ns());
    int pick = -1;
    for (int i = 0; i < SIM_CTXS && pick < 0; i++)
        if (s->ctx[i].pid == 0) pick = i;
    for (int i = 0; i < SIM_CTXS && pick < 0; i++)
        if (s->ctx[i].state != 1 || !alive(s->ctx[i].pid)) pick = i;
    if (pick >= 0) {
        if (s->running == pick) s->running = -1;
        if (s->last == pick) s->last = -1;
        memset(&s->ctx[pick], 0, sizeof s->ctx[pick]);
        s->ctx[pick].pid = pid;
        s->ctx[pick].state = 1;
    }
    sim_unlock(s);
    if (pick < 0) {
        fprintf(stderr, "fake driver: more than %d contexts on GPU %d\n", SIM_CTXS, phys);
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    g_slot[phys] = pick;
    g_slot_pid[phys] = pid;
    *slot = pick;
    pthread_mutex_unlock(&g_mu);
    return s;
}

__attribute__((destructor)) static void on_exit_drop(void) {
    int pid = getpid();
    for (int p = 0; p < FAKE_MAX_DEVICES; p++) {
        sim_file *s = g_sim[p];
        if (!s || g_slot_pid[p] != pid) continue;
        sim_lock(s);
        advance(s, now_ns());
        drop(s, g_slot[p]);
        sim_unlock(s);
    }
}

/* Queues ns of work on device dev for this process; returns the ticket (executed value at which
 * it is done), or -1. */
static int64_t enqueue(int dev, int64_t ns) {
    int slot;
    sim_file *s = dev_sim(dev, &slot);
    if (!s) return -1;
    sim_lock(s);
    advance(s, now_ns());
    sim_ctx *c = &s->ctx[slot];
    c->submitted += ns;
    c->launches++;
    int64_t ticket = c->submitted;
    sim_unlock(s);
    return ticket;
}

/* Done: 1 and *when; not yet: 0 and *left (ns of this context's work still before it). */
static int ticket_done(int dev, int64_t ticket, int64_t *when, int64_t *left) {
    int slot;
    sim_file *s = dev_sim(dev, &slot);
    if (!s) return 1;
    sim_lock(s);
    int64_t t = now_ns();
    advance(s, t);
    sim_ctx *c = &s->ctx[slot];
    int done = c->executed >= ticket;
    if (done && when) {
        int64_t w = time_of(c, ticket);
        *when = w < 0 ? t : w;
    }
    if (!done && left) *left = ticket - c->executed;
    sim_unlock(s);
    return done;
}

static void wait_ticket(int dev, int64_t ticket, int64_t *when) {
    for (;;) {
        int64_t left = 0;
        if (ticket_done(dev, ticket, when, &left)) return;
        if (left < 5000) left = 5000;
        if (left > 1000000) left = 1000000;
        struct timespec ts = {0, (long)left};
        nanosleep(&ts, NULL);
    }
}

static int64_t submitted_now(int dev) {
    int slot;
    sim_file *s = dev_sim(dev, &slot);
    if (!s) return 0;
    sim_lock(s);
    advance(s, now_ns());
    int64_t v = s->ctx[slot].submitted;
    sim_unlock(s);
    return v;
}

void fake_timing_sync_dev(int dev) { wait_ticket(dev, submitted_now(dev), NULL); }

/* ---- graphs and capture: the kernels captured, by stream, graph or executable ---- */
typedef struct cost {
    const void *key;
    int64_t ns;
    struct cost *next;
} cost;
static cost *g_costs;

static cost *cost_find(const void *key, int create) {
    for (cost *c = g_costs; c; c = c->next)
        if (c->key == key) return c;
    if (!create) return NULL;
    cost *c = calloc(1, sizeof *c);
    c->key = key;
    c->next = g_costs;
    g_costs = c;
    return c;
}

static void cost_move(const void *from, const void *to, int keep) {
    pthread_mutex_lock(&g_mu);
    cost *f = cost_find(from, 0);
    int64_t ns = f ? f->ns : 0;
    if (f && !keep) f->ns = 0;
    if (to) cost_find(to, 1)->ns = ns;
    pthread_mutex_unlock(&g_mu);
}

void fake_timing_capture_end(const void *stream, const void *graph) { cost_move(stream, graph, 0); }
void fake_timing_instantiate(const void *graph, const void *exec) { cost_move(graph, exec, 1); }

void fake_timing_forget(const void *key) {
    pthread_mutex_lock(&g_mu);
    for (cost **p = &g_costs; *p; p = &(*p)->next)
        if ((*p)->key == key) {
            cost *c = *p;
            *p = c->next;
            free(c);
            break;
        }
    pthread_mutex_unlock(&g_mu);
}

static void capture_add(CUstream s, int64_t ns) {
    pthread_mutex_lock(&g_mu);
    cost_find(s, 1)->ns += ns;
    pthread_mutex_unlock(&g_mu);
}

void fake_timing_graph_launch(const void *exec, CUstream s) {
    pthread_mutex_lock(&g_mu);
    cost *c = cost_find(exec, 0);
    int64_t ns = c ? c->ns : 0;
    pthread_mutex_unlock(&g_mu);
    int dev;
    if (ns <= 0 || !fake_cuda_stream_dev(s, &dev)) return;
    if (fake_cuda_stream_capturing(s)) capture_add(s, ns);
    else enqueue(dev, ns);
}

/* ---- modules and functions (opaque) ---- */
#define MOD_MAGIC 0x4D0D4D0Du
#define FUNC_MAGIC 0xF00CF00Cu
struct CUmod_st {
    unsigned magic;
    uint64_t globals, globals_size; /* its __device__ variables (fake_extra.c), 0: none */
};
struct CUfunc_st {
    unsigned magic;
};
static struct CUfunc_st g_func = {FUNC_MAGIC};

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    if (!fake_cuda_stream_dev(NULL, &dev)) return CUDA_ERROR_INVALID_CONTEXT;
    CUmodule n = calloc(1, sizeof *n);
    n->magic = MOD_MAGIC;
    /* Like the real driver, loading a module allocates its __device__ variables on the context's
     * device (held until the module is unloaded, counted for the process). */
    CUresult rc = fake_module_globals_take(image, dev, &n->globals, &n->globals_size);
    if (rc != CUDA_SUCCESS) {
        free(n);
        return rc;
    }
    *m = n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *path) {
    if (!m || !path) return CUDA_ERROR_INVALID_VALUE;
    char image[4096];
    if (!fake_read_image(path, image, sizeof image)) return CUDA_ERROR_FILE_NOT_FOUND_;
    return cuModuleLoadData(m, image);
}
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
    if (!m || m->magic != MOD_MAGIC || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m->globals) return CUDA_ERROR_NOT_FOUND;
    if (dptr) *dptr = m->globals;
    if (bytes) *bytes = m->globals_size;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !m || m->magic != MOD_MAGIC || !name) return CUDA_ERROR_INVALID_VALUE;
    *f = &g_func;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (!m || m->magic != MOD_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    m->magic = 0;
    if (m->globals) fake_ipc_release(m->globals);
    free(m);
    return CUDA_SUCCESS;
}

/* ---- launches ---- */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       CUstream s) {
    if (!f || f->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    if (!fake_cuda_stream_dev(s, &dev)) return (uintptr_t)s <= 2 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
    pthread_once(&g_once, read_env);
    int64_t ns = g_grid_mode ? (int64_t)gx * g_grid_unit : g_kernel_ns;
    if (fake_cuda_stream_capturing(s)) {
        capture_add(s, ns);
        return CUDA_SUCCESS;
    }
    return enqueue(dev, ns) < 0 ? CUDA_ERROR_LAUNCH_FAILED_ : CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    (void)shmem; (void)params; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s);
}
PTSZ_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                                         void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig_ *cfg, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (!cfg) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ,
                  cfg->hStream);
}
PTSZ_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig_ *cfg, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(cfg, f, params, extra);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    (void)shmem; (void)params;
    return launch(f, gx, gy, gz, bx, by, bz, s);
}
PTSZ_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                    CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s);
PTSZ_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s); }

/* ---- events and stream queries ---- */
#define EVENT_MAGIC 0xE7E7E7E7u
struct CUevent_st {
    unsigned magic;
    unsigned flags;
    int dev;           /* -1: never recorded */
    int64_t ticket;
    int64_t rec_time;
    int64_t done_time; /* -1: not known to be done */
};

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    if (!fake_cuda_stream_dev(NULL, &dev)) return CUDA_ERROR_INVALID_CONTEXT;
    CUevent n = calloc(1, sizeof *n);
    n->magic = EVENT_MAGIC;
    n->flags = flags;
    n->dev = -1;
    n->done_time = -1;
    *e = n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    int dev;
    if (!fake_cuda_stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if (fake_cuda_stream_capturing(s)) return CUDA_SUCCESS; /* a node of the graph */
    e->dev = dev;
    e->rec_time = now_ns();
    e->ticket = submitted_now(dev);
    e->done_time = -1;
    return CUDA_SUCCESS;
}
PTSZ_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned flags) {
    (void)flags;
    return cuEventRecord(e, s);
}

static int event_done(CUevent e) {
    if (e->dev < 0 || e->done_time >= 0) {
        if (e->dev < 0) e->done_time = e->rec_time;
        return 1;
    }
    int64_t when;
    if (!ticket_done(e->dev, e->ticket, &when, NULL)) return 0;
    e->done_time = when > e->rec_time ? when : e->rec_time;
    return 1;
}

EXPORT CUresult cuEventQuery(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY_;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (event_done(e)) return CUDA_SUCCESS;
    int64_t when;
    wait_ticket(e->dev, e->ticket, &when);
    e->done_time = when > e->rec_time ? when : e->rec_time;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    if (!ms || !a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING_) return CUDA_ERROR_INVALID_HANDLE;
    if (a->dev < 0 || b->dev < 0) return CUDA_ERROR_INVALID_HANDLE;
    if (!event_done(a) || !event_done(b)) return CUDA_ERROR_NOT_READY_;
    *ms = (float)((double)(b->done_time - a->done_time) / 1e6);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

EXPORT CUresult cuStreamQuery(CUstream s) {
    int dev;
    if (!fake_cuda_stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    int64_t t = submitted_now(dev);
    return ticket_done(dev, t, NULL, NULL) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY_;
}
PTSZ_EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    (void)flags;
    int dev;
    if (!fake_cuda_stream_dev(s, &dev)) return CUDA_ERROR_INVALID_HANDLE;
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS; /* one queue per context: already ordered */
}

/* Test hook: this process's executed and queued ns on a CUDA ordinal. */
EXPORT CUresult fakeGpuProcessTime(int dev, unsigned long long *executed, unsigned long long *submitted) {
    int slot;
    sim_file *s = dev_sim(dev, &slot);
    if (!s) return CUDA_ERROR_INVALID_DEVICE;
    sim_lock(s);
    advance(s, now_ns());
    if (executed) *executed = (unsigned long long)s->ctx[slot].executed;
    if (submitted) *submitted = (unsigned long long)s->ctx[slot].submitted;
    sim_unlock(s);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */
typedef struct {
    const char *base;
    int since, ptsz;
    void *fn;
} tproc;
#define T(b, v, p, f) {b, v, p, (void *)(f)}
static const tproc g_tprocs[] = {
    T("cuModuleLoadData", 2000, 0, cuModuleLoadData),
    T("cuModuleLoad", 2000, 0, cuModuleLoad),
    T("cuModuleGetFunction", 2000, 0, cuModuleGetFunction),
    T("cuModuleUnload", 2000, 0, cuModuleUnload),
    T("cuModuleGetGlobal", 3020, 0, cuModuleGetGlobal_v2),
    FAKE_EXTRA_PROCS
    T("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    T("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    T("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    T("cuLaunchKernelEx", 11060, 1, cuLaunchKernelEx_ptsz),
    T("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    T("cuLaunchCooperativeKernel", 9000, 1, cuLaunchCooperativeKernel_ptsz),
    T("cuGraphLaunch", 10000, 1, cuGraphLaunch_ptsz),
    T("cuEventCreate", 2000, 0, cuEventCreate),
    T("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
    T("cuEventRecord", 2000, 0, cuEventRecord),
    T("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
    T("cuEventRecordWithFlags", 11010, 0, cuEventRecordWithFlags),
    T("cuEventQuery", 2000, 0, cuEventQuery),
    T("cuEventSynchronize", 2000, 0, cuEventSynchronize),
    T("cuEventElapsedTime", 2000, 0, cuEventElapsedTime),
    T("cuEventElapsedTime", 12080, 0, cuEventElapsedTime_v2),
    T("cuStreamQuery", 2000, 0, cuStreamQuery),
    T("cuStreamQuery", 7000, 1, cuStreamQuery_ptsz),
    T("cuStreamWaitEvent", 3020, 0, cuStreamWaitEvent),
};

void *fake_timing_proc(const char *symbol, int version, int ptsz, int *known) {
    const tproc *best = NULL;
    for (size_t i = 0; i < sizeof g_tprocs / sizeof g_tprocs[0]; i++) {
        const tproc *p = &g_tprocs[i];
        if (strcmp(p->base, symbol) != 0) continue;
        *known = 1;
        if (p->since > version || (p->ptsz && !ptsz)) continue;
        if (!best || p->since > best->since || (p->ptsz && !best->ptsz)) best = p;
    }
    return best ? best->fn : NULL;
}
