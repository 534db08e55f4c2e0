/*
 * Fuzzer for the isolation library's configuration parsing (quantities, the environment-only
 * form with TESSERA_GPU_MEMORY_LIMIT[_<i>], the configuration file with its device and loans
 * lines). Built with -fsanitize=address,undefined (make target fuzz_config): any crash,
 * out-of-bounds access or undefined behaviour aborts the run.
 *
 *   fuzz_config SECONDS [SEED]
 *
 * First the regression cases (inputs that once crashed, wrapped or overran), then random inputs
 * from a deterministic generator until SECONDS have passed. Besides "no crash", every result is
 * checked against invariants: a parsed quantity is within 1..2^64-1 and equals the value computed
 * independently in long double (relative error < 1e-15, rounded up); a limited configuration has
 * at most 32 entries with unique indexes, limits > 0 and requests <= limits; a set-but-empty
 * value or a duplicate device variable fails closed. Prints one summary line; exit 1 on a
 * violated invariant (with the input).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../isolation/interpose.h"

/* loans.c reads driver entry points from this table; the parser never calls them. */
ts_real_table ts_real;

static uint64_t g_rng;
static unsigned long g_cases;
static char g_tmp[256];

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static unsigned pick(unsigned n) { return n ? (unsigned)(rnd() % n) : 0; }

static void violated(const char *what, const char *input) {
    fprintf(stderr, "fuzz_config: invariant violated: %s\ninput: [%s]\n", what, input);
    exit(1);
}

static const char *k_suffixes[] = {"", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                                   "m", "K", "i", "Gib", " ", "  G", "G "};

/* Long double reference for inputs of the form [+]digits[.digits][e[+-]digits]suffix. */
static int reference(const char *s, long double *out) {
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    const char *num = p;
    if (*p == '+') p++;
    size_t n = strspn(p, "0123456789.eE+-");
    char buf[512];
    if ((size_t)(p - num) + n >= sizeof buf) return 0;
    memcpy(buf, num, (size_t)(p - num) + n);
    buf[(size_t)(p - num) + n] = '\0';
    char *end;
    long double v = strtold(buf, &end);
    if (end == buf) return 0;
    const char *suffix = num + (end - buf);
    size_t sl = strlen(suffix);
    while (sl && (suffix[sl - 1] == ' ' || suffix[sl - 1] == '\t')) sl--;
    long double mult = 0;
    static const struct { const char *s; long double m; } ms[] = {
        {"", 1}, {"k", 1e3L}, {"M", 1e6L}, {"G", 1e9L}, {"T", 1e12L}, {"P", 1e15L}, {"E", 1e18L},
        {"Ki", 1024.0L}, {"Mi", 1048576.0L}, {"Gi", 1073741824.0L}, {"Ti", 1099511627776.0L},
        {"Pi", 1125899906842624.0L}, {"Ei", 1152921504606846976.0L}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        if (strlen(ms[i].s) == sl && strncmp(ms[i].s, suffix, sl) == 0) mult = ms[i].m;
    if (mult == 0) return 0;
    *out = v * mult;
    return 1;
}

static void check_quantity(const char *s) {
    uint64_t v = 0;
    g_cases++;
    int ok = ts_parse_quantity(s, &v);
    if (!ok) return;
    if (v == 0) violated("accepted quantity of 0 bytes", s);
    long double ref;
    if (reference(s, &ref)) {
        if (!(ref > 0)) violated("accepted a quantity whose value is not positive", s);
        if (ref > 18446744073709551615.0L * (1 + 1e-15L)) violated("accepted a quantity above 2^64-1 (wrapped)", s);
        long double lo = ref * (1 - 1e-15L) - 1, hi = ref * (1 + 1e-15L) + 1;
        if ((long double)v < lo || (long double)v > hi) {
            char msg[160];
            snprintf(msg, sizeof msg, "parsed %llu, expected about %.6Le", (unsigned long long)v, ref);
            violated(msg, s);
        }
    }
}

static void random_quantity(char *out, size_t cap) {
    size_t n = 0;
#define PUT(c) do { if (n + 1 < cap) out[n++] = (char)(c); } while (0)
    if (pick(8) == 0) PUT(' ');
    if (pick(10) == 0) PUT(pick(2) ? '+' : '-');
    unsigned int_digits = pick(4) == 0 ? pick(200) : pick(22);
    unsigned lead = pick(5) == 0 ? pick(60) : 0;
    for (unsigned i = 0; i < lead; i++) PUT('0');
    for (unsigned i = 0; i < int_digits; i++) PUT('0' + pick(10));
    if (pick(3) == 0) {
        PUT('.');
        unsigned frac = pick(4) == 0 ? pick(200) : pick(12);
        int zeros = pick(3) == 0;
        for (unsigned i = 0; i < frac; i++) PUT(zeros ? '0' : '0' + pick(10));
    }
    if (pick(5) == 0) {
        PUT(pick(2) ? 'e' : 'E');
        if (pick(2)) PUT(pick(2) ? '+' : '-');
        unsigned ed = 1 + pick(pick(6) == 0 ? 8 : 2);
        for (unsigned i = 0; i < ed; i++) PUT('0' + pick(10));
    }
    const char *suf = k_suffixes[pick(sizeof k_suffixes / sizeof k_suffixes[0])];
    for (const char *c = suf; *c; c++) PUT(*c);
    if (pick(20) == 0) PUT(1 + pick(255)); /* a stray byte */
    out[n] = '\0';
#undef PUT
}

static void clear_ours(void) {
    for (;;) {
        int found = 0;
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "TESSERA_", 8) != 0) continue;
            char name[512];
            size_t l = strcspn(*e, "=");
            if (l >= sizeof name) l = sizeof name - 1;
            memcpy(name, *e, l);
            name[l] = '\0';
            unsetenv(name);
            found = 1;
            break;
        }
        if (!found) return;
    }
}

