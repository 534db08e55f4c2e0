/* The launch entry points the compute-share gate hooks (hooks_launch.c), for interpose.h's tables. */
#ifndef TESSERA_LAUNCH_HOOKS_H
#define TESSERA_LAUNCH_HOOKS_H

#include "tessera_launch_types.h"

#define TS_LAUNCH_HOOKS(X)                                                                      \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)       \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch)             \
    X(cuGraphLaunch_ptsz)

#define TS_LAUNCH_HELPERS(X) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventElapsedTime)

/* cuGetProcAddress: {base, exported variant, CUDA version of that ABI, per-thread stream}. */
#define TS_LAUNCH_VARIANTS                                                                      \
    {"cuLaunchKernel", "cuLaunchKernel", 4000, 0},                                              \
    {"cuLaunchKernel", "cuLaunchKernel_ptsz", 7000, 1},                                         \
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 11060, 0},                                         \
    {"cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", 11060, 1},                                    \
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 9000, 0},                        \
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", 9000, 1},                   \
    {"cuGraphLaunch", "cuGraphLaunch", 10000, 0},                                               \
    {"cuGraphLaunch", "cuGraphLaunch_ptsz", 10000, 1},

CUresult ts_hook_cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **, void **);
CUresult ts_hook_cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, CUstream, void **, void **);
CUresult ts_hook_cuLaunchKernelEx(const CUlaunchConfig_ *, CUfunction, void **, void **);
CUresult ts_hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig_ *, CUfunction, void **, void **);
CUresult ts_hook_cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                           unsigned, CUstream, void **);
CUresult ts_hook_cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                unsigned, unsigned, CUstream, void **);
CUresult ts_hook_cuGraphLaunch(CUgraphExec, CUstream);
CUresult ts_hook_cuGraphLaunch_ptsz(CUgraphExec, CUstream);

#endif
