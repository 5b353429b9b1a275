"""NVML constants the stand-in library speaks, shared by the topology and fault writers.

The numbers are NVML's (`nvmlReturn_t`, `nvmlGpuFabricState_t`, the fabric health mask and
summary); the names are the ones the stand-in's files accept (NVML's names without the
`NVML_ERROR_` / `NVML_GPU_FABRIC_STATE_` / ... prefix).
"""

from __future__ import annotations

from enum import IntEnum

TOPOLOGY_FORMAT = "nvlfabric-nvml-topology/1"
FAULTS_FORMAT = "nvlfabric-nvml-faults/1"

#: Environment variables the library reads.
ENV_TOPOLOGY = "NVLFABRIC_NVML_TOPOLOGY"
ENV_NODE = "NVLFABRIC_NVML_NODE"
ENV_FAULTS = "NVLFABRIC_NVML_FAULTS"

#: The file name pynvml (and every other NVML consumer) dlopen()s.
LIBRARY_SONAME = "libnvidia-ml.so.1"


class NvmlReturn(IntEnum):
    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    VGPU_ECC_NOT_SUPPORTED = 22
    INSUFFICIENT_RESOURCES = 23
    FREQ_NOT_SUPPORTED = 24
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    RESET_TYPE_NOT_SUPPORTED = 30
    UNKNOWN = 999


class FabricState(IntEnum):
    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class HealthSummary(IntEnum):
    """`healthSummary` of `nvmlGpuFabricInfo_v3_t`."""

    NOT_SUPPORTED = 0
    HEALTHY = 1
    UNHEALTHY = 2
    LIMITED_CAPACITY = 3


class Tristate(IntEnum):
    """The two-bit TRUE/FALSE fields of the fabric health mask."""

    NOT_SUPPORTED = 0
    TRUE = 1
    FALSE = 2


class IncorrectConfiguration(IntEnum):
    NOT_SUPPORTED = 0
    NONE = 1
    INCORRECT_SYSGUID = 2
    INCORRECT_CHASSIS_SN = 3
    NO_PARTITION = 4
    INSUFFICIENT_NVLINKS = 5
    INCOMPATIBLE_GPU_FW = 6
    INVALID_LOCATION = 7
    GPU_STATE_INVALID = 8


class GfmState(IntEnum):
    NOT_SUPPORTED = 0
    CONNECTED = 1
    DISCONNECTED = 2


# (shift, width mask) of each health-mask field, as NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_/WIDTH_*.
HEALTH_DEGRADED_BW = (0, 0x3)
HEALTH_ROUTE_RECOVERY = (2, 0x3)
HEALTH_ROUTE_UNHEALTHY = (4, 0x3)
HEALTH_ACCESS_TIMEOUT_RECOVERY = (6, 0x3)
HEALTH_INCORRECT_CONFIGURATION = (8, 0xF)
HEALTH_PARTITION_ASSIGNED = (12, 0x3)
HEALTH_GFM_STATE = (14, 0x3)


def health_mask(
    *,
    degraded_bw: Tristate = Tristate.FALSE,
    route_recovery: Tristate = Tristate.FALSE,
    route_unhealthy: Tristate = Tristate.FALSE,
    access_timeout_recovery: Tristate = Tristate.FALSE,
    incorrect_configuration: IncorrectConfiguration = IncorrectConfiguration.NONE,
    partition_assigned: Tristate = Tristate.TRUE,
    gfm_state: GfmState = GfmState.NOT_SUPPORTED,
) -> int:
    """Packs a fabric health mask; the defaults give a fully healthy GPU (0x11AA)."""
    fields = (
        (HEALTH_DEGRADED_BW, degraded_bw),
        (HEALTH_ROUTE_RECOVERY, route_recovery),
        (HEALTH_ROUTE_UNHEALTHY, route_unhealthy),
        (HEALTH_ACCESS_TIMEOUT_RECOVERY, access_timeout_recovery),
        (HEALTH_INCORRECT_CONFIGURATION, incorrect_configuration),
        (HEALTH_PARTITION_ASSIGNED, partition_assigned),
        (HEALTH_GFM_STATE, gfm_state),
    )
    mask = 0
    for (shift, width), value in fields:
        mask |= (int(value) & width) << shift
    return mask


def health_field(mask: int, field: tuple[int, int]) -> int:
    """One field of a health mask, as NVML_GPU_FABRIC_HEALTH_GET does."""
    shift, width = field
    return (mask >> shift) & width


HEALTH_MASK_HEALTHY = health_mask()
assert HEALTH_MASK_HEALTHY == 0x11AA

#: Calls a fault file can make fail (`call.<name>`); the `_vN` variants share their base name.
CALL_NAMES: tuple[str, ...] = (
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
)

#: Every symbol the library exports (NVML's, plus one diagnostic extension).
EXPORTED_SYMBOLS: frozenset[str] = frozenset(
    {
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleByPciBusId",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetBoardPartNumber",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvlfabricNvmlGetLastError",
    }
)