static void check_config(const ts_config *c, const char *input, int must_fail) {
    g_cases++;
    if (c->mode != TS_MODE_PASSTHROUGH && c->mode != TS_MODE_LIMITED && c->mode != TS_MODE_FAILED)
        violated("unknown mode", input);
    if (c->n_entries < 0 || c->n_entries > TS_MAX_DEVICES) violated("entry count out of bounds", input);
    if (must_fail && c->mode != TS_MODE_FAILED) violated("accepted a configuration that must fail closed", input);
    if (c->mode != TS_MODE_LIMITED) return;
    if (c->has_default && c->default_limit == 0) violated("default limit of 0 (unlimited?)", input);
    for (int i = 0; i < c->n_entries; i++) {
        const ts_entry *e = &c->entries[i];
        if (e->limit == 0) violated("device limit of 0", input);
        if (e->request > e->limit) violated("request above limit", input);
        if (e->index >= TS_MAX_DEVICES || e->index < -1) violated("index out of range", input);
        if (memchr(e->uuid, '\0', sizeof e->uuid) == NULL) violated("uuid not terminated", input);
        for (int j = 0; j < i; j++)
            if (e->index >= 0 && c->entries[j].index == e->index) violated("duplicate index accepted", input);
    }
}

/* One environment case: vars is "NAME=VALUE\n..." (VALUE may be empty). */
static void env_case(const char *vars, int must_fail) {
    clear_ours();
    char *copy = strdup(vars);
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = '\0';
        setenv(line, eq + 1, 1);
    }
    free(copy);
    static ts_config cfg;
    ts_config_load(&cfg);
    check_config(&cfg, vars, must_fail);
    clear_ours();
}

