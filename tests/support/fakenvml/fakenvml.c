/*
 * A fake NVML (libnvidia-ml.so.1) for the tests: the few functions that
 * kube_gpu_scheduler/check/nvml.py and pynvml's init path call, with the C signatures of
 * the real library, so the check's NVML path runs unchanged on a machine
 * without a GPU. tests/support/fakenvml.py compiles it with the machine's `cc`
 * into a temporary directory; pynvml finds it through LD_LIBRARY_PATH, as it
 * would find the driver's library.
 *
 * Configured by the environment, read at nvmlInitWithFlags / nvmlInit_v2:
 *   FAKE_NVML_GPUS         number of physical GPUs (default 0)
 *   FAKE_NVML_UUIDS        comma-separated UUIDs by physical index
 *                          (default GPU-fa6e0000-0000-4000-8000-00000000000I)
 *   FAKE_NVML_BUS_IDS      comma-separated PCI bus IDs by physical index
 *                          (default 00000000:XX:00.0, XX = 0x18 + index: PCI bus order)
 *   FAKE_NVML_LOST         comma-separated physical indices that are counted but
 *                          whose handle lookup fails with NVML_ERROR_GPU_IS_LOST
 *   FAKE_NVML_INIT_ERROR   an NVML return code for init (9: driver not loaded)
 *   FAKE_NVML_DRIVER       the driver version (default 550.54.15)
 *   FAKE_NVML_CONTAINER    "1": behave as inside a container started by the NVIDIA
 *                          container runtime: only the GPUs NVIDIA_VISIBLE_DEVICES
 *                          names (physical indices or UUIDs, or "all") are visible,
 *                          renumbered 0..n-1 in PCI bus order; a name that matches
 *                          no GPU is left out.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define MAX_GPUS 64
#define TEXT 96

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

/* pynvml's nvmlPciInfo_t (NVML 9.0 and later). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    int physical;
    int lost;
    char uuid[TEXT];
    char bus_id[32];
} gpu_t;

typedef gpu_t *nvmlDevice_t;

static gpu_t physical[MAX_GPUS];
static int n_physical;
static gpu_t *visible[MAX_GPUS];
static int n_visible;
static int initialised;
static char driver[TEXT];

/* The i-th comma-separated field of list (trimmed) into out; 0 when absent. */
static int field(const char *list, int i, char *out, size_t size) {
    if (!list) return 0;
    const char *p = list;
    for (int k = 0; k < i; k++) {
        p = strchr(p, ',');
        if (!p) return 0;
        p++;
    }
    while (*p == ' ') p++;
    size_t len = strcspn(p, ",");
    while (len > 0 && p[len - 1] == ' ') len--;
    if (len == 0 || len >= size) return 0;
    memcpy(out, p, len);
    out[len] = '\0';
    return 1;
}

static int listed(const char *list, const gpu_t *gpu) {
    char item[TEXT];
    char index[16];
    snprintf(index, sizeof index, "%d", gpu->physical);
    for (int i = 0; field(list, i, item, sizeof item); i++) {
        if (strcmp(item, "all") == 0 || strcmp(item, index) == 0 || strcmp(item, gpu->uuid) == 0) return 1;
    }
    return 0;
}

static nvmlReturn_t setup(void) {
    const char *err = getenv("FAKE_NVML_INIT_ERROR");
    if (err && *err) return atoi(err);
    const char *count = getenv("FAKE_NVML_GPUS");
    n_physical = count ? atoi(count) : 0;
    if (n_physical < 0 || n_physical > MAX_GPUS) return NVML_ERROR_UNKNOWN;
    const char *uuids = getenv("FAKE_NVML_UUIDS");
    const char *buses = getenv("FAKE_NVML_BUS_IDS");
    const char *lost = getenv("FAKE_NVML_LOST");
    for (int i = 0; i < n_physical; i++) {
        gpu_t *g = &physical[i];
        g->physical = i;
        if (!field(uuids, i, g->uuid, sizeof g->uuid))
            snprintf(g->uuid, sizeof g->uuid, "GPU-fa6e0000-0000-4000-8000-%012d", i);
        if (!field(buses, i, g->bus_id, sizeof g->bus_id))
            snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x18 + i);
        char index[16];
        snprintf(index, sizeof index, "%d", i);
        g->lost = 0;
        char item[TEXT];
        for (int k = 0; field(lost, k, item, sizeof item); k++)
            if (strcmp(item, index) == 0) g->lost = 1;
    }
    const char *container = getenv("FAKE_NVML_CONTAINER");
    const char *wanted = getenv("NVIDIA_VISIBLE_DEVICES");
    n_visible = 0;
    for (int i = 0; i < n_physical; i++) {
        if (container && strcmp(container, "1") == 0 && !listed(wanted, &physical[i])) continue;
        visible[n_visible++] = &physical[i];
    }
    const char *version = getenv("FAKE_NVML_DRIVER");
    snprintf(driver, sizeof driver, "%s", version && *version ? version : "550.54.15");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t ret = setup();
    if (ret == NVML_SUCCESS) initialised++;
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case 9: return "Driver Not Loaded";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        default: return "Unknown Error";
    }
}

static nvmlReturn_t copy(const char *text, char *out, unsigned int size) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy(driver, version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)n_visible;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)n_visible) return NVML_ERROR_INVALID_ARGUMENT;
    if (visible[index]->lost) return NVML_ERROR_GPU_IS_LOST;
    *device = visible[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    return copy("NVIDIA H100 80GB HBM3 (fake NVML)", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    return copy(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0;
    sscanf(device->bus_id, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", device->bus_id);
    snprintf(pci->busId, sizeof pci->busId, "%s", device->bus_id);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = 80ULL << 30;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}
