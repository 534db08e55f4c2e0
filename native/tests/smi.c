/*
 * An nvidia-smi stand-in for tests: it dlopens libnvidia-ml.so.1 and looks entry points up with
 * dlsym, as nvidia-smi does, then prints one CSV line per device:
 *   index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]
 * (the columns of `nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free
 * --format=csv,noheader,nounits`). With --v2 it uses nvmlDeviceGetMemoryInfo_v2; --bytes prints bytes;
 * --null passes NULL output pointers and prints the return codes.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "tessera_cuda_types.h"

int main(int argc, char **argv) {
    int v2 = 0, bytes = 0, null = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--null") == 0) null = 1;
        if (strcmp(argv[i], "--v2") == 0) v2 = 1;
        if (strcmp(argv[i], "--bytes") == 0) bytes = 1;
    }
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "NVIDIA-SMI has failed: %s\n", dlerror());
        return 9;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*count)(unsigned *) = (nvmlReturn_t(*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) = (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned) = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))dlsym(h, "nvmlDeviceGetName");
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned) = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))dlsym(h, "nvmlDeviceGetUUID");
    nvmlReturn_t (*mem1)(nvmlDevice_t, nvmlMemory_t *) = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    if (!init || !count || !get || !name || !uuid || !mem1 || !mem2 || init() != NVML_SUCCESS) {
        fprintf(stderr, "NVIDIA-SMI has failed to initialise NVML\n");
        return 9;
    }
    unsigned n = 0;
    count(&n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        char nm[96] = "", id[96] = "";
        get(i, &d);
        name(d, nm, sizeof nm);
        uuid(d, id, sizeof id);
        unsigned long long total, used, freeb;
        nvmlReturn_t rc;
        if (null) { /* NULL output pointers: the answer, not a crash */
            printf("%u, null, %d, %d\n", i, mem1(d, NULL), mem2(d, NULL));
            continue;
        }
        if (v2) {
            nvmlMemory_v2_t m;
            memset(&m, 0, sizeof m);
            m.version = TESSERA_NVML_MEMORY_V2_VERSION;
            rc = mem2(d, &m);
            total = m.total; used = m.used; freeb = m.free;
        } else {
            nvmlMemory_t m;
            rc = mem1(d, &m);
            total = m.total; used = m.used; freeb = m.free;
        }
        if (rc != NVML_SUCCESS) {
            printf("%u, %s, %s, [error %d]\n", i, nm, id, rc);
            continue;
        }
        unsigned long long div = bytes ? 1 : (1ULL << 20);
        printf("%u, %s, %s, %llu, %llu, %llu\n", i, nm, id, total / div, used / div, freeb / div);
    }
    return 0;
}
