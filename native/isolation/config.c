/*
 * Configuration: a file named by TESSERA_GPU_CONFIG (or present at the default path), else the
 * environment-only form (TESSERA_GPU_MEMORY_LIMIT, TESSERA_GPU_MEMORY_LIMIT_<i>), else nothing
 * (pure pass-through). Any named configuration that cannot be read or parsed puts the library in
 * TS_MODE_FAILED: every allocation is refused. docs/isolation.md describes the format.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isolation.h"

extern char **environ;

static void fail(ts_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(ts_config *cfg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->error, sizeof cfg->error, fmt, ap);
    va_end(ap);
    cfg->mode = TS_MODE_FAILED;
}

/*
 * Kubernetes quantity to bytes. Every step is overflow-checked: at most 38 significant digits
 * (leading zeros and trailing fraction zeros do not count), exponent -38..38, and the result must
 * be 1..UINT64_MAX bytes; fractions of a byte round up. Anything else is refused (returns 0),
 * never wrapped or truncated into another value.
 */
#define QTY_MAX_DIGITS 38

static unsigned __int128 pow10_u128(int n) {
    unsigned __int128 v = 1;
    while (n-- > 0) v *= 10;
    return v;
}

int ts_parse_quantity(const char *text, uint64_t *out) {
    static const struct { const char *s; unsigned __int128 mult; } suffixes[] = {
        {"Ki", (unsigned __int128)1 << 10}, {"Mi", (unsigned __int128)1 << 20},
        {"Gi", (unsigned __int128)1 << 30}, {"Ti", (unsigned __int128)1 << 40},
        {"Pi", (unsigned __int128)1 << 50}, {"Ei", (unsigned __int128)1 << 60},
        {"k", 1000ULL}, {"M", 1000000ULL}, {"G", 1000000000ULL}, {"T", 1000000000000ULL},
        {"P", 1000000000000000ULL}, {"E", 1000000000000000000ULL}, {"", 1},
    };
    if (!text) return 0;
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '+') p++;
    /* digits: int part, then fraction; trailing fraction zeros are dropped before counting */
    const char *int_start = p;
    while (isdigit((unsigned char)*p)) p++;
    const char *int_end = p, *frac_start = p, *frac_end = p;
    if (*p == '.') {
        frac_start = ++p;
        while (isdigit((unsigned char)*p)) p++;
        frac_end = p;
    }
    if (int_end == int_start && frac_end == frac_start) return 0;
    while (frac_end > frac_start && frac_end[-1] == '0') frac_end--;
    while (int_start < int_end && *int_start == '0') int_start++;
    int frac = (int)(frac_end - frac_start);
    int sig = (int)(int_end - int_start) + frac;
    if (sig > QTY_MAX_DIGITS) return 0;
    unsigned __int128 mant = 0;
    for (const char *d = int_start; d < int_end; d++) mant = mant * 10 + (unsigned)(*d - '0');
    for (const char *d = frac_start; d < frac_end; d++) mant = mant * 10 + (unsigned)(*d - '0');
    int exp10 = 0;
    if ((*p == 'e' || *p == 'E') && (isdigit((unsigned char)p[1]) || ((p[1] == '+' || p[1] == '-') && isdigit((unsigned char)p[2])))) {
        const char *e = p + 1;
        int neg = *e == '-';
        if (*e == '+' || *e == '-') e++;
        int v = 0;
        for (; isdigit((unsigned char)*e); e++) {
            if (v > 1000) return 0;
            v = v * 10 + (*e - '0');
        }
        if (v > QTY_MAX_DIGITS) return 0;
        exp10 = neg ? -v : v;
        p = e;
    }
    const char *suffix_start = p;
    const char *q = p + strlen(p);
    while (q > suffix_start && isspace((unsigned char)q[-1])) q--;
    size_t slen = (size_t)(q - suffix_start);
    unsigned __int128 mult = 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        if (strlen(suffixes[i].s) == slen && strncmp(suffixes[i].s, suffix_start, slen) == 0) {
            mult = suffixes[i].mult;
            break;
        }
    }
    if (mult == 0) return 0;
    if (mant == 0) return 0;
    unsigned __int128 value;
    if (__builtin_mul_overflow(mant, mult, &value)) return 0;
    int shift = exp10 - frac; /* -76..38 */
    if (shift > 0) {
        if (shift > QTY_MAX_DIGITS || __builtin_mul_overflow(value, pow10_u128(shift), &value)) return 0;
    } else if (shift < 0) {
        /* value < 2^128 < 10^39: dividing by 10^39 or more leaves a fraction of a byte -> 1 */
        if (-shift > QTY_MAX_DIGITS) value = 1;
        else {
            unsigned __int128 div = pow10_u128(-shift);
            value = value / div + (value % div != 0);
        }
    }
    if (value == 0 || value > UINT64_MAX) return 0;
    *out = (uint64_t)value;
    return 1;
}