static void file_case(const char *text, int must_fail) {
    clear_ours();
    FILE *f = fopen(g_tmp, "w");
    if (!f) { perror(g_tmp); exit(2); }
    fputs(text, f);
    fclose(f);
    setenv("TESSERA_GPU_CONFIG", g_tmp, 1);
    static ts_config cfg;
    ts_config_load(&cfg);
    check_config(&cfg, text, must_fail);
    clear_ours();
}

static void regressions(void) {
    char big[4096];
    /* 128 fraction digits: once a division by zero */
    strcpy(big, "1.");
    for (int i = 0; i < 128; i++) strcat(big, "3");
    check_quantity(big);
    strcpy(big, "1.");
    for (int i = 0; i < 128; i++) strcat(big, "0");
    strcat(big, "1Gi");
    check_quantity(big);
    strcpy(big, "0.");
    for (int i = 0; i < 127; i++) strcat(big, "0");
    strcat(big, "1");
    check_quantity(big);
    /* 2^68 + 1 Ei: once wrapped around to 2^60 (unlimited in practice) */
    uint64_t v = 0;
    if (ts_parse_quantity("295147905179352825857Ei", &v)) violated("295147905179352825857Ei accepted", "");
    check_quantity("295147905179352825857Ei");
    check_quantity("18446744073709551615");
    check_quantity("18446744073709551616");
    check_quantity("16Ei");
    check_quantity("15.999999999999999999Ei");
    check_quantity("1e38");
    check_quantity("1e-38");
    check_quantity("99999999999999999999999999999999999999Ei");
    /* empty values: invalid, not "no limit" */
    env_case("TESSERA_GPU_MEMORY_LIMIT=", 1);
    env_case("TESSERA_GPU_MEMORY_LIMIT_0=", 1);
    env_case("TESSERA_GPU_MEMORY_LIMIT=8G\nTESSERA_GPU_CONTEXT_OVERHEAD=", 1);
    env_case("TESSERA_GPU_MEMORY_LIMIT=8G\nTESSERA_GPU_SHARED_REGION=", 1);
    env_case("TESSERA_GPU_CONFIG=", 1);
    /* zero-padded duplicates: once two entries for one device */
    env_case("TESSERA_GPU_MEMORY_LIMIT_0=1G\nTESSERA_GPU_MEMORY_LIMIT_00=2G", 1);
    env_case("TESSERA_GPU_MEMORY_LIMIT_00=2G", 1);
    /* more than 32 per-device variables: once an array overrun */
    big[0] = '\0';
    for (int i = 0; i < 40; i++) {
        char line[64];
        snprintf(line, sizeof line, "TESSERA_GPU_MEMORY_LIMIT_%d=1G\n", i);
        strcat(big, line);
    }
    env_case(big, 1);
    big[0] = '\0';
    for (int i = 0; i < 40; i++) {
        char line[80];
        snprintf(line, sizeof line, "TESSERA_GPU_MEMORY_LIMIT_%0*d=1G\n", 1 + i / 10, i % 10);
        strcat(big, line);
    }
    env_case(big, 1);
    /* a file with more than 32 device lines */
    strcpy(big, "tessera-gpu-isolation 1\n");
    for (int i = 0; i < 40; i++) {
        char line[80];
        snprintf(line, sizeof line, "device uuid=GPU-%d limit=1\n", i);
        strcat(big, line);
    }
    file_case(big, 1);
    file_case("tessera-gpu-isolation 1\ndevice index=0 limit=\n", 1);
    file_case("tessera-gpu-isolation 1\ndevice index=0 limit=99999999999999999999999\n", 1);
    file_case("tessera-gpu-isolation 1\ncontext-overhead\ndevice index=0 limit=5\n", 1);
}

