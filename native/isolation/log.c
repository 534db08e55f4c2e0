#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <pthread.h>

#include "isolation.h"

int ts_log_level = TS_LOG_ERROR;

void ts_log_init(void) {
    const char *v = ts_getenv("TESSERA_ISOLATION_LOG");
    if (v == NULL || *v == '\0') return;
    if (strcasecmp(v, "off") == 0 || strcasecmp(v, "none") == 0) ts_log_level = TS_LOG_OFF;
    else if (strcasecmp(v, "error") == 0) ts_log_level = TS_LOG_ERROR;
    else if (strcasecmp(v, "warn") == 0 || strcasecmp(v, "warning") == 0) ts_log_level = TS_LOG_WARN;
    else if (strcasecmp(v, "info") == 0) ts_log_level = TS_LOG_INFO;
    else if (strcasecmp(v, "debug") == 0) ts_log_level = TS_LOG_DEBUG;
}

void ts_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > ts_log_level || level < 0 || level > 3) return;
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "tessera-isolation[%d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

/* Refusals the user must see: logged once per key at the default level (error). */
void ts_log_once(const char *key, const char *fmt, ...) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char seen[64][64];
    static int n;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++)
        if (strncmp(seen[i], key, sizeof seen[i] - 1) == 0) {
            pthread_mutex_unlock(&mu);
            return;
        }
    if (n < 64) snprintf(seen[n++], sizeof seen[0], "%s", key);
    pthread_mutex_unlock(&mu);
    char buf[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ts_log(TS_LOG_ERROR, "%s", buf);
}