static int parse_bytes(const char *text, uint64_t *out) {
    if (*text == '\0') return 0;
    for (const char *p = text; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    errno = 0;
    unsigned long long v = strtoull(text, NULL, 10);
    if (errno) return 0;
    *out = v;
    return 1;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static int parse_device_line(ts_config *cfg, char *rest, int lineno) {
    if (cfg->n_entries >= TS_MAX_DEVICES) {
        fail(cfg, "%s line %d: more than %d devices", cfg->source, lineno, TS_MAX_DEVICES);
        return 0;
    }
    ts_entry e = {.index = -1};
    int have_limit = 0, have_request = 0;
    char *save = NULL;
    for (char *tok = strtok_r(rest, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            fail(cfg, "%s line %d: '%s' must be key=value", cfg->source, lineno, tok);
            return 0;
        }
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        uint64_t n;
        if (strcmp(key, "index") == 0) {
            if (!parse_bytes(val, &n) || n >= TS_MAX_DEVICES) {
                fail(cfg, "%s line %d: index must be a whole number below %d (got '%s')", cfg->source,
                     lineno, TS_MAX_DEVICES, val);
                return 0;
            }
            e.index = (int)n;
        } else if (strcmp(key, "uuid") == 0) {
            if (strlen(val) == 0 || strlen(val) >= TS_UUID_LEN) {
                fail(cfg, "%s line %d: uuid must be 1 to %d characters", cfg->source, lineno, TS_UUID_LEN - 1);
                return 0;
            }
            snprintf(e.uuid, sizeof e.uuid, "%s", val);
        } else if (strcmp(key, "request") == 0 || strcmp(key, "limit") == 0) {
            if (!parse_bytes(val, &n)) {
                fail(cfg, "%s line %d: %s must be a whole number of bytes (got '%s')", cfg->source,
                     lineno, key, val);
                return 0;
            }
            if (key[0] == 'r') { e.request = n; have_request = 1; }
            else { e.limit = n; have_limit = 1; }
        } else {
            fail(cfg, "%s line %d: unknown device field '%s'", cfg->source, lineno, key);
            return 0;
        }
    }
    if (e.index < 0 && e.uuid[0] == '\0') {
        fail(cfg, "%s line %d: a device needs index=, uuid= or both", cfg->source, lineno);
        return 0;
    }
    if (!have_limit || e.limit == 0) {
        fail(cfg, "%s line %d: a device needs limit= greater than 0 bytes", cfg->source, lineno);
        return 0;
    }
    if (!have_request) e.request = e.limit;
    if (e.request > e.limit) {
        fail(cfg, "%s line %d: request (%llu) must not exceed limit (%llu)", cfg->source, lineno,
             (unsigned long long)e.request, (unsigned long long)e.limit);
        return 0;
    }
    for (int i = 0; i < cfg->n_entries; i++) {
        const ts_entry *o = &cfg->entries[i];
        if ((e.index >= 0 && o->index == e.index) || (e.uuid[0] && strcmp(o->uuid, e.uuid) == 0)) {
            fail(cfg, "%s line %d: device listed twice (same index or uuid as an earlier line)",
                 cfg->source, lineno);
            return 0;
        }
    }
    cfg->entries[cfg->n_entries++] = e;
    return 1;
}

static void load_file(ts_config *cfg, const char *path) {
    cfg->from_file = 1;
    snprintf(cfg->source, sizeof cfg->source, "%s", path);
    FILE *f = fopen(path, "re");
    if (!f) {
        fail(cfg, "cannot read configuration %s: %s", path, strerror(errno));
        return;
    }
    char line[TS_PATH_LEN + 64];
    int lineno = 0, header = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            fail(cfg, "%s line %d: line too long", path, lineno);
            break;
        }
        char *s = trim(line);
        if (*s == '\0' || *s == '#') continue;
        if (!header) {
            if (strcmp(s, "tessera-gpu-isolation 1") != 0) {
                fail(cfg, "%s line %d: the first line must be 'tessera-gpu-isolation 1'", path, lineno);
                break;
            }
            header = 1;
            continue;
        }
        char *sp = s;
        while (*sp && !isspace((unsigned char)*sp)) sp++;
        char *rest = *sp ? trim(sp + 1) : sp;
        *sp = '\0';
        if (strcmp(s, "device") == 0) {
            if (!parse_device_line(cfg, rest, lineno)) break;
        } else if (strcmp(s, "region") == 0) {
            if (rest[0] != '/') {
                fail(cfg, "%s line %d: region must be an absolute path", path, lineno);
                break;
            }
            snprintf(cfg->region, sizeof cfg->region, "%s", rest);
        } else if (strcmp(s, "context-overhead") == 0) {
            if (!parse_bytes(rest, &cfg->context_overhead)) {
                fail(cfg, "%s line %d: context-overhead must be a whole number of bytes", path, lineno);
                break;
            }
        } else if (strcmp(s, "loans") == 0) {
            char why[512];
            if (!ts_loans_configure(rest, why, sizeof why)) {
                fail(cfg, "%s line %d: %s", path, lineno, why);
                break;
            }
        } else {
            fail(cfg, "%s line %d: unknown key '%s'", path, lineno, s);
            break;
        }
    }
    if (cfg->mode != TS_MODE_FAILED && ferror(f))
        fail(cfg, "cannot read configuration %s: read error", path);
    fclose(f);
    if (cfg->mode == TS_MODE_FAILED) return;
    if (!header) fail(cfg, "%s: empty configuration (expected 'tessera-gpu-isolation 1')", path);
    else if (cfg->n_entries == 0) fail(cfg, "%s: no device lines; a workload needs at least one device", path);
    else cfg->mode = TS_MODE_LIMITED;
}

