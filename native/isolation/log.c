#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "isolation.h"

int ts_log_level = TS_LOG_ERROR;

void ts_log_init(void) {
    const char *v = getenv("TESSERA_ISOLATION_LOG");
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
