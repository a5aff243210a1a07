/*
 * A stand-in NVML (libnvidia-ml.so.1): the NVML calls that these programs make, with the
 * C signatures of the real library, describing GPUs that do not exist:
 *
 *   - the check program (kube_gpu_scheduler/check/nvml.py, through pynvml);
 *   - NVIDIA's DRA kubelet plugin (sigs.k8s.io/dra-driver-nvidia-gpu, gpu-kubelet-plugin,
 *     through github.com/NVIDIA/go-nvml and go-nvlib), which publishes one ResourceSlice
 *     device per GPU from what this library says;
 *   - NVIDIA's container toolkit (nvidia-ctk cdi generate, nvidia-container-runtime in cdi
 *     mode), which writes CDI specs from it;
 *   - nvidia-smi.c beside this file (the driver root's nvidia-smi).
 *
 * localcluster/nvidia.py compiles it (with the machine's `cc`); docs/nvidia-stack.md lists
 * the calls and why each one is here. A call that is not here is not exported: go-nvml
 * binds its calls lazily, so a program that makes another call dies with "symbol lookup
 * error: undefined symbol: nvml...", naming it. Calls that go-nvlib first probes with
 * dlsym (nvmlDeviceGetMigMode, nvmlDeviceGetAddressingMode) are left out on purpose: the
 * GPUs are then neither MIG-capable nor coherent.
 *
 * Where the GPUs come from, first match wins:
 *
 * 1. The environment (the check's tests), read at init:
 *      FAKE_NVML_GPUS         number of physical GPUs (default 0)
 *      FAKE_NVML_UUIDS        comma-separated UUIDs by physical index
 *                             (default GPU-fa6e0000-0000-4000-8000-00000000000I)
 *      FAKE_NVML_BUS_IDS      comma-separated PCI bus IDs by physical index
 *                             (default 00000000:XX:00.0, XX = 0x18 + index: PCI bus order)
 *      FAKE_NVML_LOST         comma-separated physical indices that are counted but
 *                             whose handle lookup fails with NVML_ERROR_GPU_IS_LOST
 *      FAKE_NVML_INIT_ERROR   an NVML return code for init (9: driver not loaded)
 *      FAKE_NVML_DRIVER       the driver version (default 550.54.15)
 *      FAKE_NVML_CONTAINER    "1": behave as inside a container started by the NVIDIA
 *                             container runtime's legacy mode: only the GPUs
 *                             NVIDIA_VISIBLE_DEVICES names (physical indices or UUIDs, or
 *                             "all") are visible, renumbered 0..n-1 in PCI bus order.
 *    The minor number of GPU i is i.
 *
 * 2. A machine compiled in (FAKE_NVML_MACHINE names a header that localcluster/nvidia.py
 *    writes: the GPUs in PCI bus order, the driver and CUDA versions, the driver root's
 *    device folder). As the real driver, it sees the GPUs whose device nodes it can see:
 *    the first of FAKE_NVML_DEV_DIR, the dev/ of the driver root this library is loaded
 *    from (<root>/usr/lib64/<this library> -> <root>/dev: the driver root mounted elsewhere,
 *    as NVIDIA's DRA plugin mounts it at /driver-root in its container) and /dev that holds
 *    a character device `nvidiactl` is
 *    the device folder (none: init fails with NVML_ERROR_DRIVER_NOT_LOADED), and a GPU is
 *    visible when `nvidia<minor>` there is a character device. On the host (the DRA
 *    plugin, nvidia-ctk) that is the driver root's dev/ with every GPU; in a container that
 *    the CDI spec gave /dev/nvidiactl and /dev/nvidia<minor> of some GPUs, only those, and
 *    renumbered from 0, as NVML in a container numbers them.
 *
 * 3. Otherwise no GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_GPUS 64
#define TEXT 96

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

/* nvmlDeviceArchitecture_t and nvmlBrandType_t values (nvml.h). */
#define ARCH_HOPPER 9
#define BRAND_NVIDIA 14