/* A set variable with an empty value is an error, never "unset" (a half-written environment must
 * not turn into "no limit"). Returns the value, NULL when unset; sets *bad when set but empty. */
static const char *env_value(ts_config *cfg, const char *name, int *bad) {
    const char *v = ts_getenv(name);
    if (v && *v == '\0') {
        fail(cfg, "%s is set but empty; give a value or unset it", name);
        *bad = 1;
        return NULL;
    }
    return v;
}

/* The <i> of TESSERA_GPU_MEMORY_LIMIT_<i>: canonical decimal (no sign, no leading zero), below
 * TS_MAX_DEVICES; -1 otherwise. */
static int device_suffix(const char *s, size_t n) {
    if (n == 0 || n > 2 || (n > 1 && s[0] == '0')) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v < TS_MAX_DEVICES ? v : -1;
}

static void load_env(ts_config *cfg) {
    snprintf(cfg->source, sizeof cfg->source, "environment");
    int bad = 0;
    const char *all = env_value(cfg, "TESSERA_GPU_MEMORY_LIMIT", &bad);
    if (bad) return;
    if (all) {
        if (!ts_parse_quantity(all, &cfg->default_limit)) {
            fail(cfg, "TESSERA_GPU_MEMORY_LIMIT='%.64s' must be a Kubernetes quantity from 1 byte to 16Ei "
                      "such as 8G, 8Gi or 8000000000", all);
            return;
        }
        cfg->has_default = 1;
    }
    static const char prefix[] = "TESSERA_GPU_MEMORY_LIMIT_";
    for (const char *const *e = ts_env_all(); e && *e; e++) {
        if (strncmp(*e, prefix, sizeof prefix - 1) != 0) continue;
        const char *suffix = *e + sizeof prefix - 1;
        const char *eq = strchr(suffix, '=');
        if (!eq) continue;
        size_t slen = (size_t)(eq - suffix);
        int shown = (int)(eq - *e) > 80 ? 80 : (int)(eq - *e);
        /* By UUID (GPU-... or MIG-..., as the launcher writes them: a limit that follows the
         * device, never its index under a reordered CUDA_VISIBLE_DEVICES), or by visible index. */
        int by_uuid = slen > 4 && (strncmp(suffix, "GPU-", 4) == 0 || strncmp(suffix, "MIG-", 4) == 0);
        for (size_t k = 4; by_uuid && k < slen; k++)
            if (!isxdigit((unsigned char)suffix[k]) && suffix[k] != '-' && suffix[k] != '/') by_uuid = 0;
        if (by_uuid && slen >= TS_UUID_LEN) by_uuid = 0;
        int index = by_uuid ? -1 : device_suffix(suffix, slen);
        if (!by_uuid && index < 0) {
            fail(cfg, "%.*s: the suffix must be a visible device index from 0 to %d without leading zeros, "
                      "or a GPU UUID (GPU-... or MIG-...)", shown, *e, TS_MAX_DEVICES - 1);
            return;
        }
        for (int i = 0; i < cfg->n_entries; i++)
            if (by_uuid ? (strlen(cfg->entries[i].uuid) == slen && strncmp(cfg->entries[i].uuid, suffix, slen) == 0)
                        : cfg->entries[i].index == index) {
                fail(cfg, "%.*s: this device has more than one limit variable", shown, *e);
                return;
            }
        if (cfg->n_entries >= TS_MAX_DEVICES) {
            fail(cfg, "more than %d TESSERA_GPU_MEMORY_LIMIT_<i> variables", TS_MAX_DEVICES);
            return;
        }
        ts_entry ent = {.index = index};
        if (by_uuid) memcpy(ent.uuid, suffix, slen);
        if (eq[1] == '\0') {
            fail(cfg, "%.*s is set but empty; give a value or unset it", shown, *e);
            return;
        }
        if (!ts_parse_quantity(eq + 1, &ent.limit)) {
            fail(cfg, "%.*s='%.64s' must be a Kubernetes quantity from 1 byte to 16Ei such as 8G or 8Gi",
                 shown, *e, eq + 1);
            return;
        }
        ent.request = ent.limit;
        cfg->entries[cfg->n_entries++] = ent;
    }
    const char *overhead = env_value(cfg, "TESSERA_GPU_CONTEXT_OVERHEAD", &bad);
    if (bad) return;
    if (overhead && !ts_parse_quantity(overhead, &cfg->context_overhead)) {
        fail(cfg, "TESSERA_GPU_CONTEXT_OVERHEAD='%.64s' must be a Kubernetes quantity greater than 0 such as "
                  "300Mi", overhead);
        return;
    }
    const char *region = env_value(cfg, "TESSERA_GPU_SHARED_REGION", &bad);
    if (bad) return;
    if (region) {
        if (region[0] != '/' || strlen(region) >= sizeof cfg->region) {
            fail(cfg, "TESSERA_GPU_SHARED_REGION='%.64s' must be an absolute path", region);
            return;
        }
        snprintf(cfg->region, sizeof cfg->region, "%s", region);
    }
    cfg->mode = (cfg->has_default || cfg->n_entries > 0) ? TS_MODE_LIMITED : TS_MODE_PASSTHROUGH;
}

