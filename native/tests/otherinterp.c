/* Another dlopen interposer (as VirtualGL, profilers and sanitizer runtimes are), preloaded
 * before libtessera-cuda.so: it finds the next dlopen with dlsym(RTLD_NEXT, "dlopen") on first
 * use and counts the calls it forwards. Before issue #28 the isolation library answered that
 * lookup with the address of "its" dlopen, which inside it resolved to this one: endless
 * recursion. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static void *(*next_dlopen)(const char *, int);
static int calls;

__attribute__((visibility("default"))) void *dlopen(const char *file, int mode) {
    if (!next_dlopen) next_dlopen = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    if (!next_dlopen || ++calls > 1000) {
        fprintf(stderr, "otherinterp: dlopen recursion\n");
        abort();
    }
    void *h = next_dlopen(file, mode);
    calls--;
    return h;
}