/* nvmlPciInfo_t (NVML 9.0 and later: nvmlDeviceGetPciInfo_v2 and _v3). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* nvmlMemory_t (nvmlDeviceGetMemoryInfo, v1). */
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* One GPU as the machine header describes it. */
typedef struct {
    const char *uuid;
    const char *bus_id; /* NVML's form: 00000000:18:00.0 */
    unsigned int minor;
    const char *name;
    unsigned long long memory; /* bytes */
    unsigned int architecture; /* NVML_DEVICE_ARCH_* */
    int cc_major, cc_minor;    /* CUDA compute capability */
    unsigned int brand;        /* NVML_BRAND_* */
    unsigned int pci_device_id; /* (device << 16) | vendor 0x10DE */
} machine_gpu_t;

#ifdef FAKE_NVML_MACHINE
#include FAKE_NVML_MACHINE
#endif

typedef struct {
    int physical;
    int lost;
    unsigned int minor;
    char uuid[TEXT];
    char bus_id[32];
    char name[TEXT];
    unsigned long long memory;
    unsigned int architecture;
    int cc_major, cc_minor;
    unsigned int brand;
    unsigned int pci_device_id;
} gpu_t;

typedef gpu_t *nvmlDevice_t;

static gpu_t physical[MAX_GPUS];
static int n_physical;
static gpu_t *visible[MAX_GPUS];
static int n_visible;
static int initialised;
static char driver[TEXT];
static int cuda_version;

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

static void defaults(gpu_t *g, int i) {
    memset(g, 0, sizeof *g);
    g->physical = i;
    g->minor = (unsigned int)i;
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3 (fake NVML)");
    g->memory = 80ULL << 30;
    g->architecture = ARCH_HOPPER;
    g->cc_major = 9;
    g->cc_minor = 0;
    g->brand = BRAND_NVIDIA;
    g->pci_device_id = 0x233010DE;
}

/* Machine 1: the environment. */
static nvmlReturn_t from_environment(const char *count) {
    n_physical = atoi(count);
    if (n_physical < 0 || n_physical > MAX_GPUS) return NVML_ERROR_UNKNOWN;
    const char *uuids = getenv("FAKE_NVML_UUIDS");
    const char *buses = getenv("FAKE_NVML_BUS_IDS");
    const char *lost = getenv("FAKE_NVML_LOST");
    for (int i = 0; i < n_physical; i++) {
        gpu_t *g = &physical[i];
        defaults(g, i);
        if (!field(uuids, i, g->uuid, sizeof g->uuid))
            snprintf(g->uuid, sizeof g->uuid, "GPU-fa6e0000-0000-4000-8000-%012d", i);
        if (!field(buses, i, g->bus_id, sizeof g->bus_id))
            snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x18 + i);
        char index[16];
        snprintf(index, sizeof index, "%d", i);
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
    cuda_version = 12040;
    return NVML_SUCCESS;
}

/* Machine 2: compiled in; the GPUs whose device nodes are there. */
#ifdef FAKE_NVML_MACHINE
static int char_device(const char *dir, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* <root>/dev for the driver root holding this library at <root>/usr/lib64/, else "". */
static void own_root_dev(char *out, size_t size) {
    Dl_info info;
    out[0] = 0;
    if (!dladdr((void *)own_root_dev, &info) || !info.dli_fname) return;
    const char *suffix = "/usr/lib64/";
    const char *at = strstr(info.dli_fname, suffix);
    if (!at || strchr(at + strlen(suffix), '/')) return;
    snprintf(out, size, "%.*s/dev", (int)(at - info.dli_fname), info.dli_fname);
}

static nvmlReturn_t from_machine(void) {
    char own[4096];
    own_root_dev(own, sizeof own);
    const char *dirs[] = {FAKE_NVML_DEV_DIR, own, "/dev"};
    const char *dev = NULL;
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        if (char_device(dirs[d], "nvidiactl")) {
            dev = dirs[d];
            break;
        }
    }
    if (!dev) return NVML_ERROR_DRIVER_NOT_LOADED;
    n_physical = (int)(sizeof machine_gpus / sizeof machine_gpus[0]);
    if (n_physical > MAX_GPUS) return NVML_ERROR_UNKNOWN;
    n_visible = 0;
    for (int i = 0; i < n_physical; i++) {
        const machine_gpu_t *m = &machine_gpus[i];
        gpu_t *g = &physical[i];
        defaults(g, i);
        g->minor = m->minor;
        snprintf(g->uuid, sizeof g->uuid, "%s", m->uuid);
        snprintf(g->bus_id, sizeof g->bus_id, "%s", m->bus_id);
        snprintf(g->name, sizeof g->name, "%s", m->name);
        g->memory = m->memory;
        g->architecture = m->architecture;
        g->cc_major = m->cc_major;
        g->cc_minor = m->cc_minor;
        g->brand = m->brand;
        g->pci_device_id = m->pci_device_id;
        char node[32];
        snprintf(node, sizeof node, "nvidia%u", m->minor);
        if (char_device(dev, node)) visible[n_visible++] = g;
    }
    snprintf(driver, sizeof driver, "%s", FAKE_NVML_DRIVER_VERSION);
    cuda_version = FAKE_NVML_CUDA_VERSION;
    return NVML_SUCCESS;
}
#else
static nvmlReturn_t from_machine(void) {
    n_physical = n_visible = 0;
    snprintf(driver, sizeof driver, "550.54.15");
    cuda_version = 12040;
    return NVML_SUCCESS;
}
#endif