/*
 * The container's own file (TS_DEFAULT_CONFIG_PATH, mounted read-only by the webhook from what
 * tessera-node wrote) is the authority: what the environment says can only lower its limits,
 * never raise or remove them, so a process that loses or rewrites its environment stays capped.
 */
static void narrow(ts_config *cfg, const ts_config *by) {
    for (int i = 0; i < cfg->n_entries; i++) {
        ts_entry *e = &cfg->entries[i];
        const ts_entry *m = ts_config_match(by, e->index, e->uuid);
        uint64_t lower = m ? m->limit : by->has_default ? by->default_limit : 0;
        if (lower && lower < e->limit) {
            e->limit = lower;
            if (e->request > lower) e->request = lower;
        }
    }
}

static void load_authoritative(ts_config *cfg) {
    load_file(cfg, TS_DEFAULT_CONFIG_PATH);
    if (cfg->mode == TS_MODE_FAILED) return;
    static ts_config other; /* large: not on the stack; loaded once, at start-up */
    memset(&other, 0, sizeof other);
    /* TESSERA_GPU_CONFIG naming another file is not read: only TESSERA_GPU_MEMORY_LIMIT[_<i>]
     * may lower a limit here (another file could name another region or ledger). */
    load_env(&other);
    if (other.mode == TS_MODE_FAILED) {
        fail(cfg, "%s (the environment may only lower the limits of %s)", other.error, TS_DEFAULT_CONFIG_PATH);
        return;
    }
    narrow(cfg, &other);
}

