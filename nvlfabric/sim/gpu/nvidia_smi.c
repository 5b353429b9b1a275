/*
 * nvlfabric nvidia-smi stand-in: what GPU software and people run on a node to see its GPUs,
 * answered from the node's NVML (the NVML stand-in in the same driver root), so it always agrees
 * with what NVML says.
 *
 *   nvidia-smi                 a summary: driver and CUDA versions, one line per GPU
 *   nvidia-smi -L              "GPU <i>: <name> (UUID: <uuid>)"
 *   nvidia-smi --query-gpu=index,name,uuid,driver_version,pci.bus_id --format=csv[,noheader]
 *   nvidia-smi --version
 *
 * Like the real one it exits 9 with its well-known message when NVML cannot be initialised.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvret;
typedef void *nvdev;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_info;

static nvret (*p_init)(void);
static nvret (*p_count)(unsigned int *);
static nvret (*p_handle)(unsigned int, nvdev *);
static nvret (*p_name)(nvdev, char *, unsigned int);
static nvret (*p_uuid)(nvdev, char *, unsigned int);
static nvret (*p_driver)(char *, unsigned int);
static nvret (*p_cuda)(int *);
static nvret (*p_pci)(nvdev, pci_info *);
static const char *(*p_error)(nvret);

static void *load(const char *argv0)
{
    char own[4096];
    snprintf(own, sizeof own, "%s", argv0);
    char path[4200];
    /* <driver root>/usr/bin/nvidia-smi beside <driver root>/usr/lib64/libnvidia-ml.so.1 */
    snprintf(path, sizeof path, "%s/../lib64/libnvidia-ml.so.1", dirname(own));
    void *lib = dlopen(path, RTLD_NOW);
    return lib ? lib : dlopen("libnvidia-ml.so.1", RTLD_NOW);
}

static int failed(void)
{
    fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                    "that the latest NVIDIA driver is installed and running.\n\n");
    return 9;
}

static int field(const char *name, unsigned int i, nvdev dev, const char *driver, char *out, size_t len)
{
    pci_info pci;
    if (strcmp(name, "index") == 0) {
        snprintf(out, len, "%u", i);
    } else if (strcmp(name, "name") == 0) {
        return p_name(dev, out, (unsigned int)len);
    } else if (strcmp(name, "uuid") == 0 || strcmp(name, "gpu_uuid") == 0) {
        return p_uuid(dev, out, (unsigned int)len);
    } else if (strcmp(name, "driver_version") == 0) {
        snprintf(out, len, "%s", driver);
    } else if (strcmp(name, "pci.bus_id") == 0) {
        memset(&pci, 0, sizeof pci);
        if (p_pci == NULL || p_pci(dev, &pci) != 0)
            return 1;
        snprintf(out, len, "%s", pci.busId);
    } else {
        fprintf(stderr, "Field \"%s\" is not a valid field to query.\n\n", name);
        return -1;
    }
    return 0;
}

static int query(const char *fields, const char *format, const char *driver, unsigned int count)
{
    int header = strstr(format, "noheader") == NULL;
    char list[1024];
    if (header)
        printf("%s\n", fields);
    for (unsigned int i = 0; i < count; i++) {
        nvdev dev;
        if (p_handle(i, &dev) != 0)
            return failed();
        snprintf(list, sizeof list, "%s", fields);
        int first = 1;
        for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
            char value[256] = "";
            while (*f == ' ')
                f++;
            int rc = field(f, i, dev, driver, value, sizeof value);
            if (rc < 0)
                return 2;
            printf("%s%s", first ? "" : ", ", rc == 0 ? value : "[N/A]");
            first = 0;
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    void *lib = load(argv[0]);
    if (lib == NULL)
        return failed();
    *(void **)&p_init = dlsym(lib, "nvmlInit_v2");
    *(void **)&p_count = dlsym(lib, "nvmlDeviceGetCount_v2");
    *(void **)&p_handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&p_name = dlsym(lib, "nvmlDeviceGetName");
    *(void **)&p_uuid = dlsym(lib, "nvmlDeviceGetUUID");
    *(void **)&p_driver = dlsym(lib, "nvmlSystemGetDriverVersion");
    *(void **)&p_cuda = dlsym(lib, "nvmlSystemGetCudaDriverVersion");
    *(void **)&p_pci = dlsym(lib, "nvmlDeviceGetPciInfo_v3");
    *(void **)&p_error = dlsym(lib, "nvmlErrorString");
    if (!p_init || !p_count || !p_handle || !p_name || !p_uuid || !p_driver || !p_cuda || p_init() != 0)
        return failed();
    char driver[80] = "";
    int cuda = 0;
    unsigned int count = 0;
    if (p_driver(driver, sizeof driver) != 0 || p_cuda(&cuda) != 0 || p_count(&count) != 0)
        return failed();
    const char *fields = NULL, *format = "csv";
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0) {
            list = 1;
        } else if (strncmp(argv[i], "--query-gpu=", 12) == 0) {
            fields = argv[i] + 12;
        } else if (strncmp(argv[i], "--format=", 9) == 0) {
            format = argv[i] + 9;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
                   "CUDA Version        : %d.%d\n", driver, driver, driver, cuda / 1000, (cuda % 1000) / 10);
            return 0;
        } else {
            fprintf(stderr, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
                            "(this stand-in knows -L, --query-gpu=..., --format=csv[,noheader], --version)\n");
            return 2;
        }
    }
    if (fields != NULL)
        return query(fields, format, driver, count);
    if (!list)
        printf("NVIDIA-SMI %s    Driver Version: %s    CUDA Version: %d.%d\n", driver, driver, cuda / 1000,
               (cuda % 1000) / 10);
    for (unsigned int i = 0; i < count; i++) {
        nvdev dev;
        char name[96] = "", uuid[96] = "";
        if (p_handle(i, &dev) != 0 || p_name(dev, name, sizeof name) != 0 || p_uuid(dev, uuid, sizeof uuid) != 0)
            return failed();
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
    }
    return 0;
}
