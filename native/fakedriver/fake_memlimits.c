/*
 * NVML's per-cgroup device memory limits, as driver branch r615 and later have them
 * (nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1; see fake_devices.h), for the
 * fake driver: the table lives in the machine's shared state, NVML sets and reads it
 * (fake_nvml.c), and the fake CUDA refuses an allocation that would take a cgroup past a hard
 * limit (fake_cuda.c's device_free). What counts against a limit is what NVML counts for the
 * processes of that cgroup and below: their allocations and their contexts.
 *
 * As strict as the driver: older branches (FAKE_NVML_DRIVER_VERSION below 615.*) do not have
 * the call (NVML_ERROR_FUNCTION_NOT_FOUND); setting needs root (NVML_ERROR_NO_PERMISSION); a
 * cgroup path that is not an existing cgroup directory, or a soft limit over the hard one, is
 * NVML_ERROR_INVALID_ARGUMENT; MIG handles are NVML_ERROR_NOT_SUPPORTED (fake_nvml.c).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_devices.h"
#include "tessera_cuda_types.h"

int fake_driver_branch(void) {
    const char *v = getenv("FAKE_NVML_DRIVER_VERSION");
    int major = v && *v ? atoi(v) : 0;
    return major > 0 ? major : 570;
}

static int is_cgroup_dir(const char *path) {
    struct stat st;
    if (strncmp(path, "/sys/fs/cgroup", 14) != 0 || (path[14] != '\0' && path[14] != '/') ||
        strstr(path, "/../"))
        return 0;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether path equals root or lies below it. */
static int under(const char *path, const char *root) {
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Whether process pid (as /proc names it) is in cgroup (a sysfs path) or below it: any of its
 * hierarchies, v1 ("N:memory,...:/path" under /sys/fs/cgroup/<controller>) or v2 ("0::/path"
 * under /sys/fs/cgroup or /sys/fs/cgroup/unified). */
static int proc_in(int pid, const char *cgroup) {
    char file[320], line[1024], full[1400];
    if (pid > 0) snprintf(file, sizeof file, "%s/%d/cgroup", fake_host_proc(), pid);
    else snprintf(file, sizeof file, "/proc/self/cgroup");
    FILE *f = fopen(file, "re");
    if (!f) return 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *path = c2 + 1, *ctrls = c1 + 1;
        if (*ctrls == '\0') {
            snprintf(full, sizeof full, "/sys/fs/cgroup%s", path);
            found = under(full, cgroup);
            snprintf(full, sizeof full, "/sys/fs/cgroup/unified%s", path);
            found |= under(full, cgroup);
            continue;
        }
        char list[256];
        snprintf(list, sizeof list, "%s", ctrls);
        char *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t && !found; t = strtok_r(NULL, ",", &save)) {
            if (strncmp(t, "name=", 5) == 0) t += 5;
            snprintf(full, sizeof full, "/sys/fs/cgroup/%s%s", t, path);
            found = under(full, cgroup);
        }
    }
    fclose(f);
    return found;
}

/* Bytes the live processes of cgroup (and below) hold on phys. */
static uint64_t cgroup_used(int phys, const char *cgroup) {
    fake_proc procs[FAKE_STATE_SLOTS];
    int n = fake_state_procs(procs, FAKE_STATE_SLOTS);
    int self = fake_self_pid();
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        if (procs[i].used[phys] && proc_in(procs[i].pid == self ? 0 : procs[i].pid, cgroup))
            sum += procs[i].used[phys];
    return sum;
}

static fake_memlimit *find(fake_memlimit_table *t, int phys, const char *cgroup) {
    for (int i = 0; i < FAKE_MEMLIMIT_SLOTS; i++)
        if (t->e[i].live && (int)t->e[i].phys == phys && strcmp(t->e[i].cgroup, cgroup) == 0)
            return &t->e[i];
    return NULL;
}

int fake_memlimit_set(int phys, const char *cgroup, uint64_t soft, uint64_t hard) {
    if (fake_driver_branch() < FAKE_MEMLIMIT_MIN_BRANCH) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!cgroup || strlen(cgroup) >= sizeof ((fake_memlimit *)0)->cgroup)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    int clear = soft == 0 && hard == UINT64_MAX;
    if (!clear && (!is_cgroup_dir(cgroup) || soft > hard || hard == 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    fake_memlimit_table *t = fake_memlimits_get();
    if (!t) {
        fake_state_unlock();
        return NVML_ERROR_NOT_SUPPORTED;  /* no machine state: nothing could enforce it */
    }
    fake_memlimit *e = find(t, phys, cgroup);
    int rc = NVML_SUCCESS;
    if (clear) {
        if (e) memset(e, 0, sizeof *e);
    } else {
        for (int i = 0; !e && i < FAKE_MEMLIMIT_SLOTS; i++)
            if (!t->e[i].live || !is_cgroup_dir(t->e[i].cgroup)) e = &t->e[i];
        if (!e) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        else {
            snprintf(e->cgroup, sizeof e->cgroup, "%s", cgroup);
            e->phys = (uint32_t)phys;
            e->soft = soft;
            e->hard = hard;
            __atomic_store_n(&e->live, 1, __ATOMIC_RELEASE);
        }
    }
    fake_state_unlock();
    return rc;
}

int fake_memlimit_get(int phys, const char *cgroup, uint64_t *soft, uint64_t *hard, uint64_t *used) {
    if (fake_driver_branch() < FAKE_MEMLIMIT_MIN_BRANCH) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!cgroup || !is_cgroup_dir(cgroup)) return NVML_ERROR_INVALID_ARGUMENT;
    fake_state_lock();
    fake_memlimit_table *t = fake_memlimits_get();
    fake_memlimit *e = t ? find(t, phys, cgroup) : NULL;
    *soft = e ? e->soft : 0;
    *hard = e ? e->hard : UINT64_MAX;
    *used = cgroup_used(phys, cgroup);
    fake_state_unlock();
    return NVML_SUCCESS;
}

uint64_t fake_memlimit_room(int phys) {
    fake_memlimit_table *t = fake_memlimits_get();
    uint64_t room = UINT64_MAX;
    if (!t || fake_driver_branch() < FAKE_MEMLIMIT_MIN_BRANCH) return room;
    for (int i = 0; i < FAKE_MEMLIMIT_SLOTS; i++) {
        fake_memlimit *e = &t->e[i];
        if (!__atomic_load_n(&e->live, __ATOMIC_ACQUIRE) || (int)e->phys != phys) continue;
        /* No existence check here: inside a container /sys/fs/cgroup is the container's own
         * view, while limits name the host's paths (the driver knows them in the kernel). A
         * removed cgroup holds no process, so its limit binds no one. */
        if (!proc_in(0, e->cgroup)) continue;
        uint64_t used = cgroup_used(phys, e->cgroup);
        uint64_t left = used >= e->hard ? 0 : e->hard - used;
        if (left < room) room = left;
    }
    return room;
}
