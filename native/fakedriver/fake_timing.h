/* The fake GPU's timing model (fake_timing.c): what fake_cuda.c calls into. */
#ifndef FAKE_TIMING_H
#define FAKE_TIMING_H

#include "tessera_cuda_types.h"

/* fake_cuda.c: the CUDA ordinal a stream (or the current context, for the NULL/legacy/per-thread
 * stream) runs on, and whether a stream is capturing. */
int fake_cuda_stream_dev(CUstream s, int *dev);
int fake_cuda_stream_capturing(CUstream s);

/* Waits until every kernel this process queued on device `dev` (CUDA ordinal) has run. */
void fake_timing_sync_dev(int dev);
/* Stream capture: the kernels captured on s become the graph's; instantiation copies them. */
void fake_timing_capture_end(const void *stream, const void *graph);
void fake_timing_instantiate(const void *graph, const void *exec);
/* Queues the kernels of a graph executable on the device of stream s. */
void fake_timing_graph_launch(const void *exec, CUstream s);
void fake_timing_forget(const void *key);
/* The timing model's entry points for cuGetProcAddress: NULL when symbol is not one of them. */
void *fake_timing_proc(const char *symbol, int version, int ptsz, int *known);

#endif