static const char *k_file_lines[] = {
    "tessera-gpu-isolation 1", "tessera-gpu-isolation 2", "# comment", "", "region /tmp/x.region",
    "region relative", "context-overhead 1000", "context-overhead -1", "context-overhead",
    "device index=0 limit=1000", "device index=1 uuid=GPU-abc request=5 limit=10", "device uuid=GPU-x limit=",
    "device index=32 limit=1", "device index=0 request=11 limit=10", "device limit=5", "device index=00 limit=5",
    "device index=1 limit=18446744073709551616", "device index=2 limit=18446744073709551615 bogus=1",
    "loans dir=/tmp/l share=a priority=-5 wait-ms=10 headroom=0", "loans dir=rel share=a",
    "loans dir=/tmp/l share=", "unknown line", "device", "device index=", "device =5",
};

static void random_file(char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    unsigned lines = pick(50);
    if (pick(4)) n += (size_t)snprintf(out, cap, "tessera-gpu-isolation 1\n");
    for (unsigned i = 0; i < lines && n + 700 < cap; i++) {
        const char *l = k_file_lines[pick(sizeof k_file_lines / sizeof k_file_lines[0])];
        char line[700];
        if (pick(6) == 0) {
            char q[300];
            random_quantity(q, sizeof q);
            snprintf(line, sizeof line, "device index=%u uuid=GPU-%u limit=%s request=%s", pick(40), pick(8), q,
                     pick(2) ? q : "1");
        } else if (pick(10) == 0) {
            unsigned len = pick(500);
            for (unsigned k = 0; k < len; k++) line[k] = (char)(1 + pick(255));
            line[len] = '\0';
        } else {
            snprintf(line, sizeof line, "%s", l);
        }
        n += (size_t)snprintf(out + n, cap - n, "%s\n", line);
    }
    if (pick(20) == 0 && n + 5000 < cap) { /* an over-long line */
        memset(out + n, 'a', 4200);
        n += 4200;
        out[n] = '\0';
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    g_rng = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9E3779B97F4A7C15ULL;
    if (g_rng == 0) g_rng = 1;
    snprintf(g_tmp, sizeof g_tmp, "%s/fuzz-config-%d.conf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    setenv("TESSERA_ISOLATION_LOG", "off", 1);
    ts_log_init();
    unsetenv("TESSERA_ISOLATION_LOG");
    regressions();
    unsigned long regression_cases = g_cases;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    static char buf[1 << 16];
    for (unsigned long round = 0;; round++) {
        if ((round & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
        }
        unsigned kind = pick(3);
        if (kind == 0) {
            random_quantity(buf, 400);
            check_quantity(buf);
        } else if (kind == 1) {
            size_t n = 0;
            unsigned vars = pick(45);
            for (unsigned i = 0; i < vars && n + 700 < sizeof buf; i++) {
                char q[400];
                random_quantity(q, sizeof q);
                if (pick(8) == 0) q[0] = '\0';
                const char *sfx[] = {"0", "00", "1", "31", "32", "-1", "", "1a", "007", "99999999999999999999"};
                unsigned which = pick(4);
                if (which == 0) n += (size_t)snprintf(buf + n, sizeof buf - n, "TESSERA_GPU_MEMORY_LIMIT=%s\n", q);
                else if (which == 1) n += (size_t)snprintf(buf + n, sizeof buf - n, "TESSERA_GPU_MEMORY_LIMIT_%s=%s\n",
                                                           sfx[pick(10)], q);
                else if (which == 2) n += (size_t)snprintf(buf + n, sizeof buf - n, "TESSERA_GPU_MEMORY_LIMIT_%u=%s\n",
                                                           pick(40), q);
                else n += (size_t)snprintf(buf + n, sizeof buf - n, "TESSERA_GPU_CONTEXT_OVERHEAD=%s\n", q);
            }
            env_case(buf, 0);
        } else {
            random_file(buf, sizeof buf);
            file_case(buf, 0);
        }
    }
    unlink(g_tmp);
    printf("fuzz_config: ok regression_cases=%lu cases=%lu seconds=%.1f\n", regression_cases, g_cases, seconds);
    return 0;
}
