/*
 * nvlfabric libcuda stand-in: the CUDA driver library a GB200 node's driver root carries, named
 * after the driver version (libcuda.so.<version>, with libcuda.so.1 beside it), which GPU software
 * looks for. It answers the entry points that describe the driver and its devices, from the
 * node's NVML; every other entry point is absent (a simulated node computes nothing).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define API __attribute__((visibility("default")))
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101

typedef int CUresult;
typedef int CUdevice;

/* The entry points this stand-in answers (CUDA's driver API names and signatures). */
API CUresult cuInit(unsigned int flags);
API CUresult cuDriverGetVersion(int *driverVersion);
API CUresult cuDeviceGetCount(int *count);
API CUresult cuDeviceGet(CUdevice *device, int ordinal);
API CUresult cuDeviceGetName(char *name, int len, CUdevice dev);

static int initialised;
static unsigned int gpus;
static int cuda_version;
static void *nvml;

static void *nvml_symbol(const char *name)
{
    if (nvml == NULL) {
        Dl_info self;
        char path[4200] = "libnvidia-ml.so.1";
        if (dladdr((void *)nvml_symbol, &self) && self.dli_fname) {
            snprintf(path, sizeof path, "%s", self.dli_fname);
            char *slash = strrchr(path, '/');
            if (slash)
                snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libnvidia-ml.so.1");
        }
        nvml = dlopen(path, RTLD_NOW);
        if (nvml == NULL)
            nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (nvml == NULL)
            return NULL;
    }
    return dlsym(nvml, name);
}

API CUresult cuInit(unsigned int flags)
{
    int (*init)(void) = NULL;
    int (*count)(unsigned int *) = NULL;
    int (*version)(int *) = NULL;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *(void **)&init = nvml_symbol("nvmlInit_v2");
    *(void **)&count = nvml_symbol("nvmlDeviceGetCount_v2");
    *(void **)&version = nvml_symbol("nvmlSystemGetCudaDriverVersion");
    if (!init || !count || !version || init() != 0 || count(&gpus) != 0 || version(&cuda_version) != 0)
        return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return gpus ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

API CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised && cuInit(0) != CUDA_SUCCESS && cuda_version == 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    *driverVersion = cuda_version;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = (int)gpus;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || (unsigned int)ordinal >= gpus)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    void *handle = NULL;
    int (*by_index)(unsigned int, void **) = NULL;
    int (*get_name)(void *, char *, unsigned int) = NULL;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *(void **)&by_index = nvml_symbol("nvmlDeviceGetHandleByIndex_v2");
    *(void **)&get_name = nvml_symbol("nvmlDeviceGetName");
    if (dev < 0 || !by_index || !get_name || by_index((unsigned int)dev, &handle) != 0 ||
        get_name(handle, name, (unsigned int)len) != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}