static nvmlReturn_t setup(void) {
    const char *err = getenv("FAKE_NVML_INIT_ERROR");
    if (err && *err) return atoi(err);
    const char *count = getenv("FAKE_NVML_GPUS");
    if (count && *count) return from_environment(count);
    return from_machine();
}

/* ------------------------------------------------------------------ init, system */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (initialised) {
        initialised++;
        return NVML_SUCCESS;
    }
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
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
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

/* NVML's version is "<CUDA major>.<driver version>", e.g. 12.550.54.15. */
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    char text[TEXT + 16];
    snprintf(text, sizeof text, "%d.%s", cuda_version / 1000, driver);
    return copy(text, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

/* ------------------------------------------------------------------ handles */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)n_visible;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)n_visible) return NVML_ERROR_INVALID_ARGUMENT;
    if (visible[index]->lost) return NVML_ERROR_GPU_IS_LOST;
    *device = visible[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n_visible; i++) {
        if (strcmp(visible[i]->uuid, uuid) == 0) {
            if (visible[i]->lost) return NVML_ERROR_GPU_IS_LOST;
            *device = visible[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Bus IDs compare by value: 0000:18:00.0, 00000000:18:00.0 and 00000000:18:00.0 in any case. */
static int same_bus(const char *a, const char *b) {
    unsigned int da, ba, va, fa, db, bb, vb, fb;
    if (sscanf(a, "%x:%x:%x.%x", &da, &ba, &va, &fa) != 4) return 0;
    if (sscanf(b, "%x:%x:%x.%x", &db, &bb, &vb, &fb) != 4) return 0;
    return da == db && ba == bb && va == vb && fa == fb;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n_visible; i++) {
        if (same_bus(visible[i]->bus_id, bus_id)) {
            if (visible[i]->lost) return NVML_ERROR_GPU_IS_LOST;
            *device = visible[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* ------------------------------------------------------------------ one device */

#define DEVICE_CALL(device)                              \
    do {                                                 \
        if (!initialised) return NVML_ERROR_UNINITIALIZED; \
        if (!(device)) return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_CALL(device);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n_visible; i++) {
        if (visible[i] == device) {
            *index = (unsigned int)i;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device);
    return copy(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL(device);
    return copy(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_CALL(device);
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = device->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(device);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0;
    sscanf(device->bus_id, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device->pci_device_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", device->bus_id);
    snprintf(pci->busId, sizeof pci->busId, "%s", device->bus_id);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE_CALL(device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *architecture) {
    DEVICE_CALL(device);
    if (!architecture) return NVML_ERROR_INVALID_ARGUMENT;
    *architecture = device->architecture;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *brand) {
    DEVICE_CALL(device);
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    *brand = device->brand;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEVICE_CALL(device);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

/* No GPU here is a MIG device, and none offers MIG profiles. */
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    DEVICE_CALL(device);
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile, void *info) {
    (void)profile;
    (void)info;
    DEVICE_CALL(device);
    return NVML_ERROR_NOT_SUPPORTED;
}
