/*
 * The stand-in driver root's nvidia-smi: what the stand-in NVML (fakenvml.c) says, in
 * nvidia-smi's own formats, for people and scripts that look (inside a container too,
 * where it sees only the container's GPUs, as the library does).
 *
 * NVIDIA's DRA kubelet plugin needs the file to exist in the driver root, and runs it only
 * to set time-slicing (`compute-policy -i UUID --set-timeslice N`) and the compute mode
 * (`-i UUID -c MODE`): those are accepted and change nothing here.
 *
 *   nvidia-smi                         a short summary: driver, CUDA, one line per GPU
 *   nvidia-smi -L                      GPU <i>: <name> (UUID: <uuid>)
 *   nvidia-smi --query-gpu=F[,F...] --format=csv[,noheader][,nounits]
 *                                      F: index, name, uuid, pci.bus_id, minor_number,
 *                                         memory.total, driver_version
 *
 * Linked against libnvidia-ml.so.1, found through its run path ($ORIGIN/../lib64, the
 * driver root's layout) or the loader's usual search.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t);
nvmlReturn_t nvmlSystemGetDriverVersion(char *, unsigned int);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t, unsigned int *);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t, nvmlPciInfo_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);

typedef struct {
    unsigned int index, minor;
    char name[96], uuid[96], bus_id[32];
    unsigned long long memory;
} info_t;

static char driver[96];

static int get(unsigned int i, info_t *out) {
    nvmlDevice_t d;
    nvmlPciInfo_t pci;
    nvmlMemory_t mem;
    if (nvmlDeviceGetHandleByIndex_v2(i, &d) || nvmlDeviceGetName(d, out->name, sizeof out->name) ||
        nvmlDeviceGetUUID(d, out->uuid, sizeof out->uuid) || nvmlDeviceGetMinorNumber(d, &out->minor) ||
        nvmlDeviceGetPciInfo_v3(d, &pci) || nvmlDeviceGetMemoryInfo(d, &mem))
        return 1;
    out->index = i;
    snprintf(out->bus_id, sizeof out->bus_id, "%s", pci.busId);
    out->memory = mem.total;
    return 0;
}

static int query(const char *fields, const char *format) {
    int header = !strstr(format, "noheader");
    int units = !strstr(format, "nounits");
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    char list[512];
    snprintf(list, sizeof list, "%s", fields);
    const char *known[] = {"index", "name", "uuid", "pci.bus_id", "minor_number", "memory.total", "driver_version"};
    for (char *f = strtok(list, ","); f; f = strtok(NULL, ",")) {
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= strcmp(f, known[k]) == 0;
        if (!ok) {
            fprintf(stderr, "Field \"%s\" is not a valid field to query (stand-in nvidia-smi).\n", f);
            return 2;
        }
    }
    if (header) {
        snprintf(list, sizeof list, "%s", fields);
        int first = 1;
        for (char *f = strtok(list, ","); f; f = strtok(NULL, ",")) {
            printf("%s%s%s", first ? "" : ", ", f, strcmp(f, "memory.total") == 0 && units ? " [MiB]" : "");
            first = 0;
        }
        printf("\n");
    }
    for (unsigned int i = 0; i < count; i++) {
        info_t g;
        if (get(i, &g)) return 15;
        snprintf(list, sizeof list, "%s", fields);
        int first = 1;
        for (char *f = strtok(list, ","); f; f = strtok(NULL, ",")) {
            printf("%s", first ? "" : ", ");
            first = 0;
            if (strcmp(f, "index") == 0) printf("%u", g.index);
            else if (strcmp(f, "name") == 0) printf("%s", g.name);
            else if (strcmp(f, "uuid") == 0) printf("%s", g.uuid);
            else if (strcmp(f, "pci.bus_id") == 0) printf("%s", g.bus_id);
            else if (strcmp(f, "minor_number") == 0) printf("%u", g.minor);
            else if (strcmp(f, "memory.total") == 0) printf("%llu%s", g.memory >> 20, units ? " MiB" : "");
            else if (strcmp(f, "driver_version") == 0) printf("%s", driver);
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    nvmlReturn_t ret = nvmlInit_v2();
    if (ret) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: %s\n",
               nvmlErrorString(ret));
        return 9;
    }
    nvmlSystemGetDriverVersion(driver, sizeof driver);
    int code = 0;
    const char *fields = NULL, *format = "csv";
    int list = 0, setting = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            /* NVIDIA's DRA plugin's init container runs `nvidia-smi --version` to see the driver. */
            printf("NVIDIA-SMI version  : %s (gpu-scheduler stand-in)\nDRIVER version      : %s\n", driver, driver);
            nvmlShutdown();
            return 0;
        }
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0) list = 1;
        else if (strncmp(argv[i], "--query-gpu=", 12) == 0) fields = argv[i] + 12;
        else if (strncmp(argv[i], "--format=", 9) == 0) format = argv[i] + 9;
        else if (strcmp(argv[i], "-i") == 0 || strcmp(argv[i], "--set-timeslice") == 0) i++;
        else if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "compute-policy") == 0) {
            setting = 1;
            if (strcmp(argv[i], "-c") == 0) i++;
        } else {
            fprintf(stderr, "stand-in nvidia-smi: unsupported argument %s\n", argv[i]);
            code = 2;
        }
    }
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    if (code) {
    } else if (setting) {
        printf("stand-in nvidia-smi: setting accepted, nothing changed\n");
    } else if (fields) {
        code = query(fields, format);
    } else if (list) {
        for (unsigned int i = 0; i < count && !code; i++) {
            info_t g;
            if (get(i, &g)) code = 15;
            else printf("GPU %u: %s (UUID: %s)\n", g.index, g.name, g.uuid);
        }
    } else {
        int cuda = 0;
        nvmlSystemGetCudaDriverVersion(&cuda);
        printf("NVIDIA-SMI (stand-in)  Driver Version: %s  CUDA Version: %d.%d\n", driver, cuda / 1000,
               (cuda % 1000) / 10);
        for (unsigned int i = 0; i < count && !code; i++) {
            info_t g;
            if (get(i, &g)) code = 15;
            else printf("%3u  %-40s %s  %s  %llu MiB\n", g.index, g.name, g.bus_id, g.uuid, g.memory >> 20);
        }
        if (count == 0) printf("No devices were found\n");
    }
    nvmlShutdown();
    return code;
}
