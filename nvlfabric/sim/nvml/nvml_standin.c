/*
 * nvlfabric NVML stand-in: a libnvidia-ml.so.1 that answers as one node of a simulated
 * GB200 NVL72 cluster.
 *
 * Configuration (see README.md):
 *   NVLFABRIC_NVML_TOPOLOGY  path of the topology file
 *   NVLFABRIC_NVML_NODE      the node this process is
 *   NVLFABRIC_NVML_FAULTS    path of this node's fault file (optional; default
 *                            <topology dir>/faults/<node>.faults)
 * Without the first two, the node's own file beside this library (nvlfabric-node.conf, lines
 * topology=, node=, faults=) says the same: a node's driver root carries its identity as a real
 * driver's files do, so a process started with a clean environment (env -i) still knows its node.
 *
 * The topology is read by the first nvmlInit* (reference count 0 -> 1). The fault file is
 * checked on every call (one stat) and re-read when its identity (inode, size, mtime,
 * ctime) changes, so faults can be injected into running processes.
 *
 * Every entry point takes one process-wide mutex; the library keeps no other state.
 */
#define _GNU_SOURCE /* dladdr: where this library was loaded from */

#include "standin.h"

#include <dlfcn.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define API SI_API

struct nvmlDevice_st {
    unsigned slot;
};

/* ------------------------------------------------------------------ state */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_refcount;
static struct si_topology g_topo;
static struct nvmlDevice_st g_devices[SI_MAX_GPUS] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
};
_Static_assert(SI_MAX_GPUS == 16, "g_devices initialiser lists 16 slots");

static char g_last_error[SI_ERR_SIZE];

static char g_fault_path[4096];
static struct si_faults g_faults;
static struct {
    int known; /* 0: never looked */
    int exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} g_fault_id;

/* ------------------------------------------------------------------ helpers */

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Records a configuration problem for nvlfabricNvmlGetLastError and prints it on stderr. */
static void report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nvlfabric-nvml: %s\n", g_last_error);
    fflush(stderr);
}

static int same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Re-reads the fault file if it changed since the last look. Lock held. */
static void refresh_faults(void)
{
    struct stat st;
    char err[SI_ERR_SIZE];

    if (g_fault_path[0] == '\0')
        return;
    if (stat(g_fault_path, &st) != 0) {
        if (!g_fault_id.known || g_fault_id.exists) {
            int e = errno;
            memset(&g_faults, 0, sizeof g_faults);
            if (e != ENOENT)
                report("fault file %s: %s; no faults applied", g_fault_path, strerror(e));
            else
                g_last_error[0] = '\0';
        }
        g_fault_id.known = 1;
        g_fault_id.exists = 0;
        return;
    }
    if (g_fault_id.known && g_fault_id.exists && g_fault_id.dev == st.st_dev &&
        g_fault_id.ino == st.st_ino && g_fault_id.size == st.st_size &&
        same_time(&g_fault_id.mtime, &st.st_mtim) && same_time(&g_fault_id.ctime, &st.st_ctim))
        return;
    g_fault_id.known = 1;
    g_fault_id.exists = 1;
    g_fault_id.dev = st.st_dev;
    g_fault_id.ino = st.st_ino;
    g_fault_id.size = st.st_size;
    g_fault_id.mtime = st.st_mtim;
    g_fault_id.ctime = st.st_ctim;
    if (si_load_faults(g_fault_path, g_topo.gpu_count, &g_faults, err, sizeof err) != 0)
        report("fault file ignored: %s", err);
    else
        g_last_error[0] = '\0';
}

static int gpu_missing(unsigned slot)
{
    const struct si_gpu_fault *f = &g_faults.gpu[slot];
    return (f->set & SI_GF_MISSING) && f->missing;
}

static unsigned present_count(void)
{
    unsigned i, n = 0;
    for (i = 0; i < g_topo.gpu_count; i++)
        if (!gpu_missing(i))
            n++;
    return n;
}

