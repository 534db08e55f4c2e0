/* Prints what dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) return for their callers:
 * "next=2 local_default=42" when the C library's caller-relative lookups are intact. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int call_next_probe(void);
int main(int argc, char **argv) {
    (void)argc;
    int next = call_next_probe();
    char path[4096];
    snprintf(path, sizeof path, "%s", argv[0]);
    char *slash = path;
    for (char *p = path; *p; p++) if (*p == '/') slash = p;
    snprintf(slash, sizeof path - (size_t)(slash - path), "/libnext_local.so");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    int local = -2;
    if (h) {
        int (*f)(void) = (int (*)(void))dlsym(h, "local_default_lookup");
        local = f ? f() : -3;
    }
    printf("next=%d local_default=%d\n", next, local);
    return 0;
}
