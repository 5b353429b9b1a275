/*
 * nvlfabric NVML stand-in: shared declarations.
 *
 * The NVML types below are written from the public facts of the NVML API (names, numeric
 * values, struct layouts and sizes); the layouts are pinned with static assertions so a
 * mistake fails the build instead of corrupting a caller's buffer.
 */
#ifndef NVLFABRIC_STANDIN_H
#define NVLFABRIC_STANDIN_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ NVML types */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

#define NVML_INIT_FLAG_NO_GPUS 1u
#define NVML_INIT_FLAG_NO_ATTACH 2u
#define NVML_INIT_FLAG_FORCE_INIT 4u

#define NVML_GPU_FABRIC_UUID_LEN 16

typedef unsigned char nvmlGpuFabricState_t;
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_STATE_NOT_STARTED 1
#define NVML_GPU_FABRIC_STATE_IN_PROGRESS 2
#define NVML_GPU_FABRIC_STATE_COMPLETED 3

#define NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY 1
#define NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY 2
#define NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY 3

/* A fully healthy health mask: every "problem" field FALSE, configuration NONE,
 * partition assigned TRUE. */
#define SI_HEALTH_MASK_HEALTHY 0x11AAu

typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

/* The header of every versioned fabric struct; the callee reads `version` first and only
 * then knows how many bytes the caller's buffer holds. */
typedef nvmlGpuFabricInfo_v3_t nvmlGpuFabricInfoV_t;

#define NVML_STRUCT_VERSION_WORD(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION_WORD(sizeof(nvmlGpuFabricInfo_v2_t), 2)
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION_WORD(sizeof(nvmlGpuFabricInfo_v3_t), 3)

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION_WORD(sizeof(nvmlMemory_v2_t), 2)

/* Layouts as the real header has them on LP64 (x86-64 and aarch64). */
_Static_assert(sizeof(nvmlReturn_t) == 4, "nvmlReturn_t is 4 bytes");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "v1 fabric info is 28 bytes");
_Static_assert(offsetof(nvmlGpuFabricInfo_t, status) == 16, "v1 status offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_t, cliqueId) == 20, "v1 cliqueId offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_t, state) == 24, "v1 state offset");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 36, "v2 fabric info is 36 bytes");
_Static_assert(offsetof(nvmlGpuFabricInfo_v2_t, clusterUuid) == 4, "v2 clusterUuid offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_v2_t, status) == 20, "v2 status offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_v2_t, cliqueId) == 24, "v2 cliqueId offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_v2_t, state) == 28, "v2 state offset");
_Static_assert(offsetof(nvmlGpuFabricInfo_v2_t, healthMask) == 32, "v2 healthMask offset");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 40, "v3 fabric info is 40 bytes");
_Static_assert(offsetof(nvmlGpuFabricInfo_v3_t, healthSummary) == 36, "v3 healthSummary offset");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024u, "v2 version word");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028u, "v3 version word");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t is 68 bytes");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t busId offset");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t is 24 bytes");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t is 40 bytes");
_Static_assert(nvmlMemory_v2 == 0x02000028u, "memory v2 version word");

/* ------------------------------------------------------------------ exported API */

#define SI_API __attribute__((visibility("default")))

typedef struct nvmlDevice_st *nvmlDevice_t;

SI_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
SI_API nvmlReturn_t nvmlInit_v2(void);
SI_API nvmlReturn_t nvmlInit(void);
SI_API nvmlReturn_t nvmlShutdown(void);
SI_API const char *nvmlErrorString(nvmlReturn_t result);
SI_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
SI_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length);
SI_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
SI_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
SI_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
SI_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount);
SI_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
SI_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
SI_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
SI_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
SI_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device);
SI_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
SI_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
SI_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length);
SI_API nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                 unsigned int length);
SI_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
SI_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
SI_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
SI_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber);
SI_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
SI_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
SI_API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo);
SI_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                nvmlGpuFabricInfoV_t *gpuFabricInfo);

/* Not part of NVML: the last configuration problem (topology or fault file), "" if none.
 * Returns the message length; copies at most length - 1 bytes and a NUL into buf. */
SI_API unsigned int nvlfabricNvmlGetLastError(char *buf, unsigned int length);

/* ------------------------------------------------------------------ model */

#define SI_MAX_GPUS 16           /* per node */
#define SI_NAME_MAX 64           /* rack and node names, including the NUL */
#define SI_UUID_STR_SIZE 41      /* "GPU-" + 36 + NUL */
#define SI_GPU_NAME_SIZE 96      /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define SI_SERIAL_SIZE 30        /* NVML_DEVICE_SERIAL_BUFFER_SIZE */
#define SI_PART_NUMBER_SIZE 80   /* NVML_DEVICE_PART_NUMBER_BUFFER_SIZE */
#define SI_VERSION_SIZE 80       /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define SI_ERR_SIZE 512

