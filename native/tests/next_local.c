/* Loaded RTLD_LOCAL: RTLD_DEFAULT from here must see its own dependency (the caller's scope). */
#define _GNU_SOURCE
#include <dlfcn.h>
int tessera_dep_symbol(void);
int local_default_lookup(void) {
    int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "tessera_dep_symbol");
    return f ? f() : -1;
}
int keep_dep(void) { return tessera_dep_symbol(); }
