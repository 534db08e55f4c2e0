#include "fake_devices.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fake_device g_devices[FAKE_MAX_DEVICES];
static int g_count;
static uint64_t g_context_bytes;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_visible[FAKE_MAX_DEVICES];
static int g_visible_count;

static uint64_t parse_size(const char *text, int *ok) {
    char *end = NULL;
    *ok = 0;
    while (isspace((unsigned char)*text)) text++;
    if (!isdigit((unsigned char)*text)) return 0;
    unsigned long long value = strtoull(text, &end, 10);
    uint64_t mult = 1;
    if (strncmp(end, "Ki", 2) == 0) { mult = 1ULL << 10; end += 2; }
    else if (strncmp(end, "Mi", 2) == 0) { mult = 1ULL << 20; end += 2; }
    else if (strncmp(end, "Gi", 2) == 0) { mult = 1ULL << 30; end += 2; }
    else if (strncmp(end, "Ti", 2) == 0) { mult = 1ULL << 40; end += 2; }
    else if (*end == 'K' || *end == 'k') { mult = 1000ULL; end++; }
    else if (*end == 'M') { mult = 1000ULL * 1000; end++; }
    else if (*end == 'G') { mult = 1000ULL * 1000 * 1000; end++; }
    else if (*end == 'T') { mult = 1000ULL * 1000 * 1000 * 1000; end++; }
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') return 0;
    *ok = 1;
    return (uint64_t)value * mult;
}

static void add_device(const char *name, uint64_t total) {
    if (g_count >= FAKE_MAX_DEVICES) return;
    fake_device *d = &g_devices[g_count];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->total = total;
    unsigned char *u = d->uuid;
    u[0] = 'f'; u[1] = 'a'; u[2] = 'k'; u[3] = 'e';
    for (int i = 4; i < 16; i++) u[i] = (unsigned char)(g_count * 37 + i * 11 + 5);
    snprintf(d->uuid_str, sizeof d->uuid_str,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
    char key[32];
    snprintf(key, sizeof key, "FAKE_GPU_USED_%d", g_count);
    const char *used = getenv(key);
    if (used) {
        int ok;
        uint64_t v = parse_size(used, &ok);
        if (ok) d->other_used = v;
    }
    g_count++;
}

static void load(void) {
    const char *spec = getenv("FAKE_GPU_DEVICES");
    if (spec == NULL || *spec == '\0') spec = "NVIDIA H100 80GB HBM3=81559Mi";
    char *copy = strdup(spec);
    char *save = NULL;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char *eq = strrchr(item, '=');
        if (!eq) {
            fprintf(stderr, "fake driver: FAKE_GPU_DEVICES item '%s' needs NAME=SIZE\n", item);
            continue;
        }
        *eq = '\0';
        int ok;
        uint64_t total = parse_size(eq + 1, &ok);
        if (!ok || total == 0) {
            fprintf(stderr, "fake driver: bad size in FAKE_GPU_DEVICES item '%s'\n", item);
            continue;
        }
        add_device(item, total);
    }
    free(copy);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        for (int i = 0; i < g_count; i++) g_visible[i] = i;
        g_visible_count = g_count;
    } else {
        char *list = strdup(cvd), *save2 = NULL;
        for (char *t = strtok_r(list, ",", &save2); t && g_visible_count < FAKE_MAX_DEVICES;
             t = strtok_r(NULL, ",", &save2)) {
            while (isspace((unsigned char)*t)) t++;
            int found = -1;
            if (isdigit((unsigned char)*t)) {
                char *end;
                long v = strtol(t, &end, 10);
                if (*end == '\0' && v >= 0 && v < g_count) found = (int)v;
            } else if (strncmp(t, "GPU-", 4) == 0) {
                for (int i = 0; i < g_count && found < 0; i++)
                    if (strncmp(g_devices[i].uuid_str, t, strlen(t)) == 0) found = i;
            }
            if (found < 0) break;
            g_visible[g_visible_count++] = found;
        }
        free(list);
    }
    const char *ctx = getenv("FAKE_GPU_CONTEXT_BYTES");
    if (ctx) {
        int ok;
        uint64_t v = parse_size(ctx, &ok);
        if (ok) g_context_bytes = v;
    }
}

int fake_devices_load(void) {
    pthread_once(&g_once, load);
    return g_count;
}

fake_device *fake_device_get(int index) {
    fake_devices_load();
    if (index < 0 || index >= g_count) return NULL;
    return &g_devices[index];
}

uint64_t fake_context_bytes(void) {
    fake_devices_load();
    return g_context_bytes;
}

int fake_cuda_count(void) {
    fake_devices_load();
    return g_visible_count;
}

fake_device *fake_cuda_device(int ordinal) {
    fake_devices_load();
    if (ordinal < 0 || ordinal >= g_visible_count) return NULL;
    return &g_devices[g_visible[ordinal]];
}