struct si_gpu {
    unsigned index;
    char uuid[SI_UUID_STR_SIZE];
    char name[SI_GPU_NAME_SIZE];
    char serial[SI_SERIAL_SIZE];
    char part_number[SI_PART_NUMBER_SIZE];
    unsigned pci_domain, pci_bus, pci_device;
    uint32_t pci_device_id, pci_subsystem_id;
    unsigned minor;
    unsigned long long mem_total, mem_reserved, mem_used; /* bytes */
    int cc_major, cc_minor;
    int has_fabric; /* 0: the node is in no NVLink domain -> fabric calls NOT_SUPPORTED */
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    uint32_t clique_id;
    unsigned char fabric_state;
    nvmlReturn_t fabric_status;
    uint32_t health_mask;
    unsigned char health_summary;
};

struct si_topology {
    char driver_version[SI_VERSION_SIZE];
    char nvml_version[SI_VERSION_SIZE];
    int cuda_driver_version;
    char node[SI_NAME_MAX];
    char rack[SI_NAME_MAX]; /* "" when the node is in no rack */
    unsigned gpu_count;
    struct si_gpu gpus[SI_MAX_GPUS];
};

/* Calls that a fault file can make fail, by base name (the `_vN` suffix dropped). */
enum si_call {
    SI_CALL_SHUTDOWN,
    SI_CALL_SYSTEM_GET_DRIVER_VERSION,
    SI_CALL_SYSTEM_GET_NVML_VERSION,
    SI_CALL_SYSTEM_GET_CUDA_DRIVER_VERSION,
    SI_CALL_DEVICE_GET_COUNT,
    SI_CALL_DEVICE_GET_HANDLE_BY_INDEX,
    SI_CALL_DEVICE_GET_HANDLE_BY_UUID,
    SI_CALL_DEVICE_GET_HANDLE_BY_PCI_BUS_ID,
    SI_CALL_DEVICE_GET_NAME,
    SI_CALL_DEVICE_GET_UUID,
    SI_CALL_DEVICE_GET_SERIAL,
    SI_CALL_DEVICE_GET_BOARD_PART_NUMBER,
    SI_CALL_DEVICE_GET_PCI_INFO,
    SI_CALL_DEVICE_GET_MEMORY_INFO,
    SI_CALL_DEVICE_GET_MINOR_NUMBER,
    SI_CALL_DEVICE_GET_INDEX,
    SI_CALL_DEVICE_GET_CUDA_COMPUTE_CAPABILITY,
    SI_CALL_DEVICE_GET_GPU_FABRIC_INFO,
    SI_CALL_DEVICE_GET_GPU_FABRIC_INFO_V,
    SI_CALL_COUNT
};

extern const char *const si_call_names[SI_CALL_COUNT];

/* Which fields of a GPU fault are set. */
enum {
    SI_GF_MISSING = 1u << 0,
    SI_GF_ERROR = 1u << 1,
    SI_GF_FABRIC_STATE = 1u << 2,
    SI_GF_FABRIC_STATUS = 1u << 3,
    SI_GF_HEALTH_MASK = 1u << 4,
    SI_GF_HEALTH_SUMMARY = 1u << 5,
    SI_GF_CLIQUE_ID = 1u << 6,
    SI_GF_CLUSTER_UUID = 1u << 7
};

struct si_gpu_fault {
    unsigned set; /* SI_GF_* */
    int missing;
    nvmlReturn_t error;
    unsigned char fabric_state;
    nvmlReturn_t fabric_status;
    uint32_t health_mask;
    unsigned char health_summary;
    uint32_t clique_id;
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
};

struct si_faults {
    nvmlReturn_t init_error;            /* NVML_SUCCESS: none */
    nvmlReturn_t all_calls_error;       /* NVML_SUCCESS: none */
    nvmlReturn_t call_error[SI_CALL_COUNT];
    struct si_gpu_fault gpu[SI_MAX_GPUS];
};

/* Parsers (standin_config.c). Both return 0 on success; on failure they return -1 and
 * write a one-line message naming the file, the line and the field into err. */
int si_load_topology(const char *path, const char *node, struct si_topology *out, char *err,
                     size_t errlen);
int si_load_faults(const char *path, unsigned gpu_count, struct si_faults *out, char *err,
                   size_t errlen);

/* Reads a whole regular file (at most max_size bytes) into a NUL-terminated heap buffer. */
int si_read_file(const char *path, size_t max_size, char **out, size_t *out_len, char *err,
                 size_t errlen);

/* Value parsers shared with the API code. */
int si_parse_return_code(const char *s, nvmlReturn_t *out);
const char *si_return_name(nvmlReturn_t r);

#endif
