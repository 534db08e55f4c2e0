/* For the dlsym transparency test: looks up the NEXT definition of tessera_probe. */
#define _GNU_SOURCE
#include <dlfcn.h>
int tessera_probe(void) { return 1; }
int call_next_probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "tessera_probe");
    return next ? next() : -1;
}