/* Common entry for every call except init, shutdown and nvmlErrorString. Lock held. */
static nvmlReturn_t enter(enum si_call call)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    refresh_faults();
    if (g_faults.call_error[call] != NVML_SUCCESS)
        return g_faults.call_error[call];
    if (g_faults.all_calls_error != NVML_SUCCESS)
        return g_faults.all_calls_error;
    return NVML_SUCCESS;
}

/* Lookups that land on a GPU: missing GPUs are invisible, failing GPUs fail the lookup. */
static nvmlReturn_t gpu_lookup_result(unsigned slot, nvmlDevice_t *device)
{
    const struct si_gpu_fault *f = &g_faults.gpu[slot];
    if ((f->set & SI_GF_ERROR) && f->error != NVML_SUCCESS)
        return f->error;
    *device = &g_devices[slot];
    return NVML_SUCCESS;
}

/* Validates a handle for a device call. Lock held, enter() succeeded. */
static nvmlReturn_t device_check(nvmlDevice_t device, const struct si_gpu **gpu)
{
    uintptr_t base = (uintptr_t)&g_devices[0], p = (uintptr_t)device;
    unsigned slot;
    const struct si_gpu_fault *f;

    if (device == NULL || p < base || p >= base + sizeof g_devices ||
        (p - base) % sizeof g_devices[0] != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    slot = (unsigned)((p - base) / sizeof g_devices[0]);
    if (slot >= g_topo.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_missing(slot))
        return NVML_ERROR_GPU_IS_LOST;
    f = &g_faults.gpu[slot];
    if ((f->set & SI_GF_ERROR) && f->error != NVML_SUCCESS)
        return f->error;
    *gpu = &g_topo.gpus[slot];
    return NVML_SUCCESS;
}

#define LOCK() pthread_mutex_lock(&g_lock)
#define UNLOCK() pthread_mutex_unlock(&g_lock)

/* Begins a device call: lock, enter, check the handle. */
#define DEVICE_CALL(call, device, gpu)                                                          \
    nvmlReturn_t rc_;                                                                           \
    const struct si_gpu *gpu = NULL;                                                            \
    LOCK();                                                                                     \
    rc_ = enter(call);                                                                          \
    if (rc_ == NVML_SUCCESS)                                                                    \
        rc_ = device_check(device, &gpu);                                                       \
    if (rc_ != NVML_SUCCESS) {                                                                  \
        UNLOCK();                                                                               \
        return rc_;                                                                             \
    }

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    size_t n = strlen(src);
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((size_t)length <= n)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ init / shutdown */

#define NODE_FILE "nvlfabric-node.conf"

/* The node's identity from NODE_FILE in this library's directory (as loaded: a driver root's
 * symlink, not what it points to). 0, or -1 with `why` set. */
static int read_node_file(char *topo, char *node, char *faults, size_t size, char *why, size_t whylen)
{
    Dl_info info;
    char path[4096], line[4352];
    if (dladdr((void *)&read_node_file, &info) == 0 || info.dli_fname == NULL || info.dli_fname[0] == '\0') {
        snprintf(why, whylen, "the stand-in cannot tell where it was loaded from");
        return -1;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    int n = slash ? snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, NODE_FILE)
                  : snprintf(path, sizeof path, "%s", NODE_FILE);
    if (n < 0 || (size_t)n >= sizeof path) {
        snprintf(why, whylen, "the path of %s is too long", NODE_FILE);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    topo[0] = node[0] = faults[0] = '\0';
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (eq == NULL || line[0] == '#')
            continue;
        *eq = '\0';
        char *dst = strcmp(line, "topology") == 0 ? topo : strcmp(line, "node") == 0 ? node
                    : strcmp(line, "faults") == 0 ? faults : NULL;
        if (dst != NULL && strlen(eq + 1) < size)
            memcpy(dst, eq + 1, strlen(eq + 1) + 1);
    }
    fclose(f);
    if (topo[0] == '\0' || node[0] == '\0') {
        snprintf(why, whylen, "%s names no topology= or no node=", path);
        return -1;
    }
    return 0;
}

static nvmlReturn_t init_common(unsigned int flags)
{
    const char *topo, *node, *faults;
    static char file_topo[4096], file_node[4096], file_faults[4096];
    char err[SI_ERR_SIZE];
    nvmlReturn_t rc;

    if (flags & ~(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH | NVML_INIT_FLAG_FORCE_INIT))
        return NVML_ERROR_INVALID_ARGUMENT;

    LOCK();
    if (g_refcount == 0) {
        static struct si_topology loaded; /* large; lock held */
        topo = getenv("NVLFABRIC_NVML_TOPOLOGY");
        node = getenv("NVLFABRIC_NVML_NODE");
        faults = getenv("NVLFABRIC_NVML_FAULTS");
        if ((topo == NULL || topo[0] == '\0') && (node == NULL || node[0] == '\0')) {
            char why[SI_ERR_SIZE];
            if (read_node_file(file_topo, file_node, file_faults, sizeof file_node, why, sizeof why) != 0) {
                report("NVLFABRIC_NVML_TOPOLOGY and NVLFABRIC_NVML_NODE are not set, and the node's own file "
                       "says nothing: %s", why);
                UNLOCK();
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
            topo = file_topo;
            node = file_node;
            faults = file_faults;
        }
        if (topo == NULL || topo[0] == '\0') {
            report("NVLFABRIC_NVML_TOPOLOGY is not set: the stand-in has no topology to serve");
            UNLOCK();
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        if (node == NULL || node[0] == '\0') {
            report("NVLFABRIC_NVML_NODE is not set: the stand-in does not know which node it is");
            UNLOCK();
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        if (si_load_topology(topo, node, &loaded, err, sizeof err) != 0) {
            report("topology %s", err);
            UNLOCK();
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        if (faults != NULL && faults[0] != '\0') {
            if (strlen(faults) >= sizeof g_fault_path) {
                report("NVLFABRIC_NVML_FAULTS is too long");
                UNLOCK();
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
            memcpy(g_fault_path, faults, strlen(faults) + 1);
        } else {
            const char *slash = strrchr(topo, '/');
            int n;
            if (slash == NULL)
                n = snprintf(g_fault_path, sizeof g_fault_path, "faults/%s.faults", node);
            else
                n = snprintf(g_fault_path, sizeof g_fault_path, "%.*s/faults/%s.faults",
                             (int)(slash - topo), topo, node);
            if (n < 0 || (size_t)n >= sizeof g_fault_path) {
                report("fault file path for %s is too long", topo);
                g_fault_path[0] = '\0';
                UNLOCK();
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
        }
        g_topo = loaded;
        g_last_error[0] = '\0';
        g_fault_id.known = 0;
        memset(&g_faults, 0, sizeof g_faults);
    }
    refresh_faults();
    if (g_faults.init_error != NVML_SUCCESS) {
        rc = g_faults.init_error;
        UNLOCK();
        return rc;
    }
    if (present_count() == 0 && !(flags & NVML_INIT_FLAG_NO_GPUS)) {
        UNLOCK();
        return NVML_ERROR_GPU_NOT_FOUND;
    }
    g_refcount++;
    UNLOCK();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init_common(flags); }
API nvmlReturn_t nvmlInit_v2(void) { return init_common(0); }
API nvmlReturn_t nvmlInit(void) { return init_common(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc;
    LOCK();
    if (g_refcount == 0) {
        UNLOCK();
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh_faults();
    rc = g_faults.call_error[SI_CALL_SHUTDOWN];
    if (rc == NVML_SUCCESS)
        g_refcount--;
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ errors */

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

API unsigned int nvlfabricNvmlGetLastError(char *buf, unsigned int length)
{
    size_t n;
    LOCK();
    n = strlen(g_last_error);
    if (buf != NULL && length > 0) {
        size_t c = n < (size_t)length - 1 ? n : (size_t)length - 1;
        memcpy(buf, g_last_error, c);
        buf[c] = '\0';
    }
    UNLOCK();
    return (unsigned int)n;
}

/* ------------------------------------------------------------------ system */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc;
    LOCK();
    rc = enter(SI_CALL_SYSTEM_GET_DRIVER_VERSION);
    if (rc == NVML_SUCCESS)
        rc = copy_string(version, length, g_topo.driver_version);
    UNLOCK();
    return rc;
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc;
    LOCK();
    rc = enter(SI_CALL_SYSTEM_GET_NVML_VERSION);
    if (rc == NVML_SUCCESS)
        rc = copy_string(version, length, g_topo.nvml_version);
    UNLOCK();
    return rc;
}

static nvmlReturn_t cuda_driver_version(int *v)
{
    nvmlReturn_t rc;
    LOCK();
    rc = enter(SI_CALL_SYSTEM_GET_CUDA_DRIVER_VERSION);
    if (rc == NVML_SUCCESS) {
        if (v == NULL)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else
            *v = g_topo.cuda_driver_version;
    }
    UNLOCK();
    return rc;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_driver_version(cudaDriverVersion);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_driver_version(cudaDriverVersion);
}

/* ------------------------------------------------------------------ enumeration */

static nvmlReturn_t device_count(unsigned int *count)
{
    nvmlReturn_t rc;
    LOCK();
    rc = enter(SI_CALL_DEVICE_GET_COUNT);
    if (rc == NVML_SUCCESS) {
        if (count == NULL)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else
            *count = present_count();
    }
    UNLOCK();
    return rc;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return device_count(deviceCount); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return device_count(deviceCount); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc;
    unsigned slot, seen = 0;
    LOCK();
    rc = enter(SI_CALL_DEVICE_GET_HANDLE_BY_INDEX);
    if (rc == NVML_SUCCESS) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
        if (device != NULL) {
            for (slot = 0; slot < g_topo.gpu_count; slot++) {
                if (gpu_missing(slot))
                    continue;
                if (seen++ == index) {
                    rc = gpu_lookup_result(slot, device);
                    break;
                }
            }
        }
    }
    UNLOCK();
    return rc;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc;
    unsigned slot;
    LOCK();
    rc = enter(SI_CALL_DEVICE_GET_HANDLE_BY_UUID);
    if (rc == NVML_SUCCESS) {
        if (uuid == NULL || device == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            rc = NVML_ERROR_NOT_FOUND;
            for (slot = 0; slot < g_topo.gpu_count; slot++) {
                if (!gpu_missing(slot) && strcmp(uuid, g_topo.gpus[slot].uuid) == 0) {
                    rc = gpu_lookup_result(slot, device);
                    break;
                }
            }
        }
    }
    UNLOCK();
    return rc;
}

/* Parses "[domain:]bus:device[.function]" in hex, as NVML accepts it; 0 on success. */
static int parse_bus_id_query(const char *s, unsigned *domain, unsigned *bus, unsigned *dev)
{
    unsigned long long part[3] = {0, 0, 0};
    unsigned nparts = 0, digits = 0;
    const char *c = s;

    for (;; c++) {
        char ch = *c;
        if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F')) {
            unsigned d = (unsigned)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
            if (nparts >= 3 || ++digits > 8)
                return -1;
            part[nparts] = part[nparts] * 16 + d;
            continue;
        }
        if (digits == 0)
            return -1;
        nparts++;
        digits = 0;
        if (ch == ':' && nparts < 3)
            continue;
        if (ch == '.' || ch == '\0')
            break;
        return -1;
    }
    if (*c == '.') {
        c++;
        if (*c < '0' || *c > '7' || c[1] != '\0')
            return -1;
    }
    if (nparts == 2) {
        part[2] = part[1];
        part[1] = part[0];
        part[0] = 0;
    } else if (nparts != 3) {
        return -1;
    }
    if (part[0] > 0xFFFFFFFFull || part[1] > 0xFF || part[2] > 0x1F)
        return -1;
    *domain = (unsigned)part[0];
    *bus = (unsigned)part[1];
    *dev = (unsigned)part[2];
    return 0;
}

static nvmlReturn_t handle_by_bus_id(const char *pciBusId, nvmlDevice_t *device)
{
    nvmlReturn_t rc;
    unsigned slot, domain, bus, dev;
    LOCK();
    rc = enter(SI_CALL_DEVICE_GET_HANDLE_BY_PCI_BUS_ID);
    if (rc == NVML_SUCCESS) {
        if (pciBusId == NULL || device == NULL ||
            parse_bus_id_query(pciBusId, &domain, &bus, &dev) != 0) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            rc = NVML_ERROR_NOT_FOUND;
            for (slot = 0; slot < g_topo.gpu_count; slot++) {
                const struct si_gpu *g = &g_topo.gpus[slot];
                if (!gpu_missing(slot) && g->pci_domain == domain && g->pci_bus == bus &&
                    g->pci_device == dev) {
                    rc = gpu_lookup_result(slot, device);
                    break;
                }
            }
        }
    }
    UNLOCK();
    return rc;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus_id(pciBusId, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus_id(pciBusId, device);
}

/* ------------------------------------------------------------------ identity */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_NAME, device, gpu)
    rc_ = copy_string(name, length, gpu->name);
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_UUID, device, gpu)
    rc_ = copy_string(uuid, length, gpu->uuid);
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_SERIAL, device, gpu)
    rc_ = gpu->serial[0] == '\0' ? NVML_ERROR_NOT_SUPPORTED : copy_string(serial, length, gpu->serial);
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber, unsigned int length)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_BOARD_PART_NUMBER, device, gpu)
    rc_ = gpu->part_number[0] == '\0' ? NVML_ERROR_NOT_SUPPORTED
                                      : copy_string(partNumber, length, gpu->part_number);
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_PCI_INFO, device, gpu)
    if (pci == NULL) {
        UNLOCK();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memset(pci, 0, sizeof *pci);
    /* The topology parser limits the domain to 0xFFFF, so both forms fit their buffers. */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", gpu->pci_domain & 0xFFFFu,
             gpu->pci_bus & 0xFFu, gpu->pci_device & 0x1Fu);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", gpu->pci_domain & 0xFFFFu,
             gpu->pci_bus & 0xFFu, gpu->pci_device & 0x1Fu);
    pci->domain = gpu->pci_domain;
    pci->bus = gpu->pci_bus;
    pci->device = gpu->pci_device;
    pci->pciDeviceId = gpu->pci_device_id;
    pci->pciSubSystemId = gpu->pci_subsystem_id;
    UNLOCK();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_MEMORY_INFO, device, gpu)
    if (memory == NULL) {
        UNLOCK();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* v1: `used` counts reserved and allocated memory together. */
    memory->total = gpu->mem_total;
    memory->used = gpu->mem_reserved + gpu->mem_used;
    memory->free = gpu->mem_total - memory->used;
    UNLOCK();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_MEMORY_INFO, device, gpu)
    if (memory == NULL) {
        UNLOCK();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (memory->version != nvmlMemory_v2) {
        UNLOCK();
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = gpu->mem_total;
    memory->reserved = gpu->mem_reserved;
    memory->used = gpu->mem_used;
    memory->free = gpu->mem_total - gpu->mem_reserved - gpu->mem_used;
    UNLOCK();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_MINOR_NUMBER, device, gpu)
    if (minorNumber == NULL)
        rc_ = NVML_ERROR_INVALID_ARGUMENT;
    else
        *minorNumber = gpu->minor;
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned slot, n = 0;
    DEVICE_CALL(SI_CALL_DEVICE_GET_INDEX, device, gpu)
    if (index == NULL) {
        rc_ = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        /* The enumeration index: the position among the GPUs that are present. */
        for (slot = 0; slot < gpu->index; slot++)
            if (!gpu_missing(slot))
                n++;
        *index = n;
    }
    UNLOCK();
    return rc_;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEVICE_CALL(SI_CALL_DEVICE_GET_CUDA_COMPUTE_CAPABILITY, device, gpu)
    if (major == NULL || minor == NULL) {
        rc_ = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *major = gpu->cc_major;
        *minor = gpu->cc_minor;
    }
    UNLOCK();
    return rc_;
}

