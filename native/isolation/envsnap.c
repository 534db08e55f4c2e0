/*
 * The configuration variables are read once, at load (issue #28 class 2): the library's
 * constructor copies every TESSERA_* variable and CUDA_VISIBLE_DEVICES out of the environment
 * before the program's main runs, and every later read (the configuration, loaded at the first
 * CUDA call; the log level; the lock timeout) sees that copy. A program that clears or rewrites
 * its environment, or points TESSERA_GPU_CONFIG at its own file, before its first CUDA call
 * changes nothing. A hooked call made before the constructor (a dlopen from .preinit_array, when
 * `environ` may still be NULL) takes the copy from /proc/self/environ, the environment the
 * process was started with.
 *
 * Built with -DTS_ENV_LIVE (the configuration fuzzer only), reads go to the live environment.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isolation.h"

extern char **environ;

#define SNAP_BYTES 65536
#define SNAP_VARS 256

static char g_buf[SNAP_BYTES];
static const char *g_vars[SNAP_VARS + 1];
static int g_n;
static size_t g_used;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int wanted(const char *kv) {
    return strncmp(kv, "TESSERA_", 8) == 0 || strncmp(kv, "CUDA_VISIBLE_DEVICES=", 21) == 0;
}

static void keep(const char *kv, size_t len) {
    if (g_n >= SNAP_VARS || g_used + len + 1 > SNAP_BYTES) return;
    memcpy(g_buf + g_used, kv, len);
    g_buf[g_used + len] = '\0';
    g_vars[g_n++] = g_buf + g_used;
    g_used += len + 1;
}

static void take(void) {
    if (environ) {
        for (char **e = environ; *e; e++)
            if (wanted(*e)) keep(*e, strlen(*e));
        return;
    }
    int fd = open("/proc/self/environ", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    static char raw[SNAP_BYTES * 4];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof raw - 1 && (r = read(fd, raw + n, sizeof raw - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    raw[n] = '\0';
    for (size_t i = 0; i < n;) {
        size_t len = strlen(raw + i);
        if (len && wanted(raw + i)) keep(raw + i, len);
        i += len + 1;
    }
}

void ts_env_snapshot(void) { pthread_once(&g_once, take); }

#ifdef TS_ENV_LIVE
const char *ts_getenv(const char *name) { return getenv(name); }
const char *const *ts_env_all(void) { return (const char *const *)environ; }
#else
const char *ts_getenv(const char *name) {
    ts_env_snapshot();
    size_t n = strlen(name);
    for (int i = 0; i < g_n; i++)
        if (strncmp(g_vars[i], name, n) == 0 && g_vars[i][n] == '=') return g_vars[i] + n + 1;
    return NULL;
}

const char *const *ts_env_all(void) {
    ts_env_snapshot();
    return g_vars;
}
#endif
