/*
 * cuspin: launches kernels of a chosen length without synchronising after each one (at most
 * --inflight outstanding, waited for through events), as a GPU-bound training loop does. A
 * benchmark that synchronises after every launch measures nothing (HAMi#2863).
 *
 *   cuspin --us D [--inflight M] [--seconds S] [--api launch|ptsz|ex|ex_ptsz|coop|graph|gpa1|gpa2]
 *          [--onoff MS] [--report-ms MS] [--capture-while-waiting]
 * Kernel length: FAKE_CUDA_KERNEL_TIME=grid makes gridDimX microseconds on the fake driver.
 * Prints "t_ms completed" lines every --report-ms, then one JSON line. Exit 3 when a launch is
 * refused (its CUresult on stderr).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tessera_launch_types.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setcur_fn)(CUcontext);
typedef CUresult (*modload_fn)(CUmodule *, const void *);
typedef CUresult (*getfn_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig_ *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*ev_create_fn)(CUevent *, unsigned);
typedef CUresult (*ev_record_fn)(CUevent, CUstream);
typedef CUresult (*ev_sync_fn)(CUevent);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned);
typedef CUresult (*capture_fn)(CUstream, int);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*instantiate_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*ptime_fn)(int, unsigned long long *, unsigned long long *);

static void *lib;
static const char *api = "launch";
static gpa1_fn gpa1;
static gpa2_fn gpa2;

static void *sym(const char *name, const char *base, int ptsz) {
    if (strcmp(api, "gpa1") == 0 && base) {
        void *p = NULL;
        if (gpa1(base, &p, 12080, ptsz ? 2 : 0) == CUDA_SUCCESS) return p;
        return NULL;
    }
    if (strcmp(api, "gpa2") == 0 && base) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        if (gpa2(base, &p, 12080, ptsz ? 2 : 0, &st) == CUDA_SUCCESS) return p;
        return NULL;
    }
    return dlsym(lib, name);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult rc_ = (call);                                                  \
        if (rc_ != CUDA_SUCCESS) {                                              \
            fprintf(stderr, "cuspin: %s failed: %d\n", #call, rc_);             \
            return rc_ == CUDA_ERROR_NOT_PERMITTED ? 3 : 2;                     \
        }                                                                       \
    } while (0)

int main(int argc, char **argv) {
    unsigned us = 1000, inflight = 16;
    double seconds = 2.0;
    int onoff = 0, report = 100, capture_wait = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--us") && i + 1 < argc) us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--inflight") && i + 1 < argc) inflight = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--api") && i + 1 < argc) api = argv[++i];
        else if (!strcmp(argv[i], "--onoff") && i + 1 < argc) onoff = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--report-ms") && i + 1 < argc) report = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--capture-while-waiting")) capture_wait = 1;
        else {
            fprintf(stderr, "cuspin: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (inflight < 1 || inflight > 4096) inflight = 16;
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cuspin: %s\n", dlerror());
        return 2;
    }
    gpa1 = (gpa1_fn)dlsym(lib, "cuGetProcAddress");
    gpa2 = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    init_fn cuInit = (init_fn)dlsym(lib, "cuInit");
    retain_fn retain = (retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    setcur_fn setcur = (setcur_fn)dlsym(lib, "cuCtxSetCurrent");
    modload_fn modload = (modload_fn)dlsym(lib, "cuModuleLoadData");
    getfn_fn getfn = (getfn_fn)dlsym(lib, "cuModuleGetFunction");
    ev_create_fn ev_create = (ev_create_fn)dlsym(lib, "cuEventCreate");
    ev_record_fn ev_record = (ev_record_fn)dlsym(lib, "cuEventRecord");
    ev_sync_fn ev_sync = (ev_sync_fn)dlsym(lib, "cuEventSynchronize");
    stream_create_fn stream_create = (stream_create_fn)dlsym(lib, "cuStreamCreate");
    ptime_fn ptime = (ptime_fn)dlsym(lib, "fakeGpuProcessTime");
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream s = NULL;
    CHECK(cuInit(0));
    CHECK(retain(&ctx, 0));
    CHECK(setcur(ctx));
    CHECK(modload(&mod, "spin"));
    CHECK(getfn(&f, mod, "spin"));
    CHECK(stream_create(&s, 0));

    int ptsz = strstr(api, "ptsz") != NULL;
    launch_fn launch = (launch_fn)sym(ptsz ? "cuLaunchKernel_ptsz" : "cuLaunchKernel", "cuLaunchKernel", ptsz);
    launch_ex_fn launch_ex = (launch_ex_fn)sym(ptsz ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx",
                                               "cuLaunchKernelEx", ptsz);
    coop_fn coop = (coop_fn)sym("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 0);
    graph_launch_fn glaunch = (graph_launch_fn)sym("cuGraphLaunch", "cuGraphLaunch", 0);
    if (!launch || !launch_ex || !coop || !glaunch) {
        fprintf(stderr, "cuspin: launch entry points not found\n");
        return 2;
    }
    CUgraphExec exec = NULL;
    int per_unit = 1;
    if (!strcmp(api, "graph") || capture_wait) {
        /* A graph of 4 kernels of us/4 each, captured (capture is neither gated nor charged). */
        capture_fn begin = (capture_fn)dlsym(lib, "cuStreamBeginCapture_v2");
        end_capture_fn end = (end_capture_fn)dlsym(lib, "cuStreamEndCapture");
        instantiate_fn inst = (instantiate_fn)dlsym(lib, "cuGraphInstantiateWithFlags");
        CUstream cs;
        CHECK(stream_create(&cs, 0));
        CHECK(begin(cs, 0));
        for (int k = 0; k < 4; k++) CHECK(launch(f, us / 4 ? us / 4 : 1, 1, 1, 32, 1, 1, 0, cs, NULL, NULL));
        CUgraph g;
        CHECK(end(cs, &g));
        CHECK(inst(&exec, g, 0));
        if (!strcmp(api, "graph")) per_unit = 4;
        if (capture_wait) {
            printf("captured\n");
            fflush(stdout);
            if (strcmp(api, "graph") != 0) return 0;
        }
    }
    CUevent *ev = calloc(inflight, sizeof *ev);
    for (unsigned i = 0; i < inflight; i++) CHECK(ev_create(&ev[i], 0));
    unsigned head = 0, tail = 0, out = 0;
    long long completed = 0, launched = 0;
    int64_t t0 = now_ms(), next_report = t0 + report, end_ms = t0 + (int64_t)(seconds * 1000);
    if (onoff > 0) {
        printf("start %lld\n", (long long)t0); /* CLOCK_MONOTONIC ms: on for onoff ms first */
        fflush(stdout);
    }
    CUlaunchConfig_ cfg = {us, 1, 1, 32, 1, 1, 0, s, NULL, 0};
    for (;;) {
        int64_t t = now_ms();
        if (t >= next_report) {
            printf("%lld %lld\n", (long long)(t - t0), completed);
            fflush(stdout);
            next_report += report;
        }
        if (t >= end_ms) break;
        if (onoff > 0 && ((t - t0) / onoff) % 2 == 1) {
            while (out > 0) {
                CHECK(ev_sync(ev[tail]));
                tail = (tail + 1) % inflight;
                out--;
                completed += per_unit;
            }
            usleep(1000);
            continue;
        }
        if (out == inflight) {
            CHECK(ev_sync(ev[tail]));
            tail = (tail + 1) % inflight;
            out--;
            completed += per_unit;
        }
        if (!strcmp(api, "graph")) CHECK(glaunch(exec, s));
        else if (!strncmp(api, "ex", 2)) CHECK(launch_ex(&cfg, f, NULL, NULL));
        else if (!strcmp(api, "coop")) CHECK(coop(f, us, 1, 1, 32, 1, 1, 0, s, NULL));
        else CHECK(launch(f, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        CHECK(ev_record(ev[head], s));
        head = (head + 1) % inflight;
        out++;
        launched += per_unit;
    }
    while (out > 0) {
        CHECK(ev_sync(ev[tail]));
        tail = (tail + 1) % inflight;
        out--;
        completed += per_unit;
    }
    unsigned long long exec_ns = 0, sub_ns = 0;
    if (ptime) ptime(0, &exec_ns, &sub_ns);
    printf("{\"completed\": %lld, \"launched\": %lld, \"executed_ns\": %llu, \"elapsed_ms\": %lld, \"pid\": %d}\n",
           completed, launched, exec_ns, (long long)(now_ms() - t0), getpid());
    return 0;
}