/* ------------------------------------------------------------------ fabric */

struct fabric_view {
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    uint32_t clique_id;
    unsigned char state;
    nvmlReturn_t status;
    uint32_t health_mask;
    unsigned char health_summary;
};

/* The topology's values with this GPU's faults laid over them. Lock held. */
static void fabric_view(const struct si_gpu *gpu, struct fabric_view *v)
{
    const struct si_gpu_fault *f = &g_faults.gpu[gpu->index];

    memcpy(v->cluster_uuid, gpu->cluster_uuid, sizeof v->cluster_uuid);
    v->clique_id = gpu->clique_id;
    v->state = gpu->fabric_state;
    v->status = gpu->fabric_status;
    v->health_mask = gpu->health_mask;
    v->health_summary = gpu->health_summary;
    if (f->set & SI_GF_CLUSTER_UUID)
        memcpy(v->cluster_uuid, f->cluster_uuid, sizeof v->cluster_uuid);
    if (f->set & SI_GF_CLIQUE_ID)
        v->clique_id = f->clique_id;
    if (f->set & SI_GF_FABRIC_STATE)
        v->state = f->fabric_state;
    if (f->set & SI_GF_FABRIC_STATUS)
        v->status = f->fabric_status;
    if (f->set & SI_GF_HEALTH_MASK)
        v->health_mask = f->health_mask;
    if (f->set & SI_GF_HEALTH_SUMMARY)
        v->health_summary = f->health_summary;
    /* The fabric manager hands out the cluster UUID and clique ID when the GPU's fabric
     * registration completes; before that they read as zero. */
    if (v->state != NVML_GPU_FABRIC_STATE_COMPLETED) {
        memset(v->cluster_uuid, 0, sizeof v->cluster_uuid);
        v->clique_id = 0;
    }
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    struct fabric_view v;
    DEVICE_CALL(SI_CALL_DEVICE_GET_GPU_FABRIC_INFO, device, gpu)
    if (gpuFabricInfo == NULL) {
        UNLOCK();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (!gpu->has_fabric) {
        UNLOCK();
        return NVML_ERROR_NOT_SUPPORTED;
    }
    fabric_view(gpu, &v);
    memset(gpuFabricInfo, 0, sizeof *gpuFabricInfo);
    memcpy(gpuFabricInfo->clusterUuid, v.cluster_uuid, sizeof v.cluster_uuid);
    gpuFabricInfo->status = v.status;
    gpuFabricInfo->cliqueId = v.clique_id;
    gpuFabricInfo->state = v.state;
    UNLOCK();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    struct fabric_view v;
    unsigned int version;
    DEVICE_CALL(SI_CALL_DEVICE_GET_GPU_FABRIC_INFO_V, device, gpu)
    if (gpuFabricInfo == NULL) {
        UNLOCK();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* Only the version word may be read before it says how large the buffer is. */
    memcpy(&version, gpuFabricInfo, sizeof version);
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3) {
        UNLOCK();
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if (!gpu->has_fabric) {
        UNLOCK();
        return NVML_ERROR_NOT_SUPPORTED;
    }
    fabric_view(gpu, &v);
    if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t out;
        memset(&out, 0, sizeof out);
        out.version = version;
        memcpy(out.clusterUuid, v.cluster_uuid, sizeof v.cluster_uuid);
        out.status = v.status;
        out.cliqueId = v.clique_id;
        out.state = v.state;
        out.healthMask = v.health_mask;
        memcpy(gpuFabricInfo, &out, sizeof out); /* 36 bytes: a v2 buffer is no larger */
    } else {
        nvmlGpuFabricInfo_v3_t out;
        memset(&out, 0, sizeof out);
        out.version = version;
        memcpy(out.clusterUuid, v.cluster_uuid, sizeof v.cluster_uuid);
        out.status = v.status;
        out.cliqueId = v.clique_id;
        out.state = v.state;
        out.healthMask = v.health_mask;
        out.healthSummary = v.health_summary;
        memcpy(gpuFabricInfo, &out, sizeof out);
    }
    UNLOCK();
    return NVML_SUCCESS;
}
