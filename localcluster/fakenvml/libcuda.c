/*
 * The stand-in driver root's libcuda.so.<driver version>: a CUDA driver that has no device.
 *
 * NVIDIA's container toolkit (nvidia-ctk cdi generate, nvidia-container-runtime, v1.18)
 * finds the driver's library folder by looking for libcuda.so.<version>, the version NVML
 * reports; the CDI specs it writes then mount the driver's libraries from there. A real
 * driver root has it, so the stand-in root has it too. It computes nothing: cuInit says
 * CUDA_ERROR_NO_DEVICE, so a program in a container that reaches CUDA learns that no GPU
 * is really there instead of failing to load a library.
 */
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100 };

#ifndef FAKE_CUDA_VERSION
#define FAKE_CUDA_VERSION 13000
#endif

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = FAKE_CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    (void)count;
    return CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
        case CUDA_SUCCESS: *text = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
        case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected (gpu-scheduler stand-in driver)"; break;
        default: *text = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