void ts_config_load(ts_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    if (access(TS_DEFAULT_CONFIG_PATH, F_OK) == 0) {
        load_authoritative(cfg);
        return;
    }
    if (access(TS_DEFAULT_CONFIG_DIR, F_OK) == 0) {
        /* The directory is there (the webhook mounted it for a share) but not the file: never run
         * such a container uncapped, whatever its environment says. */
        snprintf(cfg->source, sizeof cfg->source, "%s", TS_DEFAULT_CONFIG_PATH);
        fail(cfg, "%s is missing although %s exists (a GPU share whose configuration tessera-node "
                  "has not written): every allocation is refused", TS_DEFAULT_CONFIG_PATH,
             TS_DEFAULT_CONFIG_DIR);
        return;
    }
    const char *path = ts_getenv("TESSERA_GPU_CONFIG");
    if (path && *path == '\0') {
        snprintf(cfg->source, sizeof cfg->source, "environment");
        fail(cfg, "TESSERA_GPU_CONFIG is set but empty; give the configuration file's path or unset it");
    } else if (path) {
        if (strlen(path) >= sizeof cfg->source) {
            fail(cfg, "TESSERA_GPU_CONFIG is longer than %d characters", (int)sizeof cfg->source - 1);
            return;
        }
        load_file(cfg, path);
    } else {
        load_env(cfg);
    }
}

/* CUDA names every device GPU-<uuid>, a MIG device too (cuDeviceGetUuid gives the MIG
 * instance's bytes); NVML and tessera name a MIG device MIG-<uuid>. The same bytes under either
 * prefix are the same device. */
static int same_uuid(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return 1;
    int pa = strncmp(a, "GPU-", 4) == 0 || strncmp(a, "MIG-", 4) == 0;
    int pb = strncmp(b, "GPU-", 4) == 0 || strncmp(b, "MIG-", 4) == 0;
    return pa && pb && strcmp(a + 4, b + 4) == 0;
}

const ts_entry *ts_config_match(const ts_config *cfg, int index, const char *uuid) {
    if (uuid && uuid[0]) {
        for (int i = 0; i < cfg->n_entries; i++)
            if (cfg->entries[i].uuid[0] && same_uuid(cfg->entries[i].uuid, uuid)) return &cfg->entries[i];
    }
    if (index < 0) return NULL;
    for (int i = 0; i < cfg->n_entries; i++) {
        const ts_entry *e = &cfg->entries[i];
        /* An entry that names a UUID only matches that device; when ours is unknown, its index decides. */
        if (e->index == index && (e->uuid[0] == '\0' || !uuid || !uuid[0])) return e;
    }
    return NULL;
}
